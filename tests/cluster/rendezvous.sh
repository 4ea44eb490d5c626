#!/bin/sh
# rendezvous.sh PROGRAMS: the job's forming, with workers started by hand. Every worker
# must prove it holds the job's secret; a stray or malformed connection to the
# coordinator is refused and logged and the job forms all the same; workers that run
# another program, other flags, or claim one rank twice are refused, every worker
# told the same; a worker whose data fails tells the others, who stop at once instead
# of waiting for the rendezvous timeout; proxy variables play no part (S15);
# --interface picks the address the others use. Strays that hold their connection,
# or flood the coordinator, delay no one for long; a coordinator's port that accepts
# and never answers ends in the rendezvous timeout; a worker lost before the job
# formed is named to the others; workers whose initial parameters differ are all
# told which. A worker refused at start (its settings, its command line) tells the
# others at once; no wait at the rendezvous is silent.
set -u
programs=$1
here=$(dirname "$0")
dir=$(mktemp -d)
pids=""
trap 'kill -KILL $pids 2>/dev/null; rm -rf "$dir"; sh "$here/free_ports.sh" --release $$' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
printf 'x0,x1,x2,x3,label\n' > "$dir/tiny.csv"
for i in $(seq 1 48); do echo "$i,0,1,2,$((i % 3))" >> "$dir/tiny.csv"; done
cp "$dir/tiny.csv" "$dir/tiny_check.csv"
mkdir "$dir/empty"
export DDP_SECRET=rendezvous-test

# worker RANK WORLD [VAR=VALUE...] [-- PROGRAM] [FLAGS...]: one worker in the background
worker() {
    rank=$1 world=$2 program=$programs/tiny
    shift 2
    vars=""
    while [ $# -gt 0 ] && [ "${1#*=}" != "$1" ] && [ "${1#-}" = "$1" ]; do vars="$vars $1"; shift; done
    [ "${1:-}" = "--" ] && { program=$2; shift 2; }
    # shellcheck disable=SC2086
    env DDP_RANK=$rank DDP_WORLD_SIZE=$world DDP_COORDINATOR=127.0.0.1:$port $vars "$program" --data-root "$dir" \
        --threads 1 --rendezvous-timeout 4 --peer-timeout 3 "$@" > "$dir/out.$rank" 2> "$dir/err.$rank" &
    pids="$pids $!"
}

# finish N: waits for the job's N workers; their statuses in $statuses
finish() {
    statuses=""
    for p in $pids; do
        wait "$p"
        statuses="$statuses $?"
    done
    pids=""
    statuses=${statuses# }
}

# check WHAT STATUSES RANK PATTERN: the statuses, and rank's stderr saying PATTERN
check() {
    if [ "$statuses" = "$2" ] && grep -q -- "$4" "$dir/err.$3"; then
        echo "ok: $1: statuses $statuses; rank $3: $(grep -m 1 -- "$4" "$dir/err.$3" | cut -c1-300)"
    else
        fail "$1: statuses $statuses (wanted $2), rank $3 not saying \"$4\":"
        cat "$dir"/err.*
    fi
}

# next_job: a new port base, free and reserved, for a job of up to 3 workers
next_job() {
    port=$(sh "$here/free_ports.sh" 3 $$) || exit 1
    rm -f "$dir"/err.* "$dir"/out.*
}

next_job
worker 0 2 --epochs 2
worker 1 2 --epochs 3
finish
check "other flags" "1 1" 1 "the job cannot start: rank 1 on $(hostname) runs with epochs = 3, and rank 0 on $(hostname) with epochs = 2"

# worker 0 alone gathering predictions would wait for the others forever
next_job
worker 0 2 --predict "$dir/p.npy"
worker 1 2 --evaluate
finish
check "--predict on one worker only" "1 1" 1 "the job cannot start: rank 1 on $(hostname) runs with predict = no, and rank 0 on $(hostname) with predict = yes"

# a worker that only checks would leave the others training without it
next_job
worker 0 2
worker 1 2 --check
finish
check "--check on one worker only" "1 1" 1 "the job cannot start: rank 1 on $(hostname) runs with check = yes, and rank 0 on $(hostname) with check = no"

# a job mixing a GPU replica and a CPU one cannot start, whoever comes first
next_job
worker 0 2 --device emulated
worker 1 2 --device cpu
finish
check "a GPU and a CPU replica" "1 1" 1 "the job cannot start: rank 1 on $(hostname) runs with device = cpu, and rank 0 on $(hostname) with device = emulated"

next_job
worker 0 2
worker 1 2 -- "$programs/tiny_env"
finish
check "another program" "1 1" 0 "rank 1 on $(hostname) runs another program (hash [0-9a-f]*) than rank 0"

next_job
worker 0 3
worker 1 3
worker 1 3
sleep 1 # both claims come before the job is whole
worker 2 3
finish
check "one rank claimed twice" "1 1 1 1" 0 "two workers claim rank 1"

next_job
worker 0 2
worker 1 2 DDP_SECRET=another
finish
check "another secret (the intruder)" "1 1" 1 "the coordinator at 127.0.0.1:$port: it did not accept this worker's proof"
check "another secret (the coordinator)" "1 1" 0 "refused a connection from 127.0.0.1:[0-9]*: its proof does not match"
check "another secret (the rendezvous)" "1 1" 0 "not every worker joined within 4 s (--rendezvous-timeout): missing rank 1"

# strays at the coordinator's port before the second worker comes: an HTTP request, a
# frame from another version, a frame of 2 GB, a connection that says nothing
next_job
worker 0 2 --epochs 2
python3 - "$port" <<'EOF'
import socket, struct, sys, time
port = int(sys.argv[1])
def knock(data):
    for _ in range(100):
        try:
            s = socket.create_connection(("127.0.0.1", port))
            break
        except OSError:
            time.sleep(0.05)
    s.sendall(data)
    return s
strays = [knock(b""), knock(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
          knock(struct.pack("<IHHII", 0x77504444, 99, 2, 16, 0) + b"x" * 16),
          knock(struct.pack("<IHHII", 0x77504444, 1, 2, 2**31, 0))]
time.sleep(0.5)
EOF
worker 1 2 http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9 all_proxy=socks5://127.0.0.1:9 \
    HTTP_PROXY=http://127.0.0.1:9 no_proxy=none --epochs 2
finish
check "strays refused, the job formed (and proxies ignored)" "0 0" 0 "refused a connection from 127.0.0.1:[0-9]*: it does not speak ddp's protocol"
check "a frame from another version" "0 0" 0 "it speaks another version of ddp's protocol"
check "a frame too large" "0 0" 0 "it sent a frame larger than allowed"
grep -q "^done:" "$dir/out.0" || fail "strays: worker 0 did not finish training"

# strays that hold their connection: silent ones and one that sends half a frame, all
# kept open for 30 s. The job forms and ends without them: worker 0 cuts their
# handshakes short when it stops.
next_job
python3 - "$port" 30 <<'EOF' &
import socket, struct, sys, time
port, hold = int(sys.argv[1]), float(sys.argv[2])
def knock():
    for _ in range(100):
        try:
            return socket.create_connection(("127.0.0.1", port))
        except OSError:
            time.sleep(0.05)
strays = [knock() for _ in range(3)]
strays[2].sendall(struct.pack("<IHHII", 0x77504444, 1, 2, 64, 0) + b"x" * 10)
time.sleep(hold)
EOF
holder=$!
sleep 0.5
start=$(date +%s)
worker 0 2 --epochs 2
worker 1 2 --epochs 2
finish
took=$(( $(date +%s) - start ))
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null
check "strays holding their connections open (the job done after $took s)" "0 0" 0 \
    "refused a connection from 127.0.0.1:[0-9]*: a frame cut short"
[ "$took" -le 5 ] || fail "the workers took $took s, held up by strays that never finish their handshake"

# a flood: more silent connections than the coordinator proves at once. The worker
# that comes after them waits its turn, and the job forms.
next_job
worker 0 2 --epochs 2 --rendezvous-timeout 15
python3 - "$port" 20 <<'EOF' &
import socket, sys, time
port, hold = int(sys.argv[1]), float(sys.argv[2])
strays = []
for _ in range(70):
    for _ in range(100):
        try:
            strays.append(socket.create_connection(("127.0.0.1", port)))
            break
        except OSError:
            time.sleep(0.05)
time.sleep(hold)
EOF
holder=$!
sleep 1
worker 1 2 --epochs 2 --rendezvous-timeout 15
finish
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null
check "a flood of silent connections (the job forms)" "0 0" 0 \
    "64 connections are proving that they belong to the job; the next wait their turn"

# the coordinator's port held by something that accepts and never speaks: the worker
# gives up at its rendezvous timeout
next_job
python3 - "$port" 10 <<'EOF' &
import socket, sys, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1])))
s.listen()
held = s.accept()
time.sleep(float(sys.argv[2]))
EOF
holder=$!
sleep 0.5
start=$(date +%s)
worker 1 2
finish
took=$(( $(date +%s) - start ))
kill "$holder" 2>/dev/null
wait "$holder" 2>/dev/null
check "a silent coordinator (after $took s)" "1" 1 "the coordinator at 127.0.0.1:$port: no answer in time"
[ "$took" -le 8 ] || fail "a silent coordinator held the worker $took s (--rendezvous-timeout 4)"

# a worker lost after it joined, before the last one came: the others hear of it
next_job
worker 0 3
worker 1 3
sleep 1.5
kill -KILL "$(echo $pids | cut -d' ' -f2)"
worker 2 3
finish
check "rank 1 killed before the job formed (rank 0)" "3 137 3" 0 "lost rank 1 on $(hostname)"
check "rank 1 killed before the job formed (rank 2)" "3 137 3" 2 "lost rank 1 on $(hostname)"

# different --load files: the parameters differ at the start (S5); each side is told
"$programs/tiny" --data-root "$dir" --threads 1 --epochs 0 --save "$dir/a.safetensors" > /dev/null 2>&1
"$programs/tiny" --data-root "$dir" --threads 1 --epochs 1 --save "$dir/b.safetensors" > /dev/null 2>&1
next_job
worker 0 2 --load "$dir/a.safetensors"
worker 1 2 --load "$dir/b.safetensors"
finish
check "different --load files (rank 0)" "1 1" 0 "at the start, the parameters of rank 1 differ from worker 0's"
check "different --load files (rank 1)" "1 1" 1 \
    "at the start, this worker's parameters (hash [0-9a-f]*) differ from worker 0's ([0-9a-f]*): every worker needs"

next_job
worker 0 2
worker 1 2 --data-root "$dir/empty"
start=$(date +%s)
finish
took=$(( $(date +%s) - start ))
check "data missing on rank 1 (rank 1)" "1 1" 1 "tiny.csv: no such file"
check "data missing on rank 1 (rank 0, after $took s)" "1 1" 0 "lost rank 1 on $(hostname): it failed: .*tiny.csv: no such file"
[ "$took" -le 3 ] || fail "the others waited $took s for a worker that had failed"

# refused before the rendezvous, for settings this runtime cannot honour or for its
# command line: the others hear why at once, and end with the refused worker's status
# (so srun, which gives the highest of its tasks', says what happened, not 3)
# refused_at_start WHAT STATUSES PATTERN RANK1_ARGS...: rank 1 is refused before it
# joins; rank 0 hears why within moments
refused_at_start() {
    what=$1 want=$2 pattern=$3
    shift 3
    next_job
    worker 0 2 --rendezvous-timeout 60
    worker 1 2 "$@"
    start=$(date +%s)
    finish
    took=$(( $(date +%s) - start ))
    check "$what (rank 0, after $took s)" "$want" 0 "lost rank 1 on $(hostname): it failed: $pattern"
    [ "$took" -le 3 ] || fail "the others waited $took s for a worker refused at start ($what)"
}
refused_at_start "settings refused on rank 1" "1 1" \
    "precision = bf16 runs on a GPU (compute capability 8.0 or later), but this worker trains on the CPU" \
    -- "$programs/tiny_bf16" --rendezvous-timeout 60
refused_at_start "a command line refused on rank 1" "2 2" \
    "its command line was refused: unknown option \`--epocs\`" --rendezvous-timeout 60 --epocs 3

# no silent waits: the coordinator says whom it waits for, the others that they wait
# (every fifth of a short rendezvous timeout, every 30 s at most)
next_job
worker 0 3 --rendezvous-timeout 5
worker 1 3 --rendezvous-timeout 5
finish
check "rank 0 says whom it waits for" "1 1" 0 "waiting for rank 2 to join (2 of 3 have, [0-9]* s of the 5 s"
check "rank 1 says it waits for the others" "1 1" 1 "waiting for the other workers to join: [0-9]* s so far"
next_job
worker 1 2 --rendezvous-timeout 4
finish
check "a worker says it waits for its coordinator" "1" 1 \
    "waiting for the coordinator (rank 0) at 127.0.0.1:$port: [0-9]* s of the 4 s --rendezvous-timeout"

next_job
worker 0 2 --interface lo
worker 1 2 --interface lo
finish
if [ "$statuses" = "0 0" ]; then echo "ok: --interface lo"; else fail "--interface lo: $statuses"; cat "$dir"/err.*; fi
# Slurm's node names are its own and need not resolve: the workers on the
# coordinator's node reach it through loopback
next_job
for rank in 0 1; do
    env -u DDP_RANK -u DDP_WORLD_SIZE -u DDP_COORDINATOR SLURM_JOB_ID=7 SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=2 \
        SLURM_NODEID=0 SLURM_STEP_TASKS_PER_NODE=2 SLURM_STEP_NODELIST=ddp-unresolvable-node SLURM_PROCID=$rank \
        SLURM_LOCALID=$rank "$programs/tiny" --data-root "$dir" --threads 1 --rendezvous-timeout 4 --port-base "$port" \
        > "$dir/out.$rank" 2> "$dir/err.$rank" &
    pids="$pids $!"
done
finish
if [ "$statuses" = "0 0" ] && grep -q "slurm: 2 workers on 1 node, this one rank 0 on ddp-unresolvable-node" "$dir/out.0"; then
    echo "ok: a Slurm node name that does not resolve"
else
    fail "a Slurm node name that does not resolve: statuses $statuses"
    cat "$dir"/out.* "$dir"/err.*
fi
next_job
worker 0 2 --interface ddp-no-such-if
worker 1 2 --interface ddp-no-such-if
finish
check "--interface that is not there" "1 1" 0 "--interface ddp-no-such-if: this machine has no such interface with an IPv4 address (it has lo"
[ "$failures" -eq 0 ]
