#!/bin/sh
# nccl_faults.sh PROGRAMS STANDIN: S12 with NCCL. Four workers on the emulated device,
# summing their gradients through the tests' stand-in NCCL (the folder STANDIN), started
# by hand. Each fault the stand-in can inject into one rank's collective (a hang, a
# remote error, a call that stays in progress, a hang whose abort hangs too) and a kill
# -9 of one worker mid-run end every worker (every survivor) with status 3 within the
# peer timeout and the watchdog's margins, each message naming its rank, host and step
# and the collective, or the lost rank; the same kill of one of two workers of two GPUs
# each (gpus_per_worker = 2) ends the other's two replicas; no process is left behind.
set -u
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
program=$dir/nccl_faults_mlp # its own copy: a search for its processes finds no other test's
cp "$1/equivalence_16_nccl" "$program" || exit 1
cp "$1/equivalence_16_nccl_g2" "$dir/nccl_faults_mlp_g2" || exit 1
pids=""
trap 'kill -KILL $pids 2>/dev/null; rm -rf "$dir"; sh "$here/free_ports.sh" --release $$' EXIT
export DDP_SECRET=nccl-faults-secret DDP_CUDA_LIBRARY_PATH=$2
unset DDP_STANDIN_NCCL_FAULT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
timeout=4                   # --peer-timeout in these tests
# the watchdog waits up to 2 s for the coordinator's word; a loaded machine is slow to
# start four emulated GPUs and reach the fault; a hung abort is given 5 s more
margin=12
args="--device emulated --threads 1 --epochs 400 --peer-timeout $timeout --rendezvous-timeout 60"

# start_workers [VAR=VALUE...]: $workers workers of $program by hand in the background,
# pids in $pids
workers=4
start_workers() {
    pids=""
    port=$(sh "$here/free_ports.sh" 4 $$) || exit 1
    for rank in $(seq 0 $((workers - 1))); do
        # shellcheck disable=SC2086
        env "$@" DDP_RANK=$rank DDP_WORLD_SIZE=$workers DDP_COORDINATOR=127.0.0.1:$port "$program" $args \
            --run-dir "$dir/run$port" > "$dir/out.$rank" 2> "$dir/err.$rank" &
        pids="$pids $!"
    done
}

pid_of() { echo $pids | cut -d' ' -f$(($1 + 1)); }

# expect_ended WHAT SKIP PATTERN LIMIT: every rank but SKIP exits 3 within LIMIT
# seconds, its stderr matching PATTERN (RANK in it replaced by its rank)
expect_ended() {
    what=$1 skip=$2 pattern=$3 limit=$4 start=$(date +%s)
    for rank in 0 1 2 3; do
        [ "$rank" -eq "$skip" ] && continue
        wait "$(pid_of $rank)"
        status=$? took=$(( $(date +%s) - start ))
        want=$(echo "$pattern" | sed "s/RANK/$rank/g")
        if [ $status -eq 3 ] && [ $took -le "$limit" ] && grep -q "$want" "$dir/err.$rank"; then
            echo "ok: $what: rank $rank exits 3 after $took s: $(grep -m1 "$want" "$dir/err.$rank" | head -c 500)"
        else
            fail "$what: rank $rank: status $status after $took s (wanted 3 within $limit s, matching $want)"
            cat "$dir/err.$rank"
        fi
    done
}

named="rank RANK on [^:]*: .*NCCL, during the all-reduce of gradient bucket [12] of 2 in step [0-9]"
for fault in hang remote-error in-progress abort-hang; do
    start_workers DDP_STANDIN_NCCL_FAULT=$fault@5:1
    grace=0
    [ "$fault" = abort-hang ] && grace=5
    expect_ended "$fault in rank 1's collective" -1 "$named" $((timeout + margin + grace))
    [ "$fault" = abort-hang ] && ! grep -q "ncclCommAbort did not return within" "$dir/err.1" &&
        fail "abort-hang: rank 1 does not say its abort hung" && cat "$dir/err.1"
done

# a worker killed mid-run: the others name it
start_workers
for i in $(seq 1 300); do
    grep -q "epoch 8/" "$dir/out.0" 2>/dev/null && break
    sleep 0.2
done
grep -q "epoch 8/" "$dir/out.0" || { fail "the workers did not start training"; cat "$dir"/err.*; }
kill -KILL "$(pid_of 2)"
expect_ended "kill -9 of rank 2" 2 "rank RANK on [^:]*: .*lost rank 2 on $(hostname)" $((timeout + margin))
wait "$(pid_of 2)" 2>/dev/null

# two workers of two GPUs each: worker 1 killed, worker 0's replicas 0 and 1 name one of its two
program=$dir/nccl_faults_mlp_g2 workers=2
start_workers
for i in $(seq 1 300); do
    grep -q "epoch 8/" "$dir/out.0" 2>/dev/null && break
    sleep 0.2
done
kill -KILL "$(pid_of 1)"
start=$(date +%s)
wait "$(pid_of 0)"
status=$? took=$(( $(date +%s) - start ))
for replica in 0 1; do
    grep -q "rank $replica on [^:]*: .*lost rank [23] on $(hostname)" "$dir/err.0" ||
        { fail "2 x 2 GPUs: replica $replica does not name a lost replica of worker 1"; cat "$dir/err.0"; }
done
if [ $status -eq 3 ] && [ $took -le $((timeout + margin)) ]; then
    echo "ok: kill -9 of worker 1 of 2 x 2 GPUs: worker 0 exits 3 after $took s"
else
    fail "2 x 2 GPUs: worker 0: status $status after $took s"
    cat "$dir/err.0"
fi
wait "$(pid_of 1)" 2>/dev/null

sleep 1
left=$(pgrep -f "$dir/nccl_faults_mlp" | wc -l)
[ "$left" -eq 0 ] || fail "$left worker processes left behind"
[ $failures -eq 0 ] && echo "all NCCL faults end the job" && exit 0
exit 1
