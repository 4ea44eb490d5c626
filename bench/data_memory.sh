#!/bin/sh
# data_memory.sh [BUILD_DIR [WORKERS [SAMPLES]]]: the memory a dataset costs the workers
# of one machine. A CIFAR-sized .npy of random bytes (SAMPLES of 32x32x3, 60000 by
# default: 176 MiB) trains a small model for one epoch on 1 and WORKERS (default 4)
# local workers started by ddprun, once from the plain file (mapped: the page cache
# holds one copy for all) and once from the same file gzip-compressed (read: a copy in
# each worker).
#
# For each run it prints, sampled every 0.2 s while the job runs, the largest sum over
# the workers of their private memory (RssAnon) and of their proportional share of
# everything they touch (Pss, which counts a page shared by k workers 1/k in each),
# and the job's wall time; then the ratio of the read file's figures to the mapped
# one's (above 1: the mapped file costs less).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:-$root/build}")
workers=${2:-4} samples=${3:-60000}
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT

echo "writing $samples samples of 32x32x3 bytes"
python3 - "$work" "$samples" <<'EOF'
import os, sys
work, n = sys.argv[1], int(sys.argv[2])
def save(path, descr, shape, data):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + len(header).to_bytes(2, "little") + header.encode() + data)
save(f"{work}/x.npy", "|u1", f"({n}, 32, 32, 3)", os.urandom(n * 3072))
save(f"{work}/y.npy", "|u1", f"({n},)", bytes(i % 10 for i in range(n)))
EOF
gzip -1 -c "$work/x.npy" > "$work/x.npy.gz"
for file in x.npy x.npy.gz; do
    cat > "$work/${file%%.*}_${file##*.}.ddp" <<EOF
dataset images = npy(inputs = "$work/$file", labels = "$work/y.npy", scale = 1 / 255)

model small(input: [32, 32, 3]) {
    flatten
    hidden: dense(64, activation = relu)
    logits: dense(10)
}

train small on images {
    batch_per_replica = 32
    seed              = 1
    loss              = sparse_categorical_crossentropy(from_logits = true)
    optimizer         = sgd(learning_rate = 0.01)
    epochs            = 1
}
EOF
done
"$build/ddpc" build "$work/x_npy.ddp" -o "$work/mapped"
"$build/ddpc" build "$work/x_gz.ddp" -o "$work/read"

# measure PROGRAM WORKERS: "ANON PSS SECONDS", the largest sums in KiB
measure() {
    rm -rf "$work/run"
    start=$(date +%s.%N)
    "$build/ddprun" -n "$2" "$work/$1" --threads 1 --run-dir "$work/run" > "$work/out" 2>&1 &
    job=$! anon_max=0 pss_max=0
    while kill -0 "$job" 2>/dev/null; do
        anon=0 pss=0
        for w in $(pgrep -P "$job"); do
            a=$(awk '/^RssAnon:/ { print $2 }' "/proc/$w/status" 2>/dev/null || true)
            p=$(awk '/^Pss:/ { print $2 }' "/proc/$w/smaps_rollup" 2>/dev/null || true)
            anon=$((anon + ${a:-0})) pss=$((pss + ${p:-0}))
        done
        [ "$anon" -gt "$anon_max" ] && anon_max=$anon
        [ "$pss" -gt "$pss_max" ] && pss_max=$pss
        sleep 0.2
    done
    if ! wait "$job"; then
        cat "$work/out" >&2
        exit 1
    fi
    echo "$anon_max $pss_max $(echo "$(date +%s.%N) - $start" | bc)"
}

printf '%-8s %7s %16s %16s %10s\n' file workers "RssAnon MiB" "Pss MiB" "seconds"
for n in 1 "$workers"; do
    set -- $(measure mapped "$n") $(measure read "$n")
    printf '%-8s %7d %16.0f %16.0f %10.2f\n' mapped "$n" "$(($1 / 1024))" "$(($2 / 1024))" "$3"
    printf '%-8s %7d %16.0f %16.0f %10.2f\n' read "$n" "$(($4 / 1024))" "$(($5 / 1024))" "$6"
    awk -v a1="$1" -v p1="$2" -v t1="$3" -v a2="$4" -v p2="$5" -v t2="$6" -v n="$n" 'BEGIN {
        printf "read / mapped, %d workers: RssAnon %.1fx, Pss %.2fx, time %.2fx\n", n, a2 / a1, p2 / p1, t2 / t1 }'
done
