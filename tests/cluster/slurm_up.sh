#!/bin/sh
# slurm_up.sh: a real one-node Slurm on this machine for the tests, started if it is
# not running (munge, slurmctld, slurmd), installed first if missing and allowed
# (root, or sudo without a password). Idempotent: a running cluster whose `srun`
# works is reused. Exits 77 (skip) where Slurm can be neither found nor installed.
#
# The node claims 8 CPUs (config_overrides) so that 4-8 tasks fit on a small machine.
set -u
unset SLURM_CONF # this one-node cluster's own configuration
. "$(dirname "$0")/slurm_conf.sh"
log() { echo "slurm_up: $*"; }
if [ "$(id -u)" -eq 0 ]; then sudo=""; elif sudo -n true 2>/dev/null; then sudo="sudo -n"; else sudo=none; fi

works() { timeout 30 srun -n 1 -t 1 true >/dev/null 2>&1; }
if command -v srun >/dev/null && works; then
    log "reusing the running cluster"
    exit 0
fi
[ "$sudo" = none ] && { log "not root and no sudo: cannot start Slurm; skipped"; exit 77; }

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    log "installing slurm-wlm and munge"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q slurm-wlm munge >/dev/null 2>&1 ||
        { $sudo apt-get update -q >/dev/null 2>&1 &&
          DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q slurm-wlm munge >/dev/null 2>&1; } ||
        { log "could not install Slurm: skipped"; exit 77; }
fi

$sudo mkdir -p /run/munge /var/log/munge /var/lib/munge /var/spool/slurmctld /var/spool/slurmd /var/log/slurm
$sudo chown munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge/munge.key
if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    $sudo su munge -s /bin/sh -c /usr/sbin/munged
    sleep 1
fi

host=$(hostname)
conf=/etc/slurm/slurm.conf
if ! grep -q "^ClusterName=ddp-tests" "$conf" 2>/dev/null; then
    [ -f "$conf" ] && $sudo cp "$conf" "$conf.before-ddp-tests"
    $sudo tee "$conf" >/dev/null <<EOF
ClusterName=ddp-tests
SlurmctldHost=$host(127.0.0.1)
$(slurm_common_conf)
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
NodeName=$host NodeAddr=127.0.0.1 CPUs=8 RealMemory=1000 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
fi
# by pid file: the two-node cluster's daemons (two_nodes_up.sh) have the same names
alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
alive /run/slurmctld.pid || $sudo slurmctld
alive /run/slurmd.pid || $sudo slurmd
for i in 1 2 3 4 5 6 7 8 9 10; do
    works && { log "up: $(sinfo -h -o '%P %D %T' 2>/dev/null)"; exit 0; }
    sleep 2
done
log "Slurm did not come up; see /var/log/slurm/"
exit 1
