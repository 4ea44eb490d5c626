#!/bin/sh
# with_two_nodes.sh COMMAND...: runs COMMAND with SLURM_CONF set to the two-node test
# cluster (nodes n1, n2 in network namespaces), bringing it up first with
# two_nodes_up.sh beside this file. Its skip status 77 passes through; what it said is
# shown only when it did not come up, so that a skip or a failure says why.
here=$(dirname "$0")
. "$here/slurm_conf.sh"
quietly sh "$here/two_nodes_up.sh" || exit $?
SLURM_CONF=$two_nodes_conf
export SLURM_CONF
exec "$@"
