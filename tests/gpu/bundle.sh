#!/bin/sh
# bundle.sh BUILD_DIR OUT: what tests/gpu/check.sh needs on a GPU machine, which has
# no compiler and no Fashion-MNIST: OUT/bin.tar.xz (the kernel checks of BUILD_DIR
# and unit_rounding, its check of the kernels' rounding to bf16; fashion.ddp built
# with its data read below --data-root, with NCCL as fashion_nccl, with precision =
# bf16 as fashion_bf16; for the comparisons of a few steps, with SGD as fashion_sgd,
# and so with NCCL as fashion_sgd_nccl and fashion_sgd_nccl_bN (batch_per_replica N),
# with the ring as fashion_sgd_ring_b32; ddprun, and the programs of
# bench/gpu_throughput.sh (tf32 and bf16), stripped: they need only libc, libm and the
# driver they load themselves), OUT/data/fashion-mnist and OUT/bench
# (gpu_throughput.sh and .py). About 50 MB, to carry with the device tool.
set -eu
build=$(cd "$1" && pwd) out=$2
source=$(cd "$(dirname "$0")/../.." && pwd)
data=${DDP_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$out/data/fashion-mnist" "$stage/bin"
for check in "$build"/tests/gpu_check_*; do
    case $check in *_no_barriers) continue ;; esac
    cp "$check" "$stage/bin/"
done
sed "s|\"$data/|\"fashion-mnist/|" "$source/samples/fashion.ddp" > "$stage/fashion.ddp"
"$build/ddpc" build "$stage/fashion.ddp" -o "$stage/bin/fashion"
"$build/ddpc" build "$stage/fashion.ddp" -o "$stage/bin/fashion_nccl" -Dcommunication=nccl
sgd="-Doptimizer=sgd(learning_rate = 0.05)"
"$build/ddpc" build "$stage/fashion.ddp" -o "$stage/bin/fashion_sgd" "$sgd"
"$build/ddpc" build "$stage/fashion.ddp" -o "$stage/bin/fashion_sgd_nccl" "$sgd" -Dcommunication=nccl
"$build/ddpc" build "$stage/fashion.ddp" -o "$stage/bin/fashion_sgd_accumulate" "$sgd" -Dbatch_per_replica=16 \
    -Daccumulate_batches=4
"$build/ddpc" build "$stage/fashion.ddp" -o "$stage/bin/fashion_lars" \
    "-Doptimizer=lars(learning_rate = 1, weight_decay = 1e-4, bias_weight_decay = 0)"
for batch in 8 16 32; do
    "$build/ddpc" build "$stage/fashion.ddp" -o "$stage/bin/fashion_sgd_nccl_b$batch" "$sgd" -Dcommunication=nccl \
        -Dbatch_per_replica=$batch
done
"$build/ddpc" build "$stage/fashion.ddp" -o "$stage/bin/fashion_sgd_ring_b32" "$sgd" -Dcommunication=ring \
    -Dbatch_per_replica=32
"$build/ddpc" build "$stage/fashion.ddp" -o "$stage/bin/fashion_bf16" -Dprecision=bf16
cp "$build/ddprun" "$build/tests/unit_rounding" "$stage/bin/"
sh "$source/bench/gpu_throughput.sh" --build "$build" "$stage/bin"
strip "$stage"/bin/*
tar -C "$stage/bin" -cf - . | xz -9 -T2 > "$out/bin.tar.xz"
cp "$data"/*-ubyte.gz "$out/data/fashion-mnist/"
mkdir -p "$out/bench"
cp "$source/bench/gpu_throughput.sh" "$source/bench/gpu_throughput.py" "$out/bench/"
echo "bundle.sh: $out holds $(du -sh "$out" | cut -f1): $(ls "$stage/bin" | wc -l) programs, Fashion-MNIST, the GPU benchmark"
