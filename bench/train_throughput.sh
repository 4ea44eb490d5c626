#!/bin/sh
# train_throughput.sh [BUILD_DIR]: training speed of the sample MLP and CNN
# (samples/fashion_mlp.ddp, samples/fashion.ddp), of a small character-level GPT
# (tests/train/char_lm.ddp at batch 64) and of the CIFAR-10 ViT (samples/cifar10_vit.ddp
# at batch 64: dropout, layer norms, attention over 64 patches) on random data
# (--synthetic), for each thread count from 1 to the CPUs here, beside NumPy (the MLP,
# written out) and PyTorch (all four) training the same model with the same batch,
# measured in this run. Ratios above 1 mean ddp is faster. MODELS="gpt vit" measures
# those alone.
#
# PyTorch is installed with pip into BUILD_DIR/torch-venv when no Python here has it
# (DDP_BENCH_NO_INSTALL=1 skips that); tests/train/against_pytorch.sh uses it too.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:-$root/build}")
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
mlp_steps=${MLP_STEPS:-600} cnn_steps=${CNN_STEPS:-40} gpt_steps=${GPT_STEPS:-60} vit_steps=${VIT_STEPS:-8}
models=${MODELS:-mlp cnn gpt vit}

has() { [ -n "$1" ] && "$1" -c "import $2" 2>/dev/null; }
venv=$build/torch-venv
if ! has "$venv/bin/python3" torch && ! has python3 torch && [ -z "${DDP_BENCH_NO_INSTALL:-}" ]; then
    echo "installing PyTorch into $venv (once)"
    if python3 -m venv "$venv" >/dev/null 2>&1; then
        "$venv/bin/pip" install -q --index-url https://download.pytorch.org/whl/cpu torch numpy 2>/dev/null ||
            "$venv/bin/pip" install -q torch numpy || echo "pip could not install PyTorch: comparing with NumPy only"
    fi
fi
torch_python="" numpy_python=""
for p in "$venv/bin/python3" python3 /usr/bin/python3; do
    [ -z "$torch_python" ] && has "$p" torch && torch_python=$p
    [ -z "$numpy_python" ] && has "$p" numpy && numpy_python=$p
done

echo "building the samples"
"$build/ddpc" build "$root/samples/fashion_mlp.ddp" -o "$work/mlp"
"$build/ddpc" build "$root/samples/fashion.ddp" -o "$work/cnn"
"$build/ddpc" build "$root/tests/train/char_lm.ddp" -o "$work/gpt" -Dbatch_per_replica=64
"$build/ddpc" build "$root/samples/cifar10_vit.ddp" -o "$work/vit" -Dbatch_per_replica=64 -Dcluster=auto \
    -Dcheckpoint=none

ddp_rate() { # ddp_rate PROGRAM THREADS STEPS: samples/s of its only epoch
    rm -rf "$work/run"
    "$1" --synthetic --threads "$2" --epochs 1 --steps-per-epoch "$3" --metrics "$work/m.json" \
        --run-dir "$work/run" >/dev/null
    sed -n 's/.*"samples_per_sec": \([0-9.e+]*\).*/\1/p' "$work/m.json"
}
reference() { # reference PYTHON FRAMEWORK MODEL THREADS STEPS
    [ -n "$1" ] && "$1" "$root/bench/reference.py" "$2" "$3" "$4" "$5" 2>/dev/null || echo "-"
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b == "-" || b + 0 == 0) print "-"; else printf "%.2f", a / b }'; }

cpus=$(nproc)
echo "$(uname -m), $cpus CPUs; batch 64; numpy: ${numpy_python:-none}, torch: ${torch_python:-none}"
# OPENBLAS_CORETYPE, where the environment sets it, holds ddp's and NumPy's products alike
"$work/mlp" --synthetic --check --run-dir "$work/run" | sed -n 's/^  device      /ddp: /p'
printf '%-5s %7s %14s %14s %8s %14s %8s\n' model threads "ddp samples/s" "numpy" "ratio" "pytorch" "ratio"
for model in $models; do
    steps=$mlp_steps
    [ "$model" = cnn ] && steps=$cnn_steps
    [ "$model" = gpt ] && steps=$gpt_steps
    [ "$model" = vit ] && steps=$vit_steps
    t=1
    while [ "$t" -le "$cpus" ]; do
        ours=$(ddp_rate "$work/$model" "$t" "$steps")
        numpy="-"
        [ "$model" = mlp ] && numpy=$(reference "$numpy_python" numpy mlp "$t" "$steps")
        torch=$(reference "$torch_python" torch "$model" "$t" "$steps")
        printf '%-5s %7d %14.0f %14s %8s %14s %8s\n' "$model" "$t" "$ours" "$numpy" "$(ratio "$ours" "$numpy")" \
            "$torch" "$(ratio "$ours" "$torch")"
        t=$((t * 2))
        if [ "$t" -gt "$cpus" ] && [ "$((t / 2))" -lt "$cpus" ]; then t=$cpus; fi
    done
done
