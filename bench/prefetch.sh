#!/bin/sh
# prefetch.sh [BUILD_DIR [SAMPLES [SIDE]]]: how fast the loader reads a mapped .npy
# dataset whose pages are not in the page cache, asking for the samples of the batches
# ahead or faulting them in as batches touch them (bench/prefetch.c, its reference
# measured in this run). SAMPLES (4000) random images [SIDE, SIDE, 3] (256: ImageNet's
# as ddppack packs them for random crops, 192 KiB each, 750 MiB) are written to a folder
# under TMPDIR, which must be a disk's file system (a tmpfs keeps its pages, and the
# benchmark measures nothing there). On a parallel file system, whose reads take longer
# than a local disk's, asking ahead gains more than here.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:-$root/build}")
samples=${2:-4000} side=${3:-256}
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
[ "$(stat -f -c %T "$work")" != tmpfs ] || { echo "prefetch.sh: $work is a tmpfs: set TMPDIR to a disk" >&2; exit 1; }
cmake --build "$build" --target bench_prefetch >/dev/null

python3 "$root/bench/random_images.py" "$work" "$samples" "$side"
"$build/bench_prefetch" "$work/x.npy" "$work/y.npy" --batch 128 --passes "${BENCH_PASSES:-3}"
