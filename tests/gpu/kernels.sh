#!/bin/sh
# kernels.sh DEVICE [--small-grids] PROGRAM...: each gpu_check_* program
# (kernel_check.c) on DEVICE (gpu or emulated), with the fewest blocks each index launch
# allows if asked; fails when one fails, skips (77) when every one skipped.
set -u
device=$1
shift
grids=
[ "${1:-}" = --small-grids ] && { grids=$1; shift; }
failures=0 skipped=0
for program in "$@"; do
    "$program" "$device" $grids
    case $? in
    0) ;;
    77) skipped=$((skipped + 1)) ;;
    *) failures=$((failures + 1)) ;;
    esac
done
[ "$failures" -gt 0 ] && exit 1
[ "$skipped" -eq $# ] && exit 77
exit 0
