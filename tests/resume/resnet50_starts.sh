#!/bin/sh
# resnet50_starts.sh PROGRAM: the ResNet-50 sample as shipped (cluster = slurm,
# checkpoint(...) every 5 epochs) starts under srun and trains a step on synthetic data,
# its run folder and checkpoint folder made.
set -u
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
cd "$dir" || exit 1
srun -n 1 -t 10 "$1" --synthetic --steps-per-epoch 1 --epochs 1 --threads 2 > out 2>&1
status=$?
if [ $status -eq 0 ] && grep -q "^done: 1 epoch, 1 step" out && grep -q "run folder  runs/net-[0-9]*: checkpoints every 5 epochs" out &&
    [ -d "$(sed -n 's/.*checkpoints every 5 epochs in \([^,]*\), the newest.*/\1/p' out)" ]; then
    echo "ok: the ResNet-50 sample starts under srun and trains: $(grep '^done:' out)"
else
    echo "FAIL: the ResNet-50 sample under srun: status $status"
    cat out
    exit 1
fi
