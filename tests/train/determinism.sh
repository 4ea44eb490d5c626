#!/bin/sh
# determinism.sh PROGRAM CNN: the same seed gives bit-identical parameters, whatever the
# number of threads (3 split the kernels' ranges inside rows of channels), another
# seed does not, and --evaluate on saved parameters repeats the run's final validation
# figures exactly. CNN (samples/fashion.ddp at batch 16) trains on the CPU's own
# convolution, whose tiles and blocks 2 and 3 threads share out differently (3 split
# its images' rows inside a tile of the data gradient): the same bits on 1, 2 and 3.
set -u
program=$1 cnn=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
run() { "$program" --steps-per-epoch 40 --epochs 1 "$@" > "$dir/out" 2>&1 || { cat "$dir/out"; fail "$program $*"; }; }
run --save "$dir/a.safetensors" --metrics "$dir/a.json"
run --save "$dir/b.safetensors"
run --save "$dir/one.safetensors" --threads 1
run --save "$dir/three.safetensors" --threads 3
run --save "$dir/c.safetensors" --seed 7
cmp -s "$dir/a.safetensors" "$dir/b.safetensors" || fail "two runs with the same seed differ"
echo "ok: two runs with the same seed save identical parameters"
for n in one three; do
    cmp -s "$dir/a.safetensors" "$dir/$n.safetensors" || fail "a run on $n thread(s) differs from one on the default"
done
echo "ok: runs on 1 and 3 threads save the same parameters as on the default"
for n in 1 2 3; do
    "$cnn" --synthetic --steps-per-epoch 4 --epochs 1 --threads $n --save "$dir/cnn$n.safetensors" \
        --run-dir "$dir/cnn$n" > "$dir/out" 2>&1 || { cat "$dir/out"; fail "$cnn on $n thread(s)"; }
done
grep -q "convolution the CPU's: tiles of columns and products" "$dir/cnn1/log.txt" ||
    fail "the CNN does not run the CPU's own convolution"
for n in 2 3; do
    cmp -s "$dir/cnn1.safetensors" "$dir/cnn$n.safetensors" || fail "the CNN on $n threads differs from one thread"
done
echo "ok: the CNN's convolutions save the same parameters on 1, 2 and 3 threads"
cmp -s "$dir/a.safetensors" "$dir/c.safetensors" && fail "runs with seeds 1 and 7 save identical parameters"
echo "ok: another seed saves other parameters"
"$program" --load "$dir/a.safetensors" --evaluate --metrics "$dir/e.json" > "$dir/out" 2>&1 ||
    { cat "$dir/out"; fail "--evaluate"; }
figures() { sed -n 's/.*\("val_loss": [^,]*, "val_accuracy": [^,]*\).*/\1/p' "$1"; }
trained=$(figures "$dir/a.json") evaluated=$(figures "$dir/e.json")
echo "after training: $trained"
echo "evaluated:      $evaluated"
[ -n "$trained" ] && [ "$trained" = "$evaluated" ] || fail "--evaluate does not repeat the final validation"
echo "ok: --load and --evaluate repeat the final validation figures"
