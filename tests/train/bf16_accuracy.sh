#!/bin/sh
# bf16_accuracy.sh F32_PROGRAM BF16_PROGRAM: the same model trained one epoch on its
# real data on the emulated device, in f32 and with precision = bf16; the bf16 run's
# validation accuracy must lie within one point of the f32 run's, and its loss must
# differ (else bf16 changed nothing and the comparison proves nothing).
set -u
f32=$1 bf16=$2
folder=$(mktemp -d)
trap 'rm -rf "$folder"' EXIT
for run in f32 bf16; do
    eval program=\$$run
    "$program" --device emulated --epochs 1 --metrics "$folder/$run.json" > "$folder/$run.out" 2>&1 ||
        { echo "FAIL: $program exited $?"; cat "$folder/$run.out"; exit 1; }
    tail -n 1 "$folder/$run.out"
done
figure() { tail -n 1 "$folder/$1.json" | sed -n "s/.*\"$2\": \([^,}]*\).*/\1/p"; }
a32=$(figure f32 val_accuracy) a16=$(figure bf16 val_accuracy)
l32=$(figure f32 loss) l16=$(figure bf16 loss)
echo "val_accuracy: f32 $a32, bf16 $a16 (within 0.01 wanted); loss: f32 $l32, bf16 $l16"
awk -v a="$a32" -v b="$a16" 'BEGIN { d = a - b; exit !(a != "" && b != "" && d <= 0.01 && d >= -0.01) }' ||
    { echo "FAIL: bf16's validation accuracy is more than one point from f32's"; exit 1; }
[ "$l32" != "$l16" ] || { echo "FAIL: bf16 gives the very loss of f32"; exit 1; }
grep -q "bf16 activations and products" "$folder/bf16.out" ||
    { echo "FAIL: the bf16 run's banner does not say bf16"; exit 1; }
echo "ok   bf16 within one point of f32 after one epoch"
