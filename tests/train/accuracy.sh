#!/bin/sh
# accuracy.sh PROGRAM EPOCHS MINIMUM [ARGS...]: trains PROGRAM (given ARGS) for EPOCHS
# epochs on its real data and checks that the final validation accuracy is at least
# MINIMUM.
set -u
program=$1 epochs=$2 minimum=$3
shift 3
metrics=$(mktemp)
trap 'rm -f "$metrics"' EXIT
"$program" "$@" --epochs "$epochs" --metrics "$metrics" || { echo "FAIL: $program exited $?"; exit 1; }
accuracy=$(tail -n 1 "$metrics" | sed -n 's/.*"val_accuracy": \([^,}]*\).*/\1/p')
echo "validation accuracy after $epochs epochs: $accuracy (at least $minimum wanted)"
awk -v a="$accuracy" -v m="$minimum" 'BEGIN { exit !(a != "" && a + 0 >= m + 0) }' || { echo FAIL; exit 1; }
