#!/bin/sh
# build_time.sh [DDPC] [RUNS]: how long `ddpc build` takes for the samples and for
# ResNet-50 at 224x224 (targets: under 2 s for samples/fashion.ddp, under 10 s for
# ResNet-50), beside the time to link an empty C program with the same runtime and
# BLAS (the floor any build pays), measured in the same run. Medians of RUNS (3). Then
# a build again with another number of epochs, which takes every module but the
# program's descriptor from ddpc's cache (compiler/cache.c), filled by one build first.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
ddpc=$(realpath "${1:-$root/build/ddpc}")
runs=${2:-3}
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
export DDP_STDLIB="$root/stdlib"
export DDP_CACHE_DIR=off # code generated every time: the first build of a program

cat >"$work/resnet50.ddp" <<'DDP'
import "std/resnet"
dataset d = synthetic(shape = [224, 224, 3], classes = 10, samples = 1024)
model net(input: [224, 224, 3]) {
    resnet50(classes = 10)
}
train net on d {
    batch_per_replica = 32
    loss = sparse_categorical_crossentropy(from_logits = true)
    optimizer = sgd(learning_rate = 0.1, momentum = 0.9)
    epochs = 1
}
DDP

median_s() { # the median wall time of a command, in seconds
    i=0
    : >"$work/times"
    while [ $i -lt "$runs" ]; do
        start=$(date +%s%N)
        "$@" >/dev/null
        end=$(date +%s%N)
        echo $(( (end - start) / 1000000 )) >>"$work/times"
        i=$((i + 1))
    done
    sort -n "$work/times" | awk '{ t[NR] = $1 } END { printf "%.2f", t[int((NR + 1) / 2)] / 1000 }'
}

echo 'int main(void) { return 0; }' >"$work/empty.c"
blas=$(grep -o 'DDP_BLAS_LIBS="[^"]*"' "$root/build/build.ninja" 2>/dev/null | head -1 | cut -d'"' -f2 || true)
link=$(median_s cc -o "$work/empty" "$work/empty.c" "$root/build/libddprt.a" $blas -lpthread -ldl -lm)

echo "ddpc build, median of $runs runs on $(nproc) cores"
printf '%-38s %8s s\n' "reference: cc links an empty program" "$link"
for case in "samples/fashion.ddp:2" "samples/fashion_mlp.ddp:2" "samples/cifar10_resnet50.ddp:10" "$work/resnet50.ddp:10"; do
    file=${case%:*} target=${case##*:}
    [ -f "$file" ] || file="$root/$file"
    t=$(median_s "$ddpc" build "$file" -o "$work/program")
    kernels=$("$ddpc" emit --stage=ptx "$file" | grep -c '^\.visible \.entry')
    DDP_CACHE_DIR=$work/cache "$ddpc" build "$file" -o "$work/program"
    again=$(export DDP_CACHE_DIR=$work/cache && median_s "$ddpc" build "$file" -o "$work/program" -Depochs=7)
    printf '%-38s %8s s   %4s kernels, %s of the %s s target; again, cached: %s s\n' "$(basename "$file")" "$t" \
        "$kernels" "$(awk -v a="$t" -v b="$target" 'BEGIN { printf "%.2f", a / b }')" "$target" "$again"
done
