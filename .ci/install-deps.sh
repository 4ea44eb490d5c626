#!/bin/sh
# install-deps.sh [--tests]: installs, on Debian 12, the packages ddp needs to build
# and train that are missing, and with --tests what the tests need besides (a real
# Slurm with munge, iproute2 for its two-node cluster in network namespaces,
# valgrind, cjpeg to write JPEG images, and from PyPI the readers a user would open a run's files with:
# safetensors and TensorBoard).
# Nothing is done when all are present (so it also works offline); sudo is used only
# when not already root.
set -eu
# dataset-fashion-mnist: the real data the samples and the training tests use;
# python3: the tests that write data files and compute figures by hand
packages="build-essential cmake ninja-build re2c lemon clang lld libclang-rt-14-dev llvm-14-dev libopenblas-dev
zlib1g-dev libjpeg62-turbo-dev libpng-dev dataset-fashion-mnist python3"
[ "${1:-}" = --tests ] && packages="$packages slurm-wlm munge iproute2 valgrind python3-pip libjpeg-turbo-progs"
missing=""
for p in $packages; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
        missing="$missing $p"
done
if [ "$(id -u)" -eq 0 ]; then sudo=""; else sudo="sudo"; fi
if [ -n "$missing" ]; then
    echo "installing:$missing"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -q
    # shellcheck disable=SC2086
    $sudo apt-get install -y -q --no-install-recommends $missing
fi
# the Python packages, for whichever python3 runs the tests (Debian's marks itself
# externally managed: these go beside it, for this user)
if [ "${1:-}" = --tests ] && ! python3 -c "import safetensors.numpy, tensorboard" 2>/dev/null; then
    echo "installing from PyPI: safetensors numpy tensorboard"
    python3 -m pip install --quiet --user --break-system-packages safetensors numpy tensorboard 2>/dev/null ||
        python3 -m pip install --quiet --break-system-packages safetensors numpy tensorboard
fi
