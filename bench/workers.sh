#!/bin/sh
# workers.sh [BUILD_DIR]: data-parallel training on this machine, 1, 2 and 4 local
# workers started by ddprun, on random data (--synthetic) of the sample MLP
# (samples/fashion_mlp.ddp) and CNN (samples/fashion.ddp), each built with 1 MB
# gradient buckets so several all-reduces can run during backward.
#
# For each run it prints the training rate (samples/s of the global batch, as worker
# 0 reports it) and its ratio to one worker with the same CPUs, and, from the run's
# --trace: the time each step spent in bucket all-reduces, the share of it hidden
# behind backward (all-reduce spans overlapping the backward span), and the time the
# optimizer still waited for the last bucket. The machine's CPUs are shared by the
# workers (each gets CPUs / workers threads, at least 1), so on a small machine more
# workers cannot be faster: the figures show what the ring and its overlap cost.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:-$root/build}")
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT
cpus=$(nproc)
mlp_steps=${MLP_STEPS:-300} cnn_steps=${CNN_STEPS:-30}

echo "building the samples with 1 MB buckets"
"$build/ddpc" build "$root/samples/fashion_mlp.ddp" --bucket-size 1M -o "$work/mlp"
"$build/ddpc" build "$root/samples/fashion.ddp" --bucket-size 1M -o "$work/cnn"

# run PROGRAM WORKERS STEPS: prints "rate" then the trace's figures
run() {
    program=$1 n=$2 steps=$3
    threads=$((cpus / n))
    [ "$threads" -ge 1 ] || threads=1
    "$build/ddprun" -n "$n" "$work/$program" --synthetic --threads "$threads" --epochs 1 --steps-per-epoch "$steps" \
        --metrics "$work/m.json" --trace "$work/t.json" --run-dir "$work/run" > /dev/null
    python3 - "$work/m.json" "$work/t.json" "$n" <<'EOF'
import json, sys
metrics, trace, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
rate = json.loads(open(metrics).readline())["samples_per_sec"]
spans = [e for e in json.load(open(trace))["traceEvents"] if e.get("ph") == "X"]
def by(name):
    out = {}
    for e in spans:
        if e["name"] == name:
            out.setdefault((e["pid"], e["args"]["step"]), []).append(e)
    return out
backward, reduce, wait = by("backward"), by("all-reduce"), by("gradient wait")
total = hidden = waited = 0.0
steps = 0
for key, bw in backward.items():
    if key[1] == 0:
        continue  # the first step warms up
    b0, b1 = bw[0]["ts"], bw[0]["ts"] + bw[0]["dur"]
    for e in reduce.get(key, []):
        total += e["dur"]
        hidden += max(0.0, min(b1, e["ts"] + e["dur"]) - max(b0, e["ts"]))
    waited += sum(e["dur"] for e in wait.get(key, []))
    steps += 1
steps = max(steps, 1)
print("%.0f %.3f %.1f %.3f" % (rate, total / steps / 1e3, 100 * hidden / total if total else 0, waited / steps / 1e3))
EOF
}

for model in mlp cnn; do
    steps=$mlp_steps
    [ $model = cnn ] && steps=$cnn_steps
    echo
    echo "$model, $steps steps, $cpus CPUs shared by the workers"
    printf '%-8s %14s %10s %18s %16s %20s\n' workers samples/s "x 1 worker" "all-reduce ms/step" "hidden behind bw" \
        "optimizer wait ms"
    base=""
    for n in 1 2 4; do
        set -- $(run $model $n "$steps")
        [ -z "$base" ] && base=$1
        ratio=$(awk -v a="$1" -v b="$base" 'BEGIN { printf "%.2f", a / b }')
        if [ "$n" -eq 1 ]; then
            printf '%-8s %14s %10s %18s %16s %20s\n' 1 "$1" 1.00 - - -
        else
            printf '%-8s %14s %10s %18s %15s%% %20s\n' "$n" "$1" "$ratio" "$2" "$3" "$4"
        fi
    done
done
