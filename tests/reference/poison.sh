#!/bin/sh
# poison.sh PLANNED NO_REUSE: trains the planned build with its memory poisoned (NaN
# outside each value's life) and the --no-reuse build plainly; the parameters,
# statistics, optimizer state, accumulators and the last evaluation's outputs (which
# --predict reads after the phase) must be bit-identical. The same on the
# emulated GPU, whose executor poisons device memory as the CPU's does its own.
set -eu
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-poison.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$1" "$work/planned" --poison --partial
"$2" "$work/apart" --partial
cmp "$work/planned" "$work/apart"
echo "poison: planned memory with poisoning and every value apart agree bit for bit"
"$1" "$work/planned_gpu" --poison --partial --emulated
"$2" "$work/apart_gpu" --partial --emulated
cmp "$work/planned_gpu" "$work/apart_gpu"
echo "poison: the same on the emulated GPU"
