#!/bin/sh
# against_pytorch.sh PROGRAM BUILD_DIR: the MLP trained by ddp and by PyTorch from the
# same initial weights on the same batches agree (tests/train/against_pytorch.py).
# Skipped (77) where no Python with torch and numpy is found: DDP_TORCH_PYTHON, the
# venv that bench/train_throughput.sh installs in BUILD_DIR, then python3.
set -u
program=$1 build=$2
for python in "${DDP_TORCH_PYTHON:-}" "$build/torch-venv/bin/python3" python3; do
    [ -n "$python" ] && "$python" -c "import torch, numpy" 2>/dev/null && break
    python=""
done
[ -n "$python" ] || { echo "no Python with torch and numpy: skipped (bench/train_throughput.sh installs one)"; exit 77; }
exec "$python" "$(dirname "$0")/against_pytorch.py" "$program"
