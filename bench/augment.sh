#!/bin/sh
# augment.sh [BUILD_DIR [SAMPLES [SIDE]]]: how fast training batches of images [SIDE,
# SIDE, 3] (CIFAR-sized: 32) are assembled, as they are, normalised, cropped and flipped,
# all three, resized from a random window to 7/8 of SIDE, flipped and normalised, and
# normalised, cropped, flipped and mixed (mixup or CutMix):
# ddp's loader (bench/augment.c, one thread) beside torchvision's transforms on the same
# uint8 images in one thread (v2.RandomCrop(SIDE, padding = 4), v2.RandomResizedCrop(
# SIDE * 7 / 8, antialias = True), v2.RandomHorizontalFlip, v2.ToDtype(float32, scale =
# True), v2.Normalize, each sample as a DataLoader worker transforms it; then the
# batch mixed by v2.RandomChoice([v2.MixUp(alpha = 0.2), v2.CutMix(alpha = 1)]),
# where ddp mixes each sample with another made for it; and normalised, cropped,
# flipped and coloured, v2.ColorJitter(0.4, 0.4, 0.4, 0.1) before Normalize, or
# trivially augmented, v2.TrivialAugmentWide(interpolation = BILINEAR) on the uint8
# image), measured in this run. Ratios above 1 mean ddp
# is faster. Then the loader's threads: its passes on 1 .. the CPUs here, and the
# ratio to one thread (`--loader-threads`; SIDE = 224 shows ImageNet-sized images).
#
# torchvision is looked for beside the PyTorch of bench/train_throughput.sh (its venv in
# BUILD_DIR), then in python3; without it (or with DDP_BENCH_NO_TORCH=1), ddp's figures
# alone. BENCH_SECONDS (1) is the time each variant is measured.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:-$root/build}")
samples=${2:-20000} side=${3:-32}
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
cmake --build "$build" --target bench_augment >/dev/null

# random uint8 images [SAMPLES, SIDE, SIDE, 3] and labels, as np.save writes them
python3 "$root/bench/random_images.py" "$work" "$samples" "$side"

"$build/bench_augment" "$work/x.npy" "$work/y.npy" --batch 128 --seconds "${BENCH_SECONDS:-1}" \
    --threads "$(nproc)" > "$work/ddp.out" ||
    { cat "$work/ddp.out"; echo "augment.sh: bench_augment failed" >&2; exit 1; }
cat "$work/ddp.out"

python=""
[ -n "${DDP_BENCH_NO_TORCH:-}" ] && { echo "DDP_BENCH_NO_TORCH: ddp's figures alone"; exit 0; }
for p in "$build/torch-venv/bin/python3" python3; do
    "$p" -c "import torch, torchvision.transforms.v2" 2>/dev/null && { python=$p; break; }
done
[ -n "$python" ] || { echo "no torchvision here: ddp's figures alone"; exit 0; }
"$python" - "$work" "${BENCH_SECONDS:-1}" "$side" <<'EOF' > "$work/torch.out"
import os, sys, time, warnings
warnings.filterwarnings("ignore")
import numpy as np, torch
from torchvision.transforms import v2
torch.set_num_threads(1)
work, seconds, side = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
images = torch.from_numpy(np.load(os.path.join(work, "x.npy"))).permute(0, 3, 1, 2)  # [N, 3, side, side]
to_float = v2.ToDtype(torch.float32, scale=True)
normalize = v2.Normalize([0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616])
crop_flip = [v2.RandomCrop(side, padding=4), v2.RandomHorizontalFlip()]
resized_flip = [v2.RandomResizedCrop(side * 7 // 8, antialias=True), v2.RandomHorizontalFlip()]
jitter = v2.ColorJitter(0.4, 0.4, 0.4, 0.1)
variants = [[to_float], [to_float, normalize], crop_flip + [to_float], crop_flip + [to_float, normalize],
            resized_flip + [to_float, normalize], crop_flip + [to_float, normalize],
            crop_flip + [to_float, jitter, normalize],
            crop_flip + [v2.TrivialAugmentWide(interpolation=v2.InterpolationMode.BILINEAR), to_float, normalize]]
mix = v2.RandomChoice([v2.MixUp(alpha=0.2, num_classes=10), v2.CutMix(alpha=1.0, num_classes=10)])
for v, steps in enumerate(variants):
    t = v2.Compose(steps)
    times = []
    start = time.perf_counter()
    while len(times) < 6 or time.perf_counter() - start < seconds:
        rows = torch.randint(0, images.shape[0], (128,))
        begin = time.perf_counter()
        batch = torch.stack([t(images[i]) for i in rows])
        if v == 5:  # the batch's samples and labels mixed, as a training loop does after the DataLoader
            batch, labels = mix(batch, rows % 10)
        times.append(time.perf_counter() - begin)
    print("%.0f" % (128 / sorted(times[1:])[len(times[1:]) // 2]))
EOF
echo
printf '%-36s %14s %14s %8s\n' variant "ddp samples/s" torchvision ratio
sed -n 3,10p "$work/ddp.out" | paste - "$work/torch.out" | awk -F'\t' '{
    n = split($1, f, " +"); ours = f[n]; name = $1; sub(/ +[0-9]+$/, "", name)
    printf "%-36s %14s %14s %8.2f\n", name, ours, $2, ours / $2 }'
