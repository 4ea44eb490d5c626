#!/bin/sh
# check.sh DIR: the GPU checks, for a machine with a GPU; at most 4 minutes. DIR is a
# bundle made by tests/gpu/bundle.sh and carried to that machine, or a build tree (its
# bundle is made first, where a GPU is found). Without a usable GPU it says so and
# exits 77 (skipped). Each stage runs under its own timeout and writes its result to
# $OUT (else DIR/results) as soon as it ends, so a run cut short still tells what
# finished:
#   gpu.txt        the GPU, driver and CUDA version
#   kernels.txt    every kernel of the samples and test models, each step of a training
#                  step's schedule (products through cuBLAS included) on the GPU against
#                  the CPU (cuDNN's convolutions against the reference convolution
#                  on the CPU); ResNet-50 (batch 2) over 8 training steps; each
#                  phase captured as a CUDA graph and replayed, bit for bit; a
#                  residual network again with cuDNN's engines chosen by timing
#                  (--conv-search timed, as the bench stage runs); the generated
#                  kernels' rounding to bf16 (the GPU's cvt.rn.bf16.f32) against
#                  the reference, every tie (unit_rounding)
#   steps.txt      fashion.ddp with SGD (fashion_sgd), 5 steps on the GPU and on the
#                  CPU from the same seed: the parameters within 2e-4 of their norm
#                  (f32; why SGD and 2e-4 below); and on the GPU, 4 batches of 16
#                  a step (accumulate_batches) against the 5 steps of 64; lars on
#                  both, 2e-4
#   epoch.txt      fashion.ddp, one epoch on each: val_accuracy within 0.5 point
#   predict.txt    --predict with the GPU epoch's parameters, on the GPU and on the CPU:
#                  every test sample's outputs within 1e-3 of their norm
#   bf16.txt       fashion.ddp with precision = bf16 (fashion_bf16), one epoch on the
#                  GPU, its banner saying "bf16 activations and products": val_accuracy
#                  within 0.5 point of the f32 epoch's on the GPU (a CPU has no bf16)
#   nccl.txt       the gradients' sums on the GPU: NCCL with one rank (fashion_sgd_nccl,
#                  its 5 steps the same as the steps stage's GPU run within 1e-6; then
#                  DDP_TEST_NCCL_ABORT=3: the watchdog's ncclCommAbort, status 3);
#                  two processes sharing the GPU through the ring (fashion_sgd_ring_b32
#                  x 2 against fashion_sgd x 1, 2e-4); where the machine has N >= 2 GPUs
#                  (2, 4 or 8 of them), N processes with NCCL against one (2e-4), and the
#                  scaling efficiency of N x batch 64 against one GPU's samples/s
#   bench.txt      bench/gpu_throughput.sh with PRECISION bf16: ddp's samples/s beside
#                  PyTorch AMP bf16's, eager and torch.compile (ResNet-50 at batch 128
#                  and fashion.ddp), in the time the 4 minutes leave (120 s at most);
#                  its summary line gives the ratios and the targets. Skipped (77)
#                  where no Python has PyTorch with CUDA; a FAIL only when a ddp
#                  program fails on the GPU. TF32 is by hand, with the bundle or build
#                  tree DIR: `sh bench/gpu_throughput.sh DIR 120 tf32`
#   summary.txt    a line per stage
# DDP_CHECK_DEVICE=emulated runs the same stages on the emulated device: a dry run of
# this script on any machine (slow: the stages' time limits cut its longer runs; the
# bench gets 60 s there, whatever the time).
set -u
device=${DDP_CHECK_DEVICE:-gpu}
dir=$(cd "${1:-$(dirname "$0")/../../build}" && pwd)
here=$(cd "$(dirname "$0")" && pwd)
results=${OUT:-$dir/results}
mkdir -p "$results"
results=$(cd "$results" && pwd)
start=$(date +%s)

# The bundle: DIR's own, or one made from the build tree DIR.
if [ ! -f "$dir/bin.tar.xz" ]; then
    first=$(ls "$dir"/tests/gpu_check_* 2>/dev/null | head -n 1)
    [ -n "$first" ] || { echo "check.sh: no bundle and no gpu_check_* programs in $dir" >&2; exit 2; }
    "$first" $device > "$results/probe.txt" 2>&1
    [ $? -eq 77 ] && { echo "tests/gpu/check.sh: SKIPPED: $(cat "$results/probe.txt")"; exit 77; }
    sh "$here/bundle.sh" "$dir" "$dir/gpu-bundle" || exit 2
    dir=$dir/gpu-bundle
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The programs make their run folders (runs/...) where they start: here, not in the
# caller's folder.
cd "$work" || exit 2
unpack() {
    if command -v xz > /dev/null; then
        (cd "$work" && xz -dc "$dir/bin.tar.xz" | tar -xf -)
    else
        python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1], "r:xz").extractall(sys.argv[2])' \
            "$dir/bin.tar.xz" "$work"
    fi
}
unpack || { echo "check.sh: cannot unpack $dir/bin.tar.xz" >&2; exit 2; }
bin=$work
"$bin/gpu_check_fashion_mlp" $device > "$results/probe.txt" 2>&1
[ $? -eq 77 ] && { echo "tests/gpu/check.sh: SKIPPED: $(cat "$results/probe.txt")"; exit 77; }

summary=$results/summary.txt
: > "$summary"
# stage NAME STATUS TEXT: one line of the summary, as soon as the stage ends
stage() {
    printf '%-8s %-4s %s (%ss in)\n' "$1" "$2" "$3" "$(($(date +%s) - start))" | tee -a "$summary"
}

nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv > "$results/gpu.txt" 2>&1 ||
    echo "nvidia-smi: not found" > "$results/gpu.txt"
stage gpu info "$(tail -n 1 "$results/gpu.txt")"

# The CPU's epoch runs beside the GPU stages: it is the long one.
fashion="$bin/fashion --data-root $dir/data --seed 7"
cpus=$(nproc)
timeout 200 $fashion --device cpu --epochs 1 --threads $((cpus > 4 ? cpus - 2 : cpus)) \
    --metrics "$work/epoch_cpu.json" > "$results/epoch_cpu.log" 2>&1 &
cpu_epoch=$!

# every kernel, each model under its own limit
failed=0
: > "$results/kernels.txt"
for check in "$bin"/gpu_check_*; do
    steps=3 limit=30
    case $check in *resnet50*) steps=8 limit=100 ;; esac
    timeout $limit "$check" $device --training-steps $steps >> "$results/kernels.txt" 2>&1
    status=$?
    [ $status -eq 0 ] ||
        { failed=$((failed + 1)); echo "FAIL: $(basename "$check") (status $status)" >> "$results/kernels.txt"; }
done
# the convolutions' engines chosen by timing, as the bench stage chooses them
timeout 60 "$bin/gpu_check_sample_resnet" $device --conv-search timed >> "$results/kernels.txt" 2>&1 ||
    { failed=$((failed + 1)); echo "FAIL: gpu_check_sample_resnet --conv-search timed" >> "$results/kernels.txt"; }
# the generated kernels' rounding to bf16, the device's own conversion
timeout 30 "$bin/unit_rounding" $device >> "$results/kernels.txt" 2>&1 ||
    { failed=$((failed + 1)); echo "FAIL: unit_rounding" >> "$results/kernels.txt"; }
stage kernels "$([ $failed -eq 0 ] && echo ok || echo FAIL)" \
    "$(grep -c '^kernel_check .* ok;' "$results/kernels.txt") models agree, $failed fail"

# A few steps from the same seed, with SGD. Not with fashion.ddp's Adam: its first
# updates are lr whatever a gradient's size, so a pre-activation that rounding moves
# across zero (a ReLU that flips: a gradient of 0 or of 1e-9) moves a whole row of
# fc1's weights by lr, 1e-3 of the norm at once. On an H200 one GPU against the CPU,
# and the ring x 2 against one GPU, were 1.2e-3 apart after 5 Adam steps, with every
# kernel within its 1e-4. With SGD (learning rate 0.05) on the CPU: its generated
# convolutions against --convolutions library 5.7e-9 apart, one worker against the
# ring x 2 4.2e-9, while one step missing moves the parameters by 8.5e-4 and another
# batch order (-Dshuffle=false) by 2.6e-3. On the H200 with SGD: the GPU against the
# CPU 5.0e-5 (ReLUs and max pools that rounding flips still route some gradients
# elsewhere, and cuDNN rounds more than the CPU's sums), the ring x 2 against one
# GPU 2.4e-5. The tolerance, 2e-4, lies midway (geometrically) between the largest
# of these and the smallest fault.
few_steps="--data-root $dir/data --seed 7 --epochs 1 --steps-per-epoch 5"
status=ok
for on in cpu $device; do
    timeout 60 "$bin/fashion_sgd" --device $on $few_steps --save "$work/steps_$on.safetensors" \
        > "$results/steps_$on.log" 2>&1 || status=FAIL
done
[ $status = ok ] && { printf 'against the CPU: ' > "$results/steps.txt"
    python3 "$here/compare.py" "$work/steps_cpu.safetensors" "$work/steps_$device.safetensors" 2e-4 \
        >> "$results/steps.txt" 2>&1 || status=FAIL; }
# accumulate_batches = 4 of 16 (fashion.ddp has no batch normalisation): the same 5
# steps of 64 on the GPU, within the same tolerance
timeout 60 "$bin/fashion_sgd_accumulate" --device $device $few_steps --save "$work/accumulate.safetensors" \
    > "$results/steps_accumulate.log" 2>&1 || status=FAIL
[ $status = ok ] && { printf '4 batches of 16 a step against 64: ' >> "$results/steps.txt"
    python3 "$here/compare.py" "$work/steps_$device.safetensors" "$work/accumulate.safetensors" 2e-4 \
        >> "$results/steps.txt" 2>&1 || status=FAIL; }
# lars (each parameter's norms a block's sums on the GPU): the GPU against the CPU
for on in cpu $device; do
    timeout 60 "$bin/fashion_lars" --device $on $few_steps --save "$work/lars_$on.safetensors" \
        > "$results/steps_lars_$on.log" 2>&1 || status=FAIL
done
[ $status = ok ] && { printf 'lars against the CPU: ' >> "$results/steps.txt"
    python3 "$here/compare.py" "$work/lars_cpu.safetensors" "$work/lars_$device.safetensors" 2e-4 \
        >> "$results/steps.txt" 2>&1 || status=FAIL; }
stage steps $status "$(tr '\n' ' ' < "$results/steps.txt" 2>/dev/null || tail -n 1 "$results/steps_$device.log")"

# one epoch on the GPU in f32, then in bf16, while the CPU's epoch still runs (time
# the bench would lose otherwise); then the CPU's, to compare
timeout 60 $fashion --device $device --epochs 1 --metrics "$work/epoch_gpu.json" --save "$work/epoch_gpu.safetensors" \
    > "$results/epoch_gpu.log" 2>&1
gpu_status=$?
timeout 60 "$bin/fashion_bf16" --data-root "$dir/data" --seed 7 --device $device --epochs 1 \
    --metrics "$work/bf16.json" > "$results/bf16.log" 2>&1
bf16_status=$?
wait $cpu_epoch
cpu_status=$?
accuracy() { sed -n 's/.*"val_accuracy": \([^,}]*\).*/\1/p' "$1" 2>/dev/null | tail -n 1; }
near() { awk -v a="$1" -v b="$2" 'BEGIN { d = a - b; exit !(a != "" && b != "" && d <= 0.005 && d >= -0.005) }'; }
a_gpu=$(accuracy "$work/epoch_gpu.json") a_cpu=$(accuracy "$work/epoch_cpu.json")
echo "val_accuracy: GPU $a_gpu, CPU $a_cpu (statuses $gpu_status, $cpu_status)" > "$results/epoch.txt"
tail -n 2 "$results/epoch_gpu.log" "$results/epoch_cpu.log" >> "$results/epoch.txt"
status=FAIL
[ $gpu_status -eq 0 ] && [ $cpu_status -eq 0 ] && near "$a_gpu" "$a_cpu" && status=ok
stage epoch $status "$(head -n 1 "$results/epoch.txt")"

# the model's outputs for every test sample from the same parameters: the forward pass
# alone, the rows gathered from the GPU's memory in the dataset's order
status=ok
for on in cpu $device; do
    timeout 30 $fashion --device $on --load "$work/epoch_gpu.safetensors" --predict "$work/predict_$on.csv" \
        > "$results/predict_$on.log" 2>&1 || status=FAIL
done
[ $status = ok ] && { python3 "$here/compare.py" "$work/predict_cpu.csv" "$work/predict_$device.csv" 1e-3 \
    > "$results/predict.txt" 2>&1 || status=FAIL; }
stage predict $status "$(cat "$results/predict.txt" 2>/dev/null || tail -n 1 "$results/predict_$device.log")"

# bf16 against the GPU's f32 epoch: the same seed and data, so only the precision differs
a_bf16=$(accuracy "$work/bf16.json")
echo "val_accuracy: bf16 $a_bf16, f32 $a_gpu (status $bf16_status)" > "$results/bf16.txt"
{ grep -m 1 '^  device ' "$results/bf16.log"; tail -n 1 "$results/bf16.log"; } >> "$results/bf16.txt"
status=FAIL
[ $bf16_status -eq 0 ] && grep -q "bf16 activations and products" "$results/bf16.log" &&
    near "$a_bf16" "$a_gpu" && status=ok
stage bf16 $status "$(head -n 1 "$results/bf16.txt")"

# The gradients' sums: NCCL alone, the ring between two processes on the GPU, NCCL
# between GPUs where there are several
gpus=$(nvidia-smi --list-gpus 2>/dev/null | grep -c '^GPU')
nccl_status=ok
: > "$results/nccl.txt"
nccl_compare() { # WHAT FILE TOLERANCE
    printf '%s: ' "$1" >> "$results/nccl.txt"
    python3 "$here/compare.py" "$work/steps_$device.safetensors" "$2" "$3" >> "$results/nccl.txt" 2>&1 ||
        nccl_status=FAIL
}
nccl_run() { # WHAT LIMIT COMMAND...: a run whose end is kept in nccl.txt
    what=$1 limit=$2
    shift 2
    timeout "$limit" "$@" > "$work/run.log" 2>&1
    run_status=$?
    { echo "$what: status $run_status"; grep -h "gradients\|done:\|NCCL\|aborted" "$work/run.log" | tail -n 4; } \
        >> "$results/nccl.txt"
}
if [ "$device" = emulated ] && [ -z "${DDP_NCCL_LIBRARY:-}" ]; then
    echo "one rank: skipped (the emulated device needs the tests' stand-in NCCL: DDP_NCCL_LIBRARY)" \
        >> "$results/nccl.txt"
else
    nccl_run "one rank" 60 "$bin/fashion_sgd_nccl" --device $device $few_steps --save "$work/nccl1.safetensors"
    [ $run_status -eq 0 ] && nccl_compare "one rank against the steps stage" "$work/nccl1.safetensors" 1e-6 ||
        nccl_status=FAIL
    nccl_run "DDP_TEST_NCCL_ABORT=3" 60 env DDP_TEST_NCCL_ABORT=3 "$bin/fashion_sgd_nccl" --device $device $few_steps
    [ $run_status -eq 3 ] && grep -q "DDP_TEST_NCCL_ABORT=3 asked for this abort; the communicator was aborted" \
        "$work/run.log" || nccl_status=FAIL
fi
nccl_run "ring, 2 processes on one GPU" 90 "$bin/ddprun" -n 2 "$bin/fashion_sgd_ring_b32" --device $device $few_steps \
    --save "$work/ring2.safetensors"
[ $run_status -eq 0 ] && nccl_compare "ring x 2 against the steps stage" "$work/ring2.safetensors" 2e-4 || nccl_status=FAIL
n=$((gpus >= 8 ? 8 : gpus >= 4 ? 4 : gpus >= 2 ? 2 : 0))
if [ $n -ge 2 ]; then
    nccl_run "NCCL, $n GPUs" 90 "$bin/ddprun" -n $n "$bin/fashion_sgd_nccl_b$((64 / n))" --device $device $few_steps \
        --save "$work/nccl$n.safetensors"
    [ $run_status -eq 0 ] && nccl_compare "NCCL x $n against the steps stage" "$work/nccl$n.safetensors" 2e-4 ||
        nccl_status=FAIL
    rate() { sed -n 's/^done: .*(\([0-9.]*\) samples\/s).*/\1/p' "$work/run.log" | tail -n 1; }
    speed="--device $device --synthetic --epochs 1 --steps-per-epoch 300"
    nccl_run "one GPU, 300 steps" 60 "$bin/fashion" $speed
    one=$(rate)
    nccl_run "NCCL, $n GPUs, 300 steps" 90 "$bin/ddprun" -n $n "$bin/fashion_nccl" $speed
    many=$(rate)
    echo "scaling: $n GPUs $many samples/s, one $one: efficiency" \
        "$(awk -v m="$many" -v o="$one" -v n=$n 'BEGIN { printf "%.2f", o > 0 ? m / (n * o) : 0 }')" \
        >> "$results/nccl.txt"
fi
stage nccl $nccl_status "$(grep -h '^scaling\|against' "$results/nccl.txt" | tr '\n' ';' | cut -c1-300)"

# Speed beside PyTorch AMP, in bf16, once the CPU's epoch no longer takes the CPUs
# that feed the GPU: the script of this tree, else the bundle's copy.
bench=$here/../../bench/gpu_throughput.sh
[ -f "$bench" ] || bench=$dir/bench/gpu_throughput.sh
left=$((225 - ($(date +%s) - start)))
limit=$((left < 120 ? left : 120))
[ "$device" = emulated ] && limit=60
if [ $limit -lt 40 ]; then
    stage bench skip "$left s left of the 4 minutes, 40 needed"
else
    DDP_CHECK_DEVICE=$device timeout -s KILL $((limit + 15)) sh "$bench" "$bin" $limit bf16 > "$results/bench.txt" 2>&1
    case $? in
    0) status=ok ;;
    77) status=skip ;;
    1) status=FAIL ;;
    *) status="cut" ;;
    esac
    stage bench $status "$(grep -h '^summary: \|SKIPPED\|FAIL' "$results/bench.txt" | tail -n 1)"
fi

grep -q " FAIL " "$summary" && { echo "tests/gpu/check.sh: FAIL"; exit 1; }
echo "tests/gpu/check.sh: the GPU agrees with the CPU"
