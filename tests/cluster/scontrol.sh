#!/bin/sh
# scontrol.sh UNIT_HOSTLIST: the host-list parser against Slurm's own
# `scontrol show hostnames`, list by list. Slurm is installed first where it is missing
# and that is allowed (slurm_conf.sh); skipped (77), saying why, where it cannot be.
set -u
parser=$1
. "$(dirname "$0")/slurm_conf.sh"
quietly slurm_installed || exit $?
conf=$(mktemp)
trap 'rm -f "$conf" "$conf.a" "$conf.b"' EXIT
# scontrol wants a configuration to start, though expanding a list reads nothing of it
host=$(hostname)
printf 'ClusterName=probe\nSlurmctldHost=%s(127.0.0.1)\nNodeName=%s CPUs=1\nPartitionName=p Nodes=%s\n' \
    "$host" "$host" "$host" > "$conf"
failures=0
for list in 'n1' 'a[01-03,07],b' 'jz[001-004,007],gpu-a' 'n[9-10]' 'x[8-12]' 'x[00-10]' 'x[998-1000]' \
            'x[098-100]' 'x[1-3]y[1-2]' 'n[1-2]-ib[3-4]' 'node-[008-011]' 'n[1,1],n1' ',a,,b c' '[1-2]' \
            'x[0-0]' 'c[0-2000]' 'r[1-2]n[01-03]g[7-8]' 'a[1-2]b[1-2]c[1-2]d[1-3]' 'a[1,3]b[1-2]-x[5-6]'; do
    SLURM_CONF=$conf scontrol show hostnames "$list" > "$conf.a" 2>&1
    "$parser" "$list" > "$conf.b" 2>&1
    if cmp -s "$conf.a" "$conf.b"; then
        echo "ok: $list ($(wc -l < "$conf.b") hosts)"
    else
        echo "FAIL: $list: scontrol and ddp differ:"
        diff "$conf.a" "$conf.b" | head -n 5
        failures=$((failures + 1))
    fi
done
[ "$failures" -eq 0 ]
