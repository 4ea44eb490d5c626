#!/bin/sh
# two_nodes.sh UNIT_CLUSTER PROGRAMS: a real two-node Slurm (n1 and n2, each in its own
# network namespace, run through with_two_nodes.sh). `srun -N 2 -n 4` puts ranks 0-2
# on n1 and rank 3 on n2, each resolving its place; a built program trains there
# with the rendezvous and the ring crossing the two addresses, and N workers x B
# train exactly as one worker x N B (tests/cluster/equivalence.py), with 4 workers
# on 3 + 1 and 3 workers on 2 + 1; and 3 workers placed in turn (srun -m cyclic).
set -u
resolver=$1 programs=$2
here=$(cd "$(dirname "$0")" && pwd)
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

out=$(timeout 60 srun -N 2 -n 4 "$resolver" --print 2> "$dir/err" | sort)
want="slurm rank 0 world 4 local 0/3 node 0/2 host n1
slurm rank 1 world 4 local 1/3 node 0/2 host n1
slurm rank 2 world 4 local 2/3 node 0/2 host n1
slurm rank 3 world 4 local 0/1 node 1/2 host n2"
if [ "$(printf '%s\n' "$out" | sed 's/ coordinator .*//')" = "$want" ] &&
    [ "$(printf '%s\n' "$out" | sed 's/.* coordinator n1:/n1:/' | sort -u | wc -l)" -eq 1 ]; then
    echo "ok: srun -N 2 -n 4: ranks 0-2 on n1, rank 3 on n2, one coordinator on n1"
else
    fail "srun -N 2 -n 4 resolved:"
    printf '%s\n' "$out"
    cat "$dir/err"
fi

printf 'x0,x1,x2,x3,label\n' > "$dir/tiny.csv"
for i in $(seq 1 48); do echo "$i,0,1,2,$((i % 3))" >> "$dir/tiny.csv"; done
cp "$dir/tiny.csv" "$dir/tiny_check.csv"
timeout 120 srun -N 2 -n 4 "$programs/tiny" --data-root "$dir" --threads 1 > "$dir/out" 2>&1
status=$?
if [ $status -eq 0 ] && grep -q "cluster     slurm: 4 workers on 2 nodes, this one rank 0 on n1" "$dir/out" &&
    grep -q "proven by munge" "$dir/out" && [ "$(grep -c '^done:' "$dir/out")" -eq 1 ]; then
    echo "ok: a built program trains on 2 nodes: $(grep 'cluster ' "$dir/out")"
else
    fail "srun -N 2 -n 4 $programs/tiny: status $status"
    cat "$dir/out"
fi

# Ranks placed in turn (-m cyclic: 0 and 2 on n1, 1 on n2): rank 1 on n2 dials rank 2
# on n1, which reached the coordinator through loopback; the table must give n1's
# address for it, not 127.0.0.1
timeout 120 srun -N 2 -n 3 -m cyclic "$programs/tiny" --data-root "$dir" --threads 1 > "$dir/out" 2>&1
status=$?
if [ $status -eq 0 ] && grep -q "cluster     slurm: 3 workers on 2 nodes, this one rank 0 on n1" "$dir/out" &&
    [ "$(grep -c '^done:' "$dir/out")" -eq 1 ]; then
    echo "ok: ranks placed in turn on 2 nodes train: $(grep 'cluster ' "$dir/out")"
else
    fail "srun -N 2 -n 3 -m cyclic $programs/tiny: status $status"
    cat "$dir/out"
fi

python3 "$here/equivalence.py" "$programs" srun -N 2 -n || failures=$((failures + 1))
[ "$failures" -eq 0 ]
