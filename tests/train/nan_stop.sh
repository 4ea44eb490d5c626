#!/bin/sh
# nan_stop.sh PROGRAM: a learning rate that overflows the weights stops the run with
# status 1 and a message naming the step and the tensor; --save then holds the last
# parameters from before the bad step. On the CPU, where the host reads the step's
# flag at once, and on the emulated device, where it reads it one step late while
# the optimizer has skipped every update since: the same step, message and file.
set -u
program=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failed=0
for device in cpu emulated; do
    "$program" --device $device --lr 1e30 --steps-per-epoch 20 --save "$dir/$device.safetensors" \
        > "$dir/out" 2> "$dir/$device.err"
    status=$?
    cat "$dir/$device.err"
    [ $status -eq 1 ] || { echo "FAIL ($device): status $status, wanted 1"; failed=1; continue; }
    grep -q "step [0-9]* (epoch 1, step [0-9]* of 20): the \(loss is\|gradient of \`mlp\.\)" "$dir/$device.err" &&
        grep -q "training stopped before this step's update" "$dir/$device.err" &&
        grep -q "The parameters from before it are in $dir/$device.safetensors" "$dir/$device.err" ||
        { echo "FAIL ($device): the message does not name the step and the tensor"; failed=1; }
    [ -s "$dir/$device.safetensors" ] || { echo "FAIL ($device): no parameters saved"; failed=1; }
done
[ $failed -eq 0 ] || exit 1
sed "s|$dir/[a-z]*\.safetensors|FILE|" "$dir/cpu.err" > "$dir/cpu.said"
sed "s|$dir/[a-z]*\.safetensors|FILE|" "$dir/emulated.err" > "$dir/emulated.said"
cmp -s "$dir/cpu.said" "$dir/emulated.said" ||
    { echo "FAIL: the emulated device's message differs from the CPU's"; exit 1; }
python3 - "$(dirname "$0")" "$dir/cpu.safetensors" "$dir/emulated.safetensors" <<'PY' || exit 1
import math, sys
sys.path.insert(0, sys.argv[1])
from datafiles import read_safetensors
cpu, emulated = read_safetensors(sys.argv[2])[0], read_safetensors(sys.argv[3])[0]
diff = sum((x - y) ** 2 for name in cpu for x, y in zip(cpu[name], emulated[name]))
norm = sum(x * x for name in cpu for x in cpu[name])
finite = all(math.isfinite(x) for name in emulated for x in emulated[name])
print("saved parameters: emulated against CPU %.2e of the norm, %s" % (
    math.sqrt(diff / norm), "all finite" if finite else "NOT FINITE"))
sys.exit(0 if finite and diff <= 1e-10 * norm else 1)
PY
echo "ok"
