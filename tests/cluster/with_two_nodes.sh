#!/bin/sh
# with_two_nodes.sh COMMAND...: runs COMMAND with SLURM_CONF set to the two-node test
# cluster (nodes n1, n2 in network namespaces), bringing it up first with
# two_nodes_up.sh beside this file. Its skip status 77 passes through; its messages are
# shown (on stderr) only when it did not come up, so that a skip or failure says why.
out=$(sh "$(dirname "$0")/two_nodes_up.sh" 2>&1)
rc=$?
[ $rc -ne 0 ] && { printf '%s\n' "$out" >&2; exit $rc; }
SLURM_CONF=/etc/slurm-ddp2/slurm.conf
export SLURM_CONF
exec "$@"
