#!/bin/sh
# faults.sh PROGRAMS: S12 with workers started by hand (no launcher to end the job for
# them): when one worker is killed (SIGKILL) or frozen (SIGSTOP) mid-epoch, every other
# exits with status 3 within the peer timeout, naming the rank it lost (the victim's
# neighbour names the victim; a worker further round the ring names the neighbour that
# stopped because of it); a port already in use is reported as such.
set -u
program=$1/fashion_mlp
dir=$(mktemp -d)
pids=""
trap 'kill -KILL $pids 2>/dev/null; rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
port=$(( 21000 + $$ % 9000 * 2 ))

# start_workers N: N workers of the MLP in the background, their pids in $pids
start_workers() {
    pids=""
    for rank in $(seq 0 $(($1 - 1))); do
        DDP_RANK=$rank DDP_WORLD_SIZE=$1 DDP_COORDINATOR=127.0.0.1:$port \
            "$program" --threads 1 --epochs 5 --peer-timeout 4 --rendezvous-timeout 60 \
            > "$dir/out.$rank" 2> "$dir/err.$rank" &
        pids="$pids $!"
    done
}

# the others (all but the victim, rank 1) end with 3; rank 2, which receives from it,
# names it
expect_lost() {
    what=$1 victim=$2 start=$(date +%s)
    for rank in 0 2; do
        pid=$(echo $pids | cut -d' ' -f$((rank + 1)))
        wait "$pid"
        status=$?
        took=$(( $(date +%s) - start ))
        named=1
        [ $rank -eq 0 ] && named="[12]"
        if [ $status -eq 3 ] && [ $took -le 12 ] && grep -q "lost rank $named on 127.0.0.1" "$dir/err.$rank"; then
            echo "ok: $what: rank $rank exits 3 after $took s: $(cat "$dir/err.$rank")"
        else
            fail "$what: rank $rank: status $status after $took s"
            cat "$dir/err.$rank"
        fi
    done
    kill -KILL "$victim" 2>/dev/null
    wait "$victim" 2>/dev/null
}

wait_training() { # until rank 0 has trained some steps
    for i in $(seq 1 100); do
        grep -q "step 100/" "$dir/out.0" 2>/dev/null && return 0
        sleep 0.2
    done
    fail "the workers did not start training"
    cat "$dir"/err.* "$dir"/out.0
}

# strike SIGNAL WHAT: three workers on fresh ports, rank 1 hit mid-epoch
strike() {
    port=$((port + 1000))
    start_workers 3
    wait_training
    victim=$(echo $pids | cut -d' ' -f2)
    kill -"$1" "$victim"
    expect_lost "$2" "$victim"
}

strike KILL "rank 1 killed"
strike STOP "rank 1 frozen"

port=$((port + 1000))
python3 -c "import socket, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('', $port))
s.listen()
time.sleep(30)" &
holder=$!
sleep 0.5
DDP_RANK=0 DDP_WORLD_SIZE=2 DDP_COORDINATOR=127.0.0.1:$port "$program" --rendezvous-timeout 5 > /dev/null 2> "$dir/err"
status=$?
kill "$holder"
if [ $status -eq 1 ] && grep -q "port $port: Address already in use" "$dir/err"; then
    echo "ok: a port in use: $(cat "$dir/err")"
else
    fail "a port in use: status $status"
    cat "$dir/err"
fi
[ "$failures" -eq 0 ]
