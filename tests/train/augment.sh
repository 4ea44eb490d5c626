#!/bin/sh
# augment.sh DDPC PROGRAM: a training dataset's augmentations reach the steps. PROGRAM
# (tests/cluster/equivalence.ddp: Fashion-MNIST resized from random windows, cropped,
# flipped, cut out and mixed)
# against the same program built here without its `augment`, 3 steps each: the
# banner names the augmentations; two augmented runs give the same loss at every step
# (the draws repeat); the augmented run's loss differs from the plain one's from the
# first step on, before any update (its first batch holds other values); a loader of
# 3 threads, each assembling a part of every batch, saves the same parameters as one
# thread. Then a run
# stopped by SIGUSR1 in mid-epoch and resumed saves the very parameters of the run
# never stopped (the draws follow the epoch, not the resume), and the plain program
# refuses that checkpoint, naming the augmentations.
set -u
ddpc=$1 program=$2
source=$(dirname "$0")/../cluster/equivalence.ddp
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
grep -q "^    augment = " "$source" || fail "$source has no augment line to remove"
sed -e '/^    augment = /,/])$/d' -e 's/scale   = 1 \/ 255,/scale   = 1 \/ 255)/' "$source" > "$dir/plain.ddp"
"$ddpc" build "$dir/plain.ddp" -o "$dir/plain_program" > "$dir/out" 2>&1 || { cat "$dir/out"; fail "building the plain twin"; }
run() { # run NAME PROGRAM ARGS...: its losses, one a line
    name=$1 prog=$2
    shift 2
    "$prog" --epochs 3 --threads 1 --run-dir "$dir/$name" --metrics "$dir/$name.json" "$@" > "$dir/$name.out" 2>&1 ||
        { cat "$dir/$name.out"; fail "$name"; }
    sed -n 's/.*"loss": \([^,]*\),.*/\1/p' "$dir/$name.json" > "$dir/$name.losses"
    [ "$(wc -l < "$dir/$name.losses")" -eq 3 ] || fail "$name: not 3 losses in its metrics"
}
run augmented "$program" --save "$dir/augmented.safetensors"
run again "$program"
run loaders "$program" --loader-threads 3 --save "$dir/loaders.safetensors"
run plain "$dir/plain_program"
grep -q "augmented: random_resized_crop(size = \[28, 28\], scale = \[0.5, 1\], ratio = \[0.75, 1.33333\]), random_crop(padding = 3), random_flip(horizontal), random_cutout(size = 8), random_mixup(alpha = 0.4), random_cutmix(alpha = 1)" "$dir/augmented.out" ||
    fail "the banner does not name the augmentations: $(grep '  data ' "$dir/augmented.out")"
echo "ok: the banner names the augmentations"
cmp -s "$dir/augmented.losses" "$dir/again.losses" || fail "two augmented runs differ"
echo "ok: two augmented runs give the same losses: $(tr '\n' ' ' < "$dir/augmented.losses")"
first() { head -n 1 "$dir/$1.losses"; }
[ "$(first augmented)" != "$(first plain)" ] || fail "the first batch's loss is the same augmented or not"
paste "$dir/augmented.losses" "$dir/plain.losses" | awk -F'\t' '$1 == $2 { exit 1 }' ||
    fail "a step's loss is the same augmented or not"
echo "ok: every step's loss differs from the plain program's: $(tr '\n' ' ' < "$dir/plain.losses")"
grep -q "^  loader      3 threads assemble each batch" "$dir/loaders.out" || fail "no loader line: $(cat "$dir/loaders.out")"
cmp -s "$dir/augmented.safetensors" "$dir/loaders.safetensors" ||
    fail "a loader of 3 threads saves other parameters than one of 1"
echo "ok: a loader of 3 threads saves the parameters of one thread's run"

# stopped after step 4 of 2 epochs of 3 steps, and resumed
long() { # long NAME PROGRAM [ARGS...]: status kept in $status, output in NAME.out
    name=$1 prog=$2
    shift 2
    "$prog" --epochs 2 --steps-per-epoch 3 --threads 1 --run-dir "$dir/$name" "$@" > "$dir/$name.out" 2>&1
    status=$?
}
long whole "$program" --save "$dir/whole.safetensors"
[ "$status" -eq 0 ] || { cat "$dir/whole.out"; fail "the run never stopped"; }
DDP_TEST_SIGNAL=USR1@4 long stopped "$program"
[ "$status" -eq 4 ] || { cat "$dir/stopped.out"; fail "SIGUSR1 after step 4: status $status, not 4"; }
long stopped "$program" --resume --save "$dir/stopped.safetensors"
[ "$status" -eq 0 ] || { cat "$dir/stopped.out"; fail "resuming"; }
cmp -s "$dir/whole.safetensors" "$dir/stopped.safetensors" || fail "stopped after step 4 and resumed, the parameters differ"
echo "ok: stopped after step 4 and resumed, the same parameters as the run never stopped"
DDP_TEST_SIGNAL=USR1@4 long other "$program"
long other "$dir/plain_program" --resume
[ "$status" -eq 1 ] && grep -q "augment" "$dir/other.out" ||
    { cat "$dir/other.out"; fail "the plain program resumes an augmented run's checkpoint (status $status)"; }
echo "ok: the plain program refuses the checkpoint: $(grep -o 'program.train.naugment[^;]*' "$dir/other.out")"
