#!/bin/sh
# srun.sh UNIT_CLUSTER PROGRAMS: under a real Slurm (run through with_slurm.sh), every
# task of `srun -n 1..4` resolves its own rank, the step's size, the same coordinator
# and the same port; a built program trains under `srun -n 1` and `srun -n 3`, with
# one banner and one summary, from worker 0; a data file missing on one task ends the
# step with that task's status 1 (srun gives the highest of its tasks': the others,
# which only lost it, end with its status too, not 3).
set -u
resolver=$1 programs=$2
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT
for n in 1 2 3 4; do
    # stdout only: srun itself may say on stderr that it waits for resources
    out=$(timeout 60 srun -n "$n" "$resolver" --print 2> "$root/srun.err") ||
        { fail "srun -n $n: $out $(cat "$root/srun.err")"; continue; }
    ranks=$(printf '%s\n' "$out" | sed -n 's/^slurm rank \([0-9]*\) world '"$n"' .*/\1/p' | sort -n | tr '\n' ' ')
    want=$(seq 0 $((n - 1)) | tr '\n' ' ')
    places=$(printf '%s\n' "$out" | sed 's/.* coordinator //' | sort -u | wc -l)
    if [ "$ranks" = "$want" ] && [ "$places" -eq 1 ]; then
        echo "ok: srun -n $n: ranks $ranks, one coordinator: $(printf '%s\n' "$out" | head -n 1)"
    else
        fail "srun -n $n resolved:"
        printf '%s\n' "$out"
    fi
done
printf 'x0,x1,x2,x3,label\n' > "$root/tiny.csv"
for i in $(seq 1 48); do echo "$i,0,1,2,$((i % 3))" >> "$root/tiny.csv"; done
cp "$root/tiny.csv" "$root/tiny_check.csv"
out=$(timeout 60 srun -n 1 "$programs/tiny" --data-root "$root" 2>&1)
if printf '%s\n' "$out" | grep -q "cluster     slurm: one worker on" && printf '%s\n' "$out" | grep -q "^done:"; then
    echo "ok: srun -n 1 trains"
else
    fail "srun -n 1 $programs/tiny:"
    printf '%s\n' "$out"
fi
out=$(timeout 120 srun -n 3 "$programs/tiny" --data-root "$root" --threads 1 2>&1)
if printf '%s\n' "$out" | grep -q "cluster     slurm: 3 workers on 1 node" &&
    [ "$(printf '%s\n' "$out" | grep -c "^done:")" -eq 1 ]; then
    echo "ok: srun -n 3 trains, worker 0 reporting"
else
    fail "srun -n 3 $programs/tiny:"
    printf '%s\n' "$out"
fi
# shellcheck disable=SC2016
timeout 120 srun -n 3 sh -c 'root=$1; [ "$SLURM_PROCID" = 2 ] && root=$1/missing
    exec "$0" --data-root "$root" --threads 1' "$programs/tiny" "$root" > "$root/out" 2> "$root/err"
status=$?
if [ $status -eq 1 ] && [ "$(grep -c "tiny.csv: no such file" "$root/err")" -eq 3 ] &&
    [ "$(grep -c "lost rank 2 on [^:]*: it failed: .*missing/tiny.csv: no such file" "$root/err")" -eq 2 ]; then
    echo "ok: srun -n 3, the data missing on task 2: status 1, every task saying why"
else
    fail "srun -n 3, the data missing on task 2: status $status"
    cat "$root/err"
fi
[ "$failures" -eq 0 ]
