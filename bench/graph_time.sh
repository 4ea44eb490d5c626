#!/bin/sh
# graph_time.sh [DDPC] [RUNS]: how long `ddpc emit --stage=graph` takes on ResNet-50
# (target: well under a second), and on a 40,000-layer model, beside the start-up of
# ddpc itself (`ddpc --version`) measured in the same run as the reference.
# Prints medians over RUNS runs (default 21) and the ratios.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
ddpc=$(realpath "${1:-$root/build/ddpc}")
runs=${2:-21}
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
export DDP_STDLIB="$root/stdlib"

cat >"$work/resnet50.ddp" <<'DDP'
import "std/resnet"
model net(input: [224, 224, 3]) {
    resnet50(classes = 10)
}
DDP
cat >"$work/deep.ddp" <<'DDP'
import "std/resnet"
model deep(input: [8, 8, 16]) {
    repeat 4000 { basic(16) }
    global_avgpool
    dense(10)
}
DDP

# median_ms CMD...: the median wall time of CMD over $runs runs, in milliseconds
median_ms() {
    i=0
    : >"$work/times"
    while [ $i -lt "$runs" ]; do
        start=$(date +%s%N)
        "$@" >/dev/null
        end=$(date +%s%N)
        echo $(( (end - start) / 1000 )) >>"$work/times"
        i=$((i + 1))
    done
    sort -n "$work/times" | awk '{ t[NR] = $1 } END { printf "%.2f", t[int((NR + 1) / 2)] / 1000 }'
}

startup=$(median_ms "$ddpc" --version)
resnet=$(median_ms "$ddpc" emit --stage=graph "$work/resnet50.ddp")
deep=$(median_ms "$ddpc" emit --stage=graph "$work/deep.ddp")
resnet_layers=$("$ddpc" emit --stage=graph "$work/resnet50.ddp" | tail -n +3 | grep -c -v '^total')
deep_layers=$("$ddpc" emit --stage=graph "$work/deep.ddp" | tail -n +3 | grep -c -v '^total')

echo "ddpc emit --stage=graph, median of $runs runs on $(nproc) cores"
printf '%-34s %10s ms\n' "reference: ddpc --version" "$startup"
printf '%-34s %10s ms   %s layers, %s x start-up, %s of the 1 s target\n' \
    "resnet50 (std/resnet)" "$resnet" "$resnet_layers" \
    "$(awk -v a="$resnet" -v b="$startup" 'BEGIN { printf "%.1f", a / b }')" \
    "$(awk -v a="$resnet" 'BEGIN { printf "%.4f", a / 1000 }')"
printf '%-34s %10s ms   %s layers, %s layers/ms\n' \
    "4000 basic blocks" "$deep" "$deep_layers" \
    "$(awk -v a="$deep" -v n="$deep_layers" 'BEGIN { printf "%.0f", n / a }')"
