#!/bin/sh
# ddprun.sh DDPRUN PROGRAMS: the one-machine launcher. Every worker gets its rank, the
# world, the coordinator and a secret; stderr lines come prefixed with the rank; the
# first failure ends the others (even what they started) and gives ddprun's status;
# signals are passed on; bad usage is status 2. A built program trains under ddprun,
# its banner showing the learning rate and weight decays in effect for 4 workers.
# The ports ddprun picks lie outside the kernel's ephemeral range and Slurm's 10000-20000.
set -u
ddprun=$1 programs=$2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

"$ddprun" -n 3 sh -c 'echo "$DDP_RANK/$DDP_WORLD_SIZE $DDP_LOCAL_RANK/$DDP_LOCAL_WORLD_SIZE $DDP_COORDINATOR ${#DDP_SECRET}" >&2' \
    2> "$dir/err"
status=$?
sort "$dir/err" > "$dir/sorted"
port=$(sed -n 's/.*127\.0\.0\.1:\([0-9]*\).*/\1/p' "$dir/sorted" | sort -u)
printf '[rank 0] 0/3 0/3 127.0.0.1:%s 32\n[rank 1] 1/3 1/3 127.0.0.1:%s 32\n[rank 2] 2/3 2/3 127.0.0.1:%s 32\n' \
    "$port" "$port" "$port" > "$dir/want"
range=$(cat /proc/sys/net/ipv4/ip_local_port_range)
eph_lo=${range%%[!0-9]*} eph_hi=${range##*[!0-9]}
if [ $status -eq 0 ] && [ "$(echo "$port" | wc -l)" -eq 1 ] && cmp -s "$dir/sorted" "$dir/want" &&
    [ "$port" -ge 20000 ] && { [ $((port + 2)) -lt "$eph_lo" ] || [ "$port" -gt "$eph_hi" ]; }; then
    echo "ok: three workers with their variables, stderr prefixed, ports $port-$((port + 2))"
else
    fail "the workers' variables (status $status):"
    cat "$dir/err"
fi

start=$(date +%s)
"$ddprun" -n 3 sh -c 'if [ "$DDP_RANK" = 1 ]; then exit 5; fi; sleep 60' 2> "$dir/err"
status=$? took=$(( $(date +%s) - start ))
if [ $status -eq 5 ] && [ $took -lt 10 ] && grep -q "worker 1 exited with status 5; stopping the others" "$dir/err"; then
    echo "ok: a failure ends the others in ${took} s, status 5"
else
    fail "after a failure: status $status in $took s"
    cat "$dir/err"
fi

# status 3 (a worker lost another) gives way to the failure that caused it, which gets
# the grace period to end on its own; a worker that never ends is stopped after it
start=$(date +%s)
"$ddprun" -n 3 sh -c 'case $DDP_RANK in 0) exit 3;; 1) sleep 1; exit 1;; esac; sleep 60' 2> "$dir/err"
status=$? took=$(( $(date +%s) - start ))
[ $status -eq 1 ] && [ $took -lt 5 ] && grep -q "worker 0 exited with status 3 (it lost another); stopping the others" "$dir/err" &&
    echo "ok: a worker that lost another gives way to the one that failed: status 1" ||
    fail "after a 3 and a 1: status $status in $took s"
start=$(date +%s)
"$ddprun" -n 2 --grace 1 sh -c 'if [ "$DDP_RANK" = 0 ]; then exit 3; fi; trap "" TERM; sleep 60' 2> "$dir/err"
status=$? took=$(( $(date +%s) - start ))
[ $status -eq 3 ] && [ $took -ge 1 ] && [ $took -lt 10 ] && echo "ok: a 3 alone stays 3, the others killed in ${took} s" ||
    fail "a 3 alone: status $status in $took s"

"$ddprun" -n 2 sh -c 'if [ "$DDP_RANK" = 0 ]; then kill -KILL $$; fi; sleep 60' 2> "$dir/err"
status=$?
[ $status -eq 137 ] && echo "ok: a worker killed by SIGKILL gives 137" || fail "SIGKILL: status $status"

"$ddprun" -n 2 sh -c 'trap "echo stopping >&2; exit 9" TERM; echo ready >&2; while :; do sleep 0.1; done' \
    2> "$dir/err" &
launcher=$!
for i in $(seq 1 100); do # until both workers have set their trap, however loaded the machine
    [ "$(grep -c "\] ready$" "$dir/err")" -eq 2 ] && break
    sleep 0.1
done
kill -TERM $launcher
wait $launcher
status=$?
# once each: a worker ending on the signal passed on is no failure that signals the others again
if [ $status -eq 9 ] && [ "$(grep -c "\] stopping$" "$dir/err")" -eq 2 ] && ! grep -q "stopping the others" "$dir/err"; then
    echo "ok: SIGTERM reaches every worker once"
else
    fail "SIGTERM: status $status"
    cat "$dir/err"
fi

"$ddprun" -n 2 "$dir/no-such-program" 2> "$dir/err"
status=$?
[ $status -eq 127 ] && grep -q "cannot run" "$dir/err" && echo "ok: a missing program is 127" ||
    fail "a missing program: status $status"
for args in "" "-n 0 true" "-n x true" "-n 2" "--bogus -n 2 true"; do
    # shellcheck disable=SC2086
    "$ddprun" $args > /dev/null 2>&1
    status=$?
    [ $status -eq 2 ] && echo "ok: ddprun $args -> 2" || fail "ddprun $args: status $status"
done

printf 'x0,x1,x2,x3,label\n' > "$dir/tiny.csv"
for i in $(seq 1 32); do echo "$i,0,1,2,$((i % 3))" >> "$dir/tiny.csv"; done
cp "$dir/tiny.csv" "$dir/tiny_check.csv"
"$ddprun" -n 2 "$programs/tiny" --data-root "$dir" --threads 1 > "$dir/out" 2> "$dir/err"
status=$?
if [ $status -eq 0 ] && grep -q "cluster     env: 2 workers on 1 node" "$dir/out" && [ "$(grep -c '^done:' "$dir/out")" -eq 1 ]
then
    echo "ok: a built program trains with 2 workers, worker 0 reporting"
else
    fail "a built program under ddprun: status $status"
    cat "$dir/out" "$dir/err"
fi
# the figures in effect: `0.025 * replicas` with 4 workers is 0.1, in the banner and in training, and
# each group's weight decay
"$ddprun" -n 4 "$programs/tiny_scaled" --data-root "$dir" --threads 1 --metrics "$dir/m.json" > "$dir/out" 2> "$dir/err"
status=$?
lr=$(sed -n 's/.*"lr": \([^,]*\),.*/\1/p' "$dir/m.json")
if [ $status -eq 0 ] && grep -q "sgd, learning rate 0.1, weight decay 0.004 (biases 0.002, normalisations 0.004)" "$dir/out" &&
    awk -v lr="$lr" 'BEGIN { exit !(lr != "" && lr - 0.1 < 1e-12 && 0.1 - lr < 1e-12) }'; then
    echo "ok: 4 workers: $(grep -o "sgd, learning rate .*" "$dir/out"); the metrics say $(grep -o '"lr": [^,]*' "$dir/m.json")"
else
    fail "the learning rate in effect with 4 workers: status $status"
    cat "$dir/out" "$dir/err" "$dir/m.json"
fi
"$ddprun" -n 4 "$programs/tiny_cosine" --data-root "$dir" --threads 1 > "$dir/out" 2> "$dir/err"
status=$?
if [ $status -eq 0 ] && grep -q "sgd, learning rate 0.1 (cosine schedule's peak)" "$dir/out"; then
    echo "ok: 4 workers: $(grep -o "sgd, learning rate .*" "$dir/out")"
else
    fail "a schedule's peak with 4 workers: status $status"
    cat "$dir/out" "$dir/err"
fi
[ "$failures" -eq 0 ]
