#!/bin/sh
# gpu_throughput.sh DIR [SECONDS [PRECISION]]: ddp's training speed on one GPU beside
# PyTorch's, in the same run: ResNet-50 on CIFAR-10-sized data
# (samples/cifar10_resnet50.ddp, batch 128) and the Fashion-MNIST CNN
# (samples/fashion.ddp, batch 64), both with PRECISION, on random data (--synthetic);
# then bench/gpu_throughput.py trains the same models in PyTorch, eager and with
# torch.compile. All of it within SECONDS (100).
#
# PRECISION is tf32 (the default) or bf16:
#   tf32  ddp's `precision = tf32` beside PyTorch with TF32 for matrix products and
#         convolutions
#   bf16  ddp's `precision = bf16` (bf16 activations, bf16 products summed in f32, f32
#         master weights) beside PyTorch AMP: the forward and the loss under
#         torch.autocast(dtype=torch.bfloat16), f32 parameters and optimizer
#
# DIR holds the programs (bench_resnet50_PRECISION, bench_fashion_PRECISION): a folder
# of them, a bundle of tests/gpu/bundle.sh (bin.tar.xz), or a build tree (they are
# built with its ddpc). `gpu_throughput.sh --build BUILD_DIR OUT` only builds them, both
# precisions, into OUT.
#
# What it measures: samples per second of training steps (forward, backward, update)
# after warm-up. Both sides choose cuDNN's convolution engines by timing them: ddp with
# --conv-search timed, PyTorch with cudnn.benchmark. ddp runs for its share of the time and is stopped; its figure is the
# median over the intervals between its progress lines (a line every few steps gives
# the epoch's rate so far, from which each interval's rate follows), steps of the
# warm-up left out, its start-up (loading CUDA, the PTX, cuBLAS) too. PyTorch's is the
# median over chunks of steps timed with CUDA events, data already on the GPU, its
# warm-up and compile time left out (the compile time is printed). ddp's figure also
# carries its input pipeline (batches generated on the host and uploaded while the
# step before runs); PyTorch's does not.
#
# Reading the ratios: ddp/torch above 1 means ddp trains faster than PyTorch on this
# GPU. The targets printed beside them, the same for both precisions: ResNet-50 at
# least 1.0x PyTorch eager (AMP eager for bf16) and 0.8x torch.compile; the
# Fashion-MNIST CNN at least 1.0x eager. A compile case that fails or does not fit in
# the time left shows "-" with the reason in the log above.
#
# Time: ddp's ResNet-50 gets a fifth of SECONDS (its start-up included), its CNN a
# tenth, PyTorch the rest: its eager cases first, then the compiled ones, each stopped
# or skipped when the rest would not do. A cold torch.compile of ResNet-50's training
# step can take most of a minute; a larger SECONDS gives it room.
#
# Output: the set-up, a line per measurement (`ddp MODEL PRECISION SAMPLES_PER_S ...`,
# `reference MODEL MODE PRECISION SAMPLES_PER_S ...`), a table of ratios, and a last
# line `summary: PRECISION: ...` (tests/gpu/check.sh's bench stage shows it). Exit
# status: 0 measured; 1 a ddp program failed or gave no figure on the GPU; 2 bad
# usage; 77 skipped: no usable GPU, or no PyTorch with CUDA to compare with (ddp's
# figures are still printed). DDP_CHECK_DEVICE=emulated runs ddp on the emulated GPU
# and PyTorch on the CPU (f32 for tf32, autocast bf16 for bf16), where PyTorch is
# installed: a dry run of this script; its figures mean nothing. DDP_BENCH_PYTHON names
# the Python to use.
#
# `gpu_throughput.sh --profile DIR [STEPS [PRECISION [MODEL]]]` measures no ratio: it
# trains MODEL (resnet50, the default, or fashion) for STEPS steps (30) with --profile
# (each call timed on the device, the phases call by call) and prints its profile,
# then the calls' time summed by kind (each kind of generated kernel, the convolutions
# by mode, the products), from its profile.json: where a step's time goes, and what to
# make faster.
set -u
here=$(cd "$(dirname "$0")" && pwd)
me=bench/gpu_throughput.sh

# The programs, built the same way wherever they are: the batches written out so that
# the PyTorch side (BATCH in gpu_throughput.py) matches even if a sample changes; the
# ResNet-50 sample asks for a Slurm job step and checkpoints, which a benchmark
# needs neither of.
build_programs() { # build_programs BUILD_DIR OUT_DIR
    for p in tf32 bf16; do
        "$1/ddpc" build "$here/../samples/fashion.ddp" -D precision=$p -D batch_per_replica=64 \
            -o "$2/bench_fashion_$p" &&
        "$1/ddpc" build "$here/../samples/cifar10_resnet50.ddp" -D precision=$p -D batch_per_replica=128 \
            -D cluster=auto -D checkpoint=none -o "$2/bench_resnet50_$p" || return
    done
}
if [ "${1:-}" = --build ]; then
    [ $# -eq 3 ] || { echo "usage: $me --build BUILD_DIR OUT_DIR" >&2; exit 2; }
    build_programs "$2" "$3"
    exit
fi
profile=0
[ "${1:-}" = --profile ] && { profile=1; shift; }
[ $# -ge 1 ] && [ $# -le $((3 + profile)) ] ||
    { echo "usage: $me DIR [SECONDS [tf32|bf16]] | --profile DIR [STEPS [tf32|bf16 [resnet50|fashion]]]" >&2; exit 2; }
dir=$1 budget=${2:-100} precision=${3:-tf32} model=${4:-resnet50}
case $model in resnet50 | fashion) ;; *) echo "$me: MODEL must be resnet50 or fashion, not $model" >&2; exit 2 ;; esac
case $precision in tf32 | bf16) ;; *) echo "$me: PRECISION must be tf32 or bf16, not $precision" >&2; exit 2 ;; esac
device=${DDP_CHECK_DEVICE:-gpu}
case $device in gpu | emulated) ;; *) echo "$me: DDP_CHECK_DEVICE must be gpu or emulated, not $device" >&2; exit 2 ;; esac
if [ $profile = 1 ]; then
    steps=${2:-30}
    case $steps in '' | *[!0-9]*) steps=0 ;; esac
    [ "$steps" -ge 2 ] || { echo "$me: STEPS must be a whole number of at least 2, not ${2:-}" >&2; exit 2; }
else
    case $budget in '' | *[!0-9]*) budget=0 ;; esac
    [ "$budget" -ge 20 ] || { echo "$me: SECONDS must be a whole number of at least 20, not ${2:-}" >&2; exit 2; }
fi
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-gpu-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
programs="bench_resnet50_$precision bench_fashion_$precision"

# --------------------------------------------------------------- the programs
if [ -x "$dir/bench_resnet50_$precision" ]; then
    bin=$dir
elif [ -f "$dir/bin.tar.xz" ]; then
    bin=$work/bin
    mkdir -p "$bin"
    members=$(for p in $programs; do printf './%s ' "$p"; done)
    if command -v xz > /dev/null; then
        xz -dc "$dir/bin.tar.xz" | tar -C "$bin" -xf - $members
    else
        python3 -c 'import sys, tarfile
with tarfile.open(sys.argv[1], "r:xz") as t: t.extractall(sys.argv[2], [t.getmember(m) for m in sys.argv[3:]])' \
            "$dir/bin.tar.xz" "$bin" $members
    fi || { echo "$me: $dir/bin.tar.xz holds no $programs (a bundle from an older bundle.sh?)" >&2; exit 2; }
elif [ -x "$dir/ddpc" ]; then
    bin=$work/bin
    mkdir -p "$bin"
    echo "building the benchmark programs with $dir/ddpc"
    build_programs "$dir" "$bin" || { echo "$me: cannot build the programs with $dir/ddpc" >&2; exit 2; }
else
    echo "$me: $dir is neither a folder of the programs ($programs), a bundle (bin.tar.xz) nor a build tree (ddpc)" >&2
    exit 2
fi

# --------------------------------------------------------------- the devices
"$bin/bench_fashion_$precision" --device "$device" --synthetic --epochs 0 --run-dir "$work/probe" > "$work/probe.log" 2>&1 || {
    grep -q 'no usable GPU' "$work/probe.log" &&
        { echo "$me: SKIPPED: $(tail -n 1 "$work/probe.log")"; exit 77; }
    echo "$me: the ddp program cannot start on the $device device:" >&2
    cat "$work/probe.log" >&2
    exit 1
}
if [ "$device" = gpu ]; then
    gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n 1)
    torch_device=cuda torch_precision=$precision fashion_every=50 resnet_every=5
    resnet_seconds=$((budget / 5)) fashion_seconds=$((budget / 10))
else
    gpu="the emulated GPU (a dry run: its figures mean nothing)"
    # PyTorch on the CPU has no TF32 (its autocast has bf16); the emulated device takes
    # about a second a step of the CNN, and ResNet-50's first step takes longer than any
    # budget here
    torch_device=cpu torch_precision=$precision fashion_every=1 resnet_every=1
    [ "$precision" = tf32 ] && torch_precision=f32
    resnet_seconds=$((budget / 10)) fashion_seconds=$((budget / 4))
fi

# --------------------------------------------------------------- --profile
if [ $profile = 1 ]; then
    echo "$me: $model $precision profiled for $steps steps on ${gpu:-a GPU}"
    timeout -s KILL 300 "$bin/bench_${model}_$precision" --device "$device" --conv-search timed --synthetic \
        --epochs 1 --steps-per-epoch "$steps" --profile --run-dir "$work/profile" > "$work/profile.log" 2>&1 &&
        [ -f "$work/profile/profile.json" ] || {
        echo "$me: FAIL: the profiled run failed or wrote no profile:"
        tail -n 5 "$work/profile.log"
        exit 1
    }
    cat "$work/profile/profile.txt"
    # each call of profile.json's list is a line: {"name": ..., "kind": ..., "ms": ...}
    awk -F'"' '
        $2 == "step_ms" { step = $3; gsub(/[^0-9.]/, "", step) }
        $2 == "name" {
            name = $4; kind = $8; ms = $0; sub(/.*"ms": /, "", ms); sub(/,.*/, "", ms)
            if (kind == "kernel") sub(/^ddp_k[0-9]+_/, "", name)
            else if (kind == "conv") { split(name, w, " "); name = "conv " w[2] }
            else name = kind
            if (!(name in total)) order[n++] = name
            total[name] += ms; calls[name]++
        }
        END { # the kinds, the most expensive first
            for (i = 1; i < n; i++)
                for (j = i; j > 0 && total[order[j - 1]] < total[order[j]]; j--) {
                    x = order[j]; order[j] = order[j - 1]; order[j - 1] = x
                }
            printf "\n  %-22s %6s %12s %7s\n", "by kind of call", "calls", "ms a step", "% step"
            for (i = 0; i < n; i++) {
                k = order[i]
                printf "  %-22s %6d %12.3f %6.1f%%\n", k, calls[k], total[k], 100 * total[k] / step
            }
        }' "$work/profile/profile.json"
    exit 0
fi

python=""
for p in ${DDP_BENCH_PYTHON:-} /opt/torch/.venv/bin/python3 python3; do
    command -v "$p" > /dev/null 2>&1 && "$p" -c 'import torch' 2> /dev/null && { python=$p; break; }
done
echo "$me: ddp on ${gpu:-a GPU}; PyTorch: ${python:-none found (tried ${DDP_BENCH_PYTHON:+$DDP_BENCH_PYTHON, }/opt/torch/.venv/bin/python3, python3)}; $precision; ${budget} s in all"

# --------------------------------------------------------------- ddp
# ddp_rate NAME EVERY SECONDS: train on the device until SECONDS pass, then print
# `ddp NAME PRECISION RATE ...` from its progress lines (one after the first step, then
# every EVERY steps): each gives the epoch's rate so far r(s) at step s, so the time to
# step s is s * batch / r(s), and an interval's rate (s2 - s1) * batch / (t2 - t1). The
# intervals up to the second line are the warm-up; the median of the others is the
# figure, which a slow interval (the host busy elsewhere) does not move.
failed=0
ddp_rate() {
    log=$work/ddp_$1.log
    timeout -s KILL "$3" "$bin/bench_$1_$precision" --device "$device" --conv-search timed --synthetic --epochs 1 \
        --steps-per-epoch 100000 --log-every "$2" --run-dir "$work/run_$1" > "$log" 2>&1
    status=$?
    rate=$(awk -v warm=2 '
        $1 == "epoch" && $3 == "step" && $NF == "samples/s" {
            split($4, at, "/"); s = at[1]; r = $(NF - 1)
            if (r <= 0) next
            t = s / r   # the time to step s over the batch, which cancels out
            if (++line > warm && t > pt && s > ps) { rates[n++] = (s - ps) / (t - pt); last = s }
            if (line == warm) first = s
            ps = s; pt = t
        }
        END {
            if (n == 0) { printf "- steps=%d", ps; exit }
            for (i = 1; i < n; i++) for (j = i; j > 0 && rates[j - 1] > rates[j]; j--) { x = rates[j]; rates[j] = rates[j - 1]; rates[j - 1] = x }
            printf "%.1f intervals=%d steps=%d-%d", (n % 2 ? rates[(n - 1) / 2] : (rates[n / 2 - 1] + rates[n / 2]) / 2), n, first, last
        }' "$log")
    # stopped by its time limit (KILL: 137) is how a run ends here; finishing is fine too
    case $status in
    0 | 124 | 137) echo "ddp $1 $precision $rate seconds=$3" ;;
    *) echo "ddp $1 $precision - failed with status $status:"; tail -n 3 "$log"; failed=1; rate=- ;;
    esac
    case $rate in -*) [ "$device" = gpu ] && failed=1 ;; esac
    rate=${rate%% *}
}
# ResNet-50's start-up (device, cuBLAS, the PTX of about a hundred kernels) takes its
# share of the time too.
ddp_rate resnet50 $resnet_every $resnet_seconds
ddp_resnet50=$rate
ddp_rate fashion $fashion_every $fashion_seconds
ddp_fashion=$rate

# --------------------------------------------------------------- PyTorch
reference=$work/reference.txt
: > "$reference"
if [ -n "$python" ]; then
    left=$((budget - $(elapsed) - 5))
    if [ $left -lt 15 ]; then
        echo "$me: only $left s left of $budget for PyTorch: no reference"
    else
        # its own budget stops or skips cases in time; this limit is for a hang
        timeout -s KILL $((left + 10)) "$python" "$here/gpu_throughput.py" --device $torch_device \
            --precision $torch_precision --seconds 3 --budget $left 2>&1 | tee "$reference"
    fi
fi

# --------------------------------------------------------------- the ratios
figure() { # figure MODEL MODE: PyTorch's samples/s, or -
    awk -v m="$1" -v mode="$2" '$1 == "reference" && $2 == m && $3 == mode { f = $5 } END { print f == "" ? "-" : f }' "$reference"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b + 0 == 0) print "-"; else printf "%.2f", a / b }'; }
row() { # row MODEL DDP_RATE COMPILE_TARGET: the model's line of the table and part of the summary
    eager=$(figure "$1" eager) compiled=$(figure "$1" compile)
    to_eager=$(ratio "$2" "$eager") to_compiled=$(ratio "$2" "$compiled")
    printf '%-9s %12s %12s %9s %7s %14s %11s %7s\n' "$1" "$2" "$eager" "$to_eager" ">=1.0" "$compiled" \
        "$to_compiled" "$3"
    summary="$summary${summary:+; }$1 ddp/eager $to_eager (target 1.0), ddp/compile $to_compiled"
    [ "$3" = - ] || summary="$summary (target ${3#>=})"
}
echo
printf '%-9s %12s %12s %9s %7s %14s %11s %7s\n' model ddp "torch eager" ddp/eager target torch.compile ddp/compile target
summary=""
row resnet50 "$ddp_resnet50" ">=0.8"
row fashion "$ddp_fashion" -
echo "(samples/s; ddp $precision, PyTorch $torch_precision$([ "$torch_precision" = bf16 ] && echo " AMP"); $(elapsed) s in all)"
echo "summary: $precision: $summary"

[ $failed -eq 0 ] || { echo "$me: FAIL: a ddp program failed or gave no figure"; exit 1; }
if ! awk '$1 == "reference" && $3 == "eager" && $5 != "-" { found = 1 } END { exit !found }' "$reference"; then
    why="no Python here imports torch"
    [ -n "$python" ] && why=$(grep -m 1 -e 'not importable' -e 'no CUDA' -e ' failed: ' "$reference" ||
        echo "PyTorch gave no eager figure in its time")
    echo "$me: SKIPPED the comparison (ddp $precision alone: resnet50 $ddp_resnet50, fashion $ddp_fashion samples/s): $why"
    exit 77
fi
exit 0
