#!/bin/sh
# two_nodes_up.sh: a second real Slurm cluster on this machine, of two nodes n1
# (10.77.0.2) and n2 (10.77.0.3), each slurmd in its own network namespace, so that
# tests see real multi-node steps whose tasks have different addresses. It runs beside
# the one-node cluster of slurm_up.sh (started first: it provides munge and Slurm) and
# is used through SLURM_CONF=/etc/slurm-ddp2/slurm.conf (or with_two_nodes.sh).
# Idempotent: a cluster whose `srun -N 2 -n 4` works is reused. Exits 0 when up,
# 77 (skip) where it cannot be done here, 1 when it tried and failed.
#
# The nodes claim 8 CPUs each (config_overrides), so `srun -N 2 -n 4` places 3 tasks
# on n1 and 1 on n2 (SLURM_STEP_TASKS_PER_NODE=3,1); --ntasks-per-node=2 gives 2(x2).
set -u
log() { echo "two_nodes_up: $*"; }
here=$(dirname "$0")
. "$here/slurm_conf.sh"

conf_dir=/etc/slurm-ddp2
conf=$conf_dir/slurm.conf
logs=/var/log/slurm-ddp2
state=/var/spool/slurmctld-ddp2
spool=/var/spool/slurmd-ddp2
ctld_pid=/run/slurmctld-ddp2.pid
port=6827
bridge=ddpbr0
net=10.77.0
nodes="n1 n2"
addr_of() { case $1 in n1) echo $net.2 ;; n2) echo $net.3 ;; esac; }
host=$(hostname)

# The one-node cluster first (it installs Slurm and starts munge); it must test its own
# cluster, not ours, should the caller have exported SLURM_CONF.
(unset SLURM_CONF; sh "$here/slurm_up.sh" >/dev/null)
rc=$?
[ $rc -eq 77 ] && { log "no one-node Slurm (slurm_up.sh skipped): skipped"; exit 77; }
[ $rc -ne 0 ] && { log "slurm_up.sh failed ($rc): see /var/log/slurm/"; exit 1; }

# The wanted config, compared with the file on disk so that an edit of this script
# (or a stray hand edit) rewrites it and restarts the daemons. SlurmctldHost names this
# machine by its bridge address: the controller's address must be reachable from the
# namespaces (127.0.0.1 there is the node's own loopback).
want=$(cat <<EOF
# Written by tests/cluster/two_nodes_up.sh: the two-node test cluster (netns ddp-n1, ddp-n2).
ClusterName=ddp-tests2
SlurmctldHost=$host($net.1)
SlurmctldPort=$port
$(slurm_common_conf)
StateSaveLocation=$state
SlurmctldPidFile=$ctld_pid
SlurmctldLogFile=$logs/slurmctld.log
SlurmdSpoolDir=$spool/%n
SlurmdPidFile=/run/slurmd-%n.pid
SlurmdLogFile=$logs/slurmd-%n.log
NodeName=n1 NodeAddr=$net.2 CPUs=8 RealMemory=1000 State=UNKNOWN
NodeName=n2 NodeAddr=$net.3 CPUs=8 RealMemory=1000 State=UNKNOWN
PartitionName=two Nodes=n[1-2] Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
)

alive() {   # alive PIDFILE NAME: the pid file names a running process called NAME
    p=$(cat "$1" 2>/dev/null) && [ -n "$p" ] && [ "$(cat /proc/$p/comm 2>/dev/null)" = "$2" ]
}
all_alive() { alive $ctld_pid slurmctld && alive /run/slurmd-n1.pid slurmd && alive /run/slurmd-n2.pid slurmd; }
works() { SLURM_CONF=$conf timeout "${1:-30}" srun -N 2 -n 4 -t 1 true >/dev/null 2>&1; }
# Reuse needs the daemons alive first: srun to a dead controller or node gives up only
# after its retries (10-15 s).
if [ "$(cat "$conf" 2>/dev/null)" = "$want" ] && all_alive && works; then
    log "reusing the running two-node cluster (SLURM_CONF=$conf)"
    exit 0
fi
if [ "$(id -u)" -eq 0 ]; then sudo=""; elif sudo -n true 2>/dev/null; then sudo="sudo -n"; else
    log "not root and no sudo: cannot make network namespaces; skipped"; exit 77; fi
for c in ip nsenter; do
    command -v $c >/dev/null || { log "no '$c' here: skipped"; exit 77; }
done

# --- network: a bridge in the root namespace, one namespace per node on a veth pair
cant() { log "$*: cannot make the node namespaces here; skipped"; exit 77; }
ip link show $bridge >/dev/null 2>&1 || $sudo ip link add $bridge type bridge || cant "no bridge"
ip addr show dev $bridge | grep -q "inet $net.1/24" ||
    $sudo ip addr add $net.1/24 dev $bridge || cant "no address on the bridge"
$sudo ip link set $bridge up || cant "bridge will not come up"
for n in $nodes; do
    ns=ddp-$n; veth=ddpv-$n; a=$(addr_of $n)
    [ -e /run/netns/$ns ] || $sudo ip netns add $ns || cant "ip netns add $ns failed"
    if ! ip -n $ns link show ${veth}p >/dev/null 2>&1; then
        # Leftovers go first: a pair an interrupted run did not move, or the root half
        # of a pair whose namespace was deleted (the kernel frees those lazily).
        ip link show ${veth}p >/dev/null 2>&1 && $sudo ip link del ${veth}p
        ip link show $veth >/dev/null 2>&1 && $sudo ip link del $veth
        $sudo ip link add $veth type veth peer name ${veth}p || cant "no veth pair"
        $sudo ip link set ${veth}p netns $ns || cant "cannot move a veth into $ns"
    fi
    $sudo ip link set $veth master $bridge up
    $sudo ip -n $ns link set lo up
    ip -n $ns addr show dev ${veth}p | grep -q "inet $a/24" || $sudo ip -n $ns addr add $a/24 dev ${veth}p
    $sudo ip -n $ns link set ${veth}p up || cant "the veth in $ns will not come up"
done

# --- /etc/hosts: n1, n2, and this machine's hostname at the bridge address (srun asks the
# nodes to call it back at its hostname's address). Every other name and line is kept;
# the one-node cluster names its controller and node by 127.0.0.1 explicitly, so it
# does not depend on what the hostname resolves to.
tmp=$(mktemp) || exit 1
trap 'rm -f "$tmp"' EXIT
awk -v names="$host n1 n2" -v net="$net" '
    BEGIN { split(names, k, " "); for (i in k) drop[k[i]] = 1 }
    /# ddp two_nodes_up.sh$/ { next }
    /^[ \t]*(#|$)/ { print; next }
    { line = $1; rest = ""; kept = 0; dropped = 0
      for (i = 2; i <= NF; i++) {
          if ($i ~ /^#/) { for (j = i; j <= NF; j++) rest = rest " " $j; break }
          if ($i in drop) dropped++; else { line = line " " $i; kept++ } }
      if (dropped == 0) print        # lines without our names stay as they were
      else if (kept > 0) print line rest }
    END { print net ".1 " k[1] " # ddp two_nodes_up.sh"
          print net ".2 n1 # ddp two_nodes_up.sh"
          print net ".3 n2 # ddp two_nodes_up.sh" }' /etc/hosts > "$tmp" || exit 1
if ! cmp -s "$tmp" /etc/hosts; then
    [ -f /etc/hosts.before-ddp-two-nodes ] || $sudo cp /etc/hosts /etc/hosts.before-ddp-two-nodes
    # Rewritten in place (not moved over): /etc/hosts may be a bind mount.
    $sudo sh -c "cat '$tmp' > /etc/hosts" || { log "cannot write /etc/hosts"; exit 1; }
    log "/etc/hosts: $host, n1, n2 -> $net.1, .2, .3 (was saved as /etc/hosts.before-ddp-two-nodes)"
fi

# --- daemons
stop() {
    if alive "$1" "$2"; then $sudo kill "$(cat "$1")"; i=0
        while alive "$1" "$2" && [ $i -lt 20 ]; do sleep 0.5; i=$((i + 1)); done; fi
}
$sudo mkdir -p "$conf_dir" "$logs" "$state" || exit 1
if [ "$(cat "$conf" 2>/dev/null)" != "$want" ]; then
    log "writing $conf"
    stop $ctld_pid slurmctld
    for n in $nodes; do stop /run/slurmd-$n.pid slurmd; done
    printf '%s\n' "$want" | $sudo tee "$conf" >/dev/null || exit 1
fi
export SLURM_CONF=$conf
alive $ctld_pid slurmctld || $sudo env SLURM_CONF=$conf slurmctld -f $conf ||
    { log "slurmctld did not start: see $logs/slurmctld.log"; exit 1; }
for n in $nodes; do
    $sudo mkdir -p $spool/$n
    # nsenter joins only the network namespace; `ip netns exec` would also remount
    # /sys, hiding the cgroup file system slurmd wants.
    alive /run/slurmd-$n.pid slurmd ||
        $sudo env SLURM_CONF=$conf nsenter --net=/run/netns/ddp-$n slurmd -f $conf -N $n ||
        { log "slurmd $n did not start: see $logs/slurmd-$n.log"; exit 1; }
done
for i in 1 2 3 4 5 6 7 8 9 10 11 12; do
    if works 20; then
        log "up: SLURM_CONF=$conf, controller $host($net.1):$port, nodes n1 ($net.2, netns ddp-n1)" \
            "n2 ($net.3, netns ddp-n2): $(sinfo -h -o '%P %D %T' 2>/dev/null); logs in $logs/"
        exit 0
    fi
    # A node still drained or down after its slurmd came back (ReturnToService=2 brings
    # back a down node that registers, but not a drained one) is put back by hand.
    [ $i -eq 3 ] && $sudo env SLURM_CONF=$conf scontrol update nodename='n[1-2]' state=resume >/dev/null 2>&1
    sleep 2
done
log "the two-node cluster did not come up; see $logs/ and: SLURM_CONF=$conf sinfo -N"
exit 1
