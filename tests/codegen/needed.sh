#!/bin/sh
# needed.sh DDPC SAMPLE: a built executable needs no CUDA, cuBLAS, NCCL or LLVM library
# to start (readelf -d lists no such NEEDED entry); it still starts and prints its help.
set -eu
ddpc=$1 sample=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-needed.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$ddpc" build "$sample" -o "$work/program"
readelf -d "$work/program" | grep NEEDED
if readelf -d "$work/program" | grep NEEDED | grep -i -E 'cuda|cublas|cudnn|nccl|llvm'; then
    echo "FAIL: the executable needs a GPU or LLVM library"
    exit 1
fi
"$work/program" --help >/dev/null
echo "needed: no CUDA, cuBLAS, cuDNN, NCCL or LLVM library among the NEEDED entries"
