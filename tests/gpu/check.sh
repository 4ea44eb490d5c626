#!/bin/sh
# check.sh [BUILD_DIR]: for a machine with a GPU: every generated kernel of the samples
# (at small batches) and of the test models, run on the GPU through the CUDA driver
# and compared with the CPU (tests/gpu/kernel_check.c states the tolerances).
# The gpu_check_* programs are built with the tree (cmake --build); they need no BLAS
# and no CUDA library to link, only the driver to run. Without a GPU this says so and
# exits 77 (skipped).
set -u
build=${1:-$(cd "$(dirname "$0")/../.." && pwd)/build}
checks=$(ls "$build"/tests/gpu_check_* 2>/dev/null)
if [ -z "$checks" ]; then
    echo "check.sh: no gpu_check_* programs in $build/tests; build the tree first" >&2
    exit 2
fi
failures=0 skipped=0
for program in $checks; do
    "$program"
    case $? in
    0) ;;
    77) skipped=$((skipped + 1)) ;;
    *) failures=$((failures + 1)) ;;
    esac
done
if [ "$skipped" -gt 0 ] && [ "$failures" -eq 0 ]; then
    echo "tests/gpu/check.sh: SKIPPED: no GPU on this machine"
    exit 77
fi
[ "$failures" -eq 0 ] && echo "tests/gpu/check.sh: every kernel agrees with the CPU" || echo "tests/gpu/check.sh: FAIL"
[ "$failures" -eq 0 ]
