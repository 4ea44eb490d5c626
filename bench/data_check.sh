#!/bin/sh
# data_check.sh [BUILD_DIR [WORKERS [MIB]]]: how long a job takes to start on a
# dataset whose values every run checks before training: a .npy of MIB MiB of f32
# (2048 by default) for NaN and infinity, and a token_file of MIB MiB of uint16 tokens
# for tokens below the embedding's vocab and the classes. Each, in the page cache,
# trains one step on 1 worker and on WORKERS (default 2) local workers started by
# ddprun. The workers check a part of the values each, so a job of N reads the file
# once between them, not N times: it prints each job's wall time and its workers' CPU
# time summed, the best of three runs, and the ratios of the N workers' to the one
# worker's (the reference, measured in the same run): about 1 for the CPU time when
# the check is shared, about N when each worker checks it all.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(realpath "${1:-$root/build}")
workers=${2:-2} mib=${3:-2048}
work=$(mktemp -d "${TMPDIR:-/tmp}/ddp-bench.XXXXXX")
trap 'rm -rf "$work"' EXIT

samples=$((mib * 256)) # of 1024 f32 values (4 KiB)
echo "writing $samples samples of 1024 f32 values ($mib MiB)"
python3 - "$work" "$samples" <<'EOF'
import os, struct, sys
work, n = sys.argv[1], int(sys.argv[2])
def header(descr, shape):
    text = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    text += " " * (63 - (10 + len(text)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + len(text).to_bytes(2, "little") + text.encode()
row = struct.pack("<1024f", *[i / 1024 for i in range(1024)])
with open(f"{work}/x.npy", "wb") as f:
    f.write(header("<f4", f"({n}, 1024)"))
    for _ in range(n // 256):
        f.write(row * 256)
    f.write(row * (n % 256))
with open(f"{work}/y.npy", "wb") as f:
    f.write(header("|u1", f"({n},)") + bytes(i % 10 for i in range(n)))
tokens = struct.pack("<65536H", *[i * 7919 % 1000 for i in range(65536)])
with open(f"{work}/tokens.bin", "wb") as f:
    for _ in range(n // 32):
        f.write(tokens)
EOF
# program NAME DATASET INPUT LAYER CLASSES: NAME.ddp, a model of that input, LAYER
# (or none) and a dense layer of CLASSES trained one step on DATASET, built into NAME
program() {
    cat > "$work/$1.ddp" <<EOF
dataset data = $2

model net(input: [$3]) {
    $4
    logits: dense($5)
}

train net on data {
    batch_per_replica = 8
    loss              = sparse_categorical_crossentropy(from_logits = true)
    optimizer         = sgd(learning_rate = 0.01)
    epochs            = 1
    steps_per_epoch   = 1
}
EOF
    "$build/ddpc" build "$work/$1.ddp" -o "$work/$1"
}
program check "npy(inputs = \"$work/x.npy\", labels = \"$work/y.npy\")" 1024 "" 10
program tokens "token_file(path = \"$work/tokens.bin\", type = uint16, window = 64)" 64 "embedding(1000, 8)" 1000

# run PROGRAM WORKERS: "WALL CPU", the job's wall time and its workers' CPU time
# summed, in seconds, of the fastest of three runs
run() {
    python3 - "$work/run" "$build/ddprun" -n "$2" "$work/$1" --threads 1 --run-dir "$work/run" <<'EOF'
import resource, shutil, subprocess, sys, time
best = None
for _ in range(3):
    shutil.rmtree(sys.argv[1], ignore_errors=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.time()
    p = subprocess.run(sys.argv[2:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    wall = time.time() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode:
        sys.exit(p.stdout)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    best = (wall, cpu) if best is None or wall < best[0] else best
print("%.3f %.3f" % best)
EOF
}

cat "$work/x.npy" "$work/tokens.bin" > /dev/null # into the page cache
printf '%-8s %8s %10s %10s %12s %12s\n' data workers "wall s" "CPU s" "wall ratio" "CPU ratio"
for program in check tokens; do
    name=f32
    [ "$program" = tokens ] && name=tokens
    set -- $(run "$program" 1)
    one_wall=$1 one_cpu=$2
    printf '%-8s %8d %10.2f %10.2f\n' "$name" 1 "$one_wall" "$one_cpu"
    set -- $(run "$program" "$workers")
    printf '%-8s %8d %10.2f %10.2f %12.2f %12.2f\n' "$name" "$workers" "$1" "$2" "$(echo "$1 / $one_wall" | bc -l)" \
        "$(echo "$2 / $one_cpu" | bc -l)"
done
