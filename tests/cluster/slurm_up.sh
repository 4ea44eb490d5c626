#!/bin/sh
# slurm_up.sh: a real one-node Slurm on this machine for the tests, started if it is
# not running (munge, slurmctld, slurmd), installed first if missing and allowed
# (root, or sudo without a password). Tests use it through
# SLURM_CONF=/etc/slurm-ddp-tests/slurm.conf (with_slurm.sh sets it).
#
# It keeps to its own files and ports, so it runs beside any other Slurm of the
# machine (the one of /etc/slurm/slurm.conf included, which it never touches): its
# controller and node daemon want 6817 and 6818 (or the ports it used last), and
# take free ones from 6900-6999 when another process holds those. Every step checks
# its result and says what failed, with the end of the daemon's log. Idempotent: a
# running cluster whose `srun` works is reused.
#
# Exits 0 when up, 77 (skip) where Slurm can be neither found nor installed, 1 when
# it tried and failed. The node claims 40 CPUs (config_overrides) and 8 GPUs, so that
# 4-8 tasks fit on a small machine, and so do the sample job scripts' requests (4
# tasks of 10 CPUs and a GPU each).
set -u
unset SLURM_CONF
here=$(dirname "$0")
. "$here/slurm_conf.sh"
log() { echo "slurm_up: $*"; }

name=$one_node_name
conf=$one_node_conf
conf_dir=${conf%/*}
logs=/var/log/slurm-$name
state=/var/spool/slurmctld-$name
spool=/var/spool/slurmd-$name
ctld_pid=/run/slurmctld-$name.pid
slurmd_pid=/run/slurmd-$name.pid
host=$(hostname)
export SLURM_CONF=$conf

# The wanted config for a controller and a node port; the node has 8 stand-in GPUs
# (fake_gpus), so that `sbatch --test-only` takes GPU job scripts.
config_for() {
    cat <<EOF
# Written by tests/cluster/slurm_up.sh: the one-node test cluster.
ClusterName=$name
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$1
SlurmdPort=$2
$(slurm_common_conf)
StateSaveLocation=$state
SlurmdSpoolDir=$spool
SlurmctldPidFile=$ctld_pid
SlurmdPidFile=$slurmd_pid
SlurmctldLogFile=$logs/slurmctld.log
SlurmdLogFile=$logs/slurmd.log
NodeName=$host NodeAddr=127.0.0.1 CPUs=40 RealMemory=1000 Gres=gpu:8 State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
}

works() { timeout "${1:-30}" srun -n 1 -t 1 true >/dev/null 2>&1; }
both_alive() { alive $ctld_pid slurmctld && alive $slurmd_pid slurmd; }
# a running cluster of another config (an older version of this script) starts again
if both_alive && [ "$(cat "$conf")" = "$(config_for "$(conf_value "$conf" SlurmctldPort)" \
                                                   "$(conf_value "$conf" SlurmdPort)")" ] && works; then
    log "reusing the running cluster $name (SLURM_CONF=$conf)"
    exit 0
fi
[ "$sudo" = none ] && { log "not root and no sudo: cannot start Slurm; skipped"; exit 77; }
slurm_installed || exit $?
munge_up || exit 1

# Daemons that run but do not serve are started again, on ports checked afresh.
stop_daemon $slurmd_pid slurmd
stop_daemon $ctld_pid slurmctld
ctld_port=$(pick_port "$(conf_value "$conf" SlurmctldPort | grep . || echo 6817)" 6900 6999) ||
    { log "the controller's port: see above"; exit 1; }
slurmd_port=$(pick_port "$(conf_value "$conf" SlurmdPort | grep . || echo 6818)" 6900 6999 "$ctld_port") ||
    { log "the node daemon's port: see above"; exit 1; }

want=$(config_for "$ctld_port" "$slurmd_port")
$sudo mkdir -p "$conf_dir" "$logs" "$state" "$spool" || { log "cannot make its folders"; exit 1; }
if [ "$(cat "$conf" 2>/dev/null)" != "$want" ]; then
    printf '%s\n' "$want" | $sudo tee "$conf" >/dev/null || { log "cannot write $conf"; exit 1; }
    log "wrote $conf (controller port $ctld_port, node port $slurmd_port)"
fi
gres=$(fake_gpus "$host" 8) && echo "$gres" | $sudo tee "$conf_dir/gres.conf" >/dev/null ||
    { log "cannot write $conf_dir/gres.conf"; exit 1; }

start_daemon slurmctld $ctld_pid $logs/slurmctld.log $sudo env SLURM_CONF="$conf" slurmctld -f "$conf" || exit 1
start_daemon slurmd $slurmd_pid $logs/slurmd.log $sudo env SLURM_CONF="$conf" slurmd -f "$conf" -N "$host" || exit 1
for i in 1 2 3 4 5 6 7 8 9 10 11 12; do
    if works 20; then
        log "up: $name, SLURM_CONF=$conf, ports $ctld_port and $slurmd_port: $(sinfo -h -o '%P %D %T' 2>/dev/null)"
        exit 0
    fi
    # a node left drained by an earlier run is put back by hand (ReturnToService=2
    # brings back only a node that was down)
    [ $i -eq 3 ] && $sudo env SLURM_CONF="$conf" scontrol update nodename="$host" state=resume >/dev/null 2>&1
    sleep 2
done
log "the cluster $name did not come up: srun -n 1 true fails:"
timeout 20 srun -n 1 -t 1 true 2>&1 | tail -n 5
sinfo -N 2>&1 | tail -n 5
log_tail $logs/slurmctld.log
log_tail $logs/slurmd.log
exit 1
