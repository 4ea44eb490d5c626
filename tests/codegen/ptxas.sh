#!/bin/sh
# ptxas.sh DDPC SAMPLE...: every GPU kernel of every sample passes `ptxas -arch=sm_90`.
# Without ptxas (no CUDA toolkit) the test is skipped, and says so (exit 77).
set -u
ddpc=$1
shift
ptxas=$(command -v ptxas || true)
[ -n "$ptxas" ] || [ ! -x /usr/local/cuda/bin/ptxas ] || ptxas=/usr/local/cuda/bin/ptxas
if [ -z "$ptxas" ]; then
    echo "SKIPPED: ptxas was not found (install the CUDA toolkit to check the PTX)"
    exit 77
fi
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-ptx.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
for sample in "$@"; do
    name=$(basename "$sample" .ddp)
    if ! "$ddpc" emit --stage=ptx "$sample" >"$work/$name.ptx"; then
        echo "FAIL $name: ddpc could not emit PTX"
        failures=$((failures + 1))
        continue
    fi
    kernels=$(grep -c '^\.visible \.entry' "$work/$name.ptx")
    if "$ptxas" -arch=sm_90 "$work/$name.ptx" -o "$work/$name.cubin"; then
        echo "ok   $name: $kernels kernels pass ptxas -arch=sm_90"
    else
        echo "FAIL $name: ptxas rejects its PTX"
        failures=$((failures + 1))
    fi
done
[ "$failures" -eq 0 ]
