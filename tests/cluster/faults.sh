#!/bin/sh
# faults.sh PROGRAMS: S12. Three workers of the Fashion-MNIST MLP, started by hand (no
# launcher to end the job for them) and then under srun told not to end the step
# itself (--kill-on-bad-exit=0). When one is killed (SIGKILL) or frozen (SIGSTOP)
# mid-epoch, the worker 0 that coordinates or another, every other worker exits with
# status 3 within the peer timeout, naming the lost rank, its host, its step and the
# collective it was in, and no process is left behind. A slow step is not a fault:
# a worker whose compute threads are frozen (its heartbeat thread still running) for
# twice the peer timeout holds the others up, and the job then ends well. A
# coordinator that never comes up is reported at the rendezvous timeout; a port in use
# as such.
set -u
here=$(cd "$(dirname "$0")" && pwd)
dir=$(mktemp -d)
# a copy of its own, so that looking for its processes by name never finds (or kills)
# another test's run of the same program
program=$dir/faults_mlp
cp "$1/fashion_mlp" "$program" || exit 1
pids=""
trap 'kill -KILL $pids 2>/dev/null; kill -CONT $pids 2>/dev/null; rm -rf "$dir"; sh "$here/free_ports.sh" --release $$' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
timeout=3                   # --peer-timeout in these tests
# new_port: a free port base, reserved for this test, for up to 3 workers
new_port() { port=$(sh "$here/free_ports.sh" 3 $$) || exit 1; }
export DDP_SECRET=faults-test-secret
args="--threads 1 --epochs 5 --peer-timeout $timeout --rendezvous-timeout 60"

# start_workers N [FLAGS]: N workers by hand in the background, pids in $pids
start_workers() {
    n=$1
    shift
    pids=""
    new_port
    for rank in $(seq 0 $((n - 1))); do
        # shellcheck disable=SC2086
        DDP_RANK=$rank DDP_WORLD_SIZE=$n DDP_COORDINATOR=127.0.0.1:$port "$program" $args "$@" \
            > "$dir/out.$rank" 2> "$dir/err.$rank" &
        pids="$pids $!"
    done
}

pid_of() { echo $pids | cut -d' ' -f$(($1 + 1)); }

wait_training() { # until rank 0 has trained some steps
    for i in $(seq 1 150); do
        grep -q "step 100/" "$dir/out.0" 2>/dev/null && return 0
        sleep 0.2
    done
    fail "the workers did not start training"
    cat "$dir"/err.* "$dir/out.0"
    return 1
}

# expect_lost WHAT VICTIM: every other rank exits 3 within the peer timeout (and a
# margin for a loaded machine), its message naming the victim, a step and a collective
expect_lost() {
    what=$1 victim=$2 start=$(date +%s)
    for rank in 0 1 2; do
        [ "$rank" -eq "$victim" ] && continue
        wait "$(pid_of $rank)"
        status=$? took=$(( $(date +%s) - start ))
        if [ $status -eq 3 ] && [ $took -le $((timeout + 6)) ] &&
            grep -q "rank $rank on [^:]*: step [0-9].*lost rank $victim on $(hostname)" "$dir/err.$rank"; then
            echo "ok: $what: rank $rank exits 3 after $took s: $(head -c 400 "$dir/err.$rank")"
        else
            fail "$what: rank $rank: status $status after $took s"
            cat "$dir/err.$rank"
        fi
    done
    kill -KILL "$(pid_of "$victim")" 2>/dev/null
    wait "$(pid_of "$victim")" 2>/dev/null
}

# strike SIGNAL RANK WHAT [FLAGS]: three workers, RANK hit mid-epoch
strike() {
    signal=$1 victim_rank=$2 what=$3
    shift 3
    start_workers 3 "$@"
    wait_training || return
    kill -"$signal" "$(pid_of "$victim_rank")"
    expect_lost "$what" "$victim_rank"
}

strike KILL 1 "rank 1 killed" --save "$dir/last.safetensors"
if [ -s "$dir/last.safetensors" ] && grep -q "The parameters from before it are in $dir/last.safetensors" "$dir/err.0"
then
    echo "ok: worker 0 saved the parameters from before the lost step"
else
    fail "worker 0 did not save the parameters from before the lost step"
fi
strike STOP 1 "rank 1 frozen"
strike KILL 0 "the coordinator killed"
strike STOP 0 "the coordinator frozen"

# A slow step: every thread of rank 1 but its heartbeat frozen (a cgroup v1 freezer
# takes single threads) for twice the peer timeout; the job must end well.
freezer=/sys/fs/cgroup/freezer
if [ -w "$freezer" ] && mkdir -p "$freezer/ddp-slow-$$" 2>/dev/null; then
    start_workers 3 --epochs 1
    if wait_training; then
        victim=$(pid_of 1)
        for task in /proc/"$victim"/task/*; do
            [ "$(cat "$task/comm")" = ddp-heartbeat ] || echo "${task##*/}" > "$freezer/ddp-slow-$$/tasks"
        done
        echo FROZEN > "$freezer/ddp-slow-$$/freezer.state"
        sleep $((2 * timeout))
        echo THAWED > "$freezer/ddp-slow-$$/freezer.state"
        statuses=""
        for rank in 0 1 2; do
            wait "$(pid_of $rank)"
            statuses="$statuses $?"
        done
        if [ "$statuses" = " 0 0 0" ]; then
            echo "ok: a step slowed for $((2 * timeout)) s (heartbeat alive) is not a fault: the job ends well"
        else
            fail "a slow step: statuses$statuses"
            cat "$dir"/err.*
        fi
    fi
    for t in $(cat "$freezer/ddp-slow-$$/tasks" 2>/dev/null); do echo "$t" > "$freezer/tasks"; done
    rmdir "$freezer/ddp-slow-$$"
else
    echo "skipped: a slow step (no cgroup v1 freezer to stop single threads)"
fi

# Under srun, which is told to leave the step alone when a task fails.
. "$here/slurm_conf.sh"
slurm_said=$(sh "$here/slurm_up.sh" 2>&1)
slurm_status=$?
if [ $slurm_status -eq 0 ]; then
    export SLURM_CONF=$one_node_conf
    for signal in KILL STOP; do
        new_port
        timeout 120 srun -n 3 --kill-on-bad-exit=0 "$program" $args --port-base $port \
            < /dev/null > "$dir/srun.out" 2>&1 &
        srun_pid=$!
        victim=""
        for i in $(seq 1 150); do
            grep -q "step 100/" "$dir/srun.out" && break
            sleep 0.2
        done
        for p in $(pgrep -f "$program"); do
            tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | grep -qx SLURM_PROCID=1 && victim=$p
        done
        start=$(date +%s) named=0
        [ -n "$victim" ] && kill -"$signal" "$victim"
        while [ -n "$victim" ] && [ $(( $(date +%s) - start )) -le $((timeout + 8)) ]; do
            named=$(grep -c "rank [02] on [^:]*: .*step [0-9].*lost rank 1 on" "$dir/srun.out")
            [ "$named" -eq 2 ] && break
            sleep 0.2
        done
        took=$(( $(date +%s) - start ))
        # a frozen task keeps srun's step alive: that is what the others must not wait for
        [ -n "$victim" ] && kill -KILL "$victim" 2>/dev/null
        wait $srun_pid
        status=$?
        if [ -n "$victim" ] && [ "$named" -eq 2 ] && [ $status -ne 0 ] &&
            grep -q "proven by munge" "$dir/srun.out"; then
            echo "ok: srun, rank 1 sent SIG$signal: both others name it after $took s (srun: status $status)"
        else
            fail "srun, rank 1 sent SIG$signal: victim '$victim', $named naming it after $took s, status $status"
            cat "$dir/srun.out"
        fi
    done
elif [ $slurm_status -eq 77 ]; then
    echo "skipped: the faults under srun: $slurm_said"
else
    fail "the one-node Slurm did not come up:"
    printf '%s\n' "$slurm_said"
fi
sleep 0.5
if pgrep -f "$program" > /dev/null; then
    fail "workers were left behind: $(pgrep -f "$program" | tr '\n' ' ')"
    pkill -KILL -f "$program"
fi

# A coordinator that never comes up.
start=$(date +%s)
new_port
DDP_RANK=1 DDP_WORLD_SIZE=2 DDP_COORDINATOR=127.0.0.1:$port "$program" --rendezvous-timeout 2 \
    > /dev/null 2> "$dir/err"
status=$? took=$(( $(date +%s) - start ))
if [ $status -eq 1 ] && [ $took -le 6 ] && grep -q "no coordinator (rank 0) at 127.0.0.1:$port within 2 s" "$dir/err"
then
    echo "ok: no coordinator: status 1 after $took s: $(cat "$dir/err")"
else
    fail "no coordinator: status $status after $took s"
    cat "$dir/err"
fi

new_port
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
