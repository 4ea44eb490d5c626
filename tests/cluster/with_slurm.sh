#!/bin/sh
# with_slurm.sh COMMAND...: runs COMMAND with SLURM_CONF set to the one-node test
# cluster, bringing it up first with slurm_up.sh beside this file. Its skip status 77
# passes through; what it said is shown only when it did not come up, so that a skip
# or a failure says why.
here=$(dirname "$0")
. "$here/slurm_conf.sh"
quietly sh "$here/slurm_up.sh" || exit $?
SLURM_CONF=$one_node_conf
export SLURM_CONF
exec "$@"
