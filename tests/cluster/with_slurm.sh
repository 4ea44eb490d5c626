#!/bin/sh
# with_slurm.sh COMMAND...: runs COMMAND once a real Slurm is up on this machine
# (slurm_up.sh beside this file; its skip status 77 passes through).
sh "$(dirname "$0")/slurm_up.sh" > /dev/null || exit $?
exec "$@"
