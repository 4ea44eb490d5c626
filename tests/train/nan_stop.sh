#!/bin/sh
# nan_stop.sh PROGRAM: a learning rate that overflows the weights stops the run with
# status 1 and a message naming the step and the tensor; --save then holds the last
# parameters from before the bad step.
set -u
program=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
"$program" --lr 1e30 --steps-per-epoch 20 --save "$dir/p.safetensors" > "$dir/out" 2> "$dir/err"
status=$?
cat "$dir/err"
[ $status -eq 1 ] || { echo "FAIL: status $status, wanted 1"; exit 1; }
grep -q "step [0-9]* (epoch 1, step [0-9]* of 20): the \(loss is\|gradient of \`mlp\.\)" "$dir/err" &&
    grep -q "training stopped before this step's update" "$dir/err" &&
    grep -q "The parameters from before it are in $dir/p.safetensors" "$dir/err" ||
    { echo "FAIL: the message does not name the step and the tensor"; exit 1; }
[ -s "$dir/p.safetensors" ] || { echo "FAIL: no parameters saved"; exit 1; }
echo "ok"
