#!/bin/sh
# two_nodes_up.sh: a real Slurm cluster of two nodes on this machine, n1 (10.77.0.2)
# and n2 (10.77.0.3), each slurmd in its own network namespace joined to a bridge
# (10.77.0.1), so that tests see real multi-node steps whose tasks have different
# addresses. Tests use it through SLURM_CONF=/etc/slurm-ddp-tests2/slurm.conf (or
# with_two_nodes.sh). It keeps to its own files, runs beside any other Slurm of the
# machine, and needs no other cluster: its controller wants port 6827 (or the one it
# used last) and takes a free one from 6900-6999 when another process holds it.
#
# Every step checks its result and says what failed (the end of the daemon's log,
# the process holding a port, the interface already on the subnet). Idempotent: a
# cluster whose `srun -N 2 -n 4` works is reused. Exits 0 when up, 77 (skip) where it
# cannot be done here, 1 when it tried and failed.
#
# The nodes claim 8 CPUs each (config_overrides), so `srun -N 2 -n 4` places 3 tasks
# on n1 and 1 on n2 (SLURM_STEP_TASKS_PER_NODE=3,1); --ntasks-per-node=2 gives 2(x2).
set -u
unset SLURM_CONF
here=$(dirname "$0")
. "$here/slurm_conf.sh"
log() { echo "two_nodes_up: $*"; }

name=$two_nodes_name
conf=$two_nodes_conf
conf_dir=${conf%/*}
net=${DDP_SLURM_TWO_NET:-10.77.0}
tag=${DDP_SLURM_TWO_TAG:-ddp}             # in the bridge's, namespaces' and veths' names
nodes=${DDP_SLURM_TWO_NODES:-n1 n2}
bridge=${tag}br0
logs=/var/log/slurm-$name
state=/var/spool/slurmctld-$name
spool=/var/spool/slurmd-$name
ctld_pid=/run/slurmctld-$name.pid
node_pid() { echo "/run/slurmd-$name-$1.pid"; }
first=${nodes%% *} second=${nodes##* }
addr_of() { if [ "$1" = "$first" ]; then echo "$net.2"; else echo "$net.3"; fi; }
host=$(hostname)
export SLURM_CONF=$conf

# The wanted config for a controller port. SlurmctldHost names this machine by its
# bridge address: the controller's address must be reachable from the namespaces
# (127.0.0.1 there is the node's own loopback).
config_for() {
    cat <<EOF
# Written by tests/cluster/two_nodes_up.sh: a two-node test cluster (netns $tag-$first, $tag-$second).
ClusterName=$name
SlurmctldHost=$host($net.1)
SlurmctldPort=$1
$(slurm_common_conf)
StateSaveLocation=$state
SlurmctldPidFile=$ctld_pid
SlurmctldLogFile=$logs/slurmctld.log
SlurmdSpoolDir=$spool/%n
SlurmdPidFile=/run/slurmd-$name-%n.pid
SlurmdLogFile=$logs/slurmd-%n.log
NodeName=$first NodeAddr=$(addr_of "$first") CPUs=8 RealMemory=1000 Gres=gpu:4 State=UNKNOWN
NodeName=$second NodeAddr=$(addr_of "$second") CPUs=8 RealMemory=1000 Gres=gpu:4 State=UNKNOWN
PartitionName=two Nodes=$first,$second Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
}

all_alive() {
    alive $ctld_pid slurmctld || return 1
    for n in $nodes; do alive "$(node_pid "$n")" slurmd || return 1; done
}
works() { timeout "${1:-30}" srun -N 2 -n 4 -t 1 true >/dev/null 2>&1; }
# Reuse needs the daemons alive first: srun to a dead controller or node gives up only
# after its retries (10-15 s). A changed script (another config) restarts them.
port=$(conf_value "$conf" SlurmctldPort)
if [ -n "$port" ] && [ "$(cat "$conf")" = "$(config_for "$port")" ] && all_alive && works; then
    log "reusing the running two-node cluster $name (SLURM_CONF=$conf)"
    exit 0
fi
[ "$sudo" = none ] && { log "not root and no sudo: cannot make network namespaces; skipped"; exit 77; }
for c in ip nsenter; do
    command -v $c >/dev/null || { log "no '$c' here: skipped"; exit 77; }
done
slurm_installed || exit $?
munge_up || exit 1

# --- network: a bridge in the root namespace, one namespace per node on a veth pair,
# whose default route leads back to this machine, so that every address of it (not
# only the bridge's) is reachable from the nodes.
cant() { log "$*: cannot make the node namespaces here; skipped"; exit 77; }
others=$(ip -o -4 addr show 2>/dev/null | awk -v net="$net." -v br="$bridge" \
    'index($4, net) == 1 && $2 != br { print $2 " (" $4 ")" }')
[ -n "$others" ] && { log "the subnet $net.0/24 is already on $others: give this cluster another" \
    "with DDP_SLURM_TWO_NET"; exit 1; }
ip link show "$bridge" >/dev/null 2>&1 || $sudo ip link add "$bridge" type bridge || cant "no bridge"
ip addr show dev "$bridge" | grep -q "inet $net.1/24" ||
    $sudo ip addr add "$net.1/24" dev "$bridge" || cant "no address on the bridge"
$sudo ip link set "$bridge" up || cant "bridge will not come up"
for n in $nodes; do
    ns=$tag-$n veth=${tag}v-$n a=$(addr_of "$n")
    [ -e "/run/netns/$ns" ] || $sudo ip netns add "$ns" || cant "ip netns add $ns failed"
    if ! ip -n "$ns" link show "${veth}p" >/dev/null 2>&1; then
        # Leftovers go first: a pair an interrupted run did not move, or the root half
        # of a pair whose namespace was deleted (the kernel frees those lazily).
        ip link show "${veth}p" >/dev/null 2>&1 && $sudo ip link del "${veth}p"
        ip link show "$veth" >/dev/null 2>&1 && $sudo ip link del "$veth"
        $sudo ip link add "$veth" type veth peer name "${veth}p" || cant "no veth pair"
        $sudo ip link set "${veth}p" netns "$ns" || cant "cannot move a veth into $ns"
    fi
    $sudo ip link set "$veth" master "$bridge" up
    $sudo ip -n "$ns" link set lo up
    ip -n "$ns" addr show dev "${veth}p" | grep -q "inet $a/24" || $sudo ip -n "$ns" addr add "$a/24" dev "${veth}p"
    $sudo ip -n "$ns" link set "${veth}p" up || cant "the veth in $ns will not come up"
    $sudo ip -n "$ns" route replace default via "$net.1" || cant "no default route in $ns"
done

# --- /etc/hosts: the node names, and this machine's hostname at the bridge address
# where it names a loopback address now (srun asks the nodes to call it back at its
# hostname's address; 127.x there is the node's own). A hostname that already names
# another address of this machine, say another test cluster's bridge, is left alone:
# the default route reaches it. Every other name and line is kept.
host_addr=$(getent ahostsv4 "$host" 2>/dev/null | awk 'NR == 1 { print $1 }')
ours="$first $second"
case $host_addr in
    "" | 127.*) ours="$host $ours" ;;
    *) ip -o -4 addr show | grep -q " inet $host_addr/" || ours="$host $ours" ;;
esac
tmp=$(mktemp) || exit 1
trap 'rm -f "$tmp"' EXIT
awk -v names="$ours" -v net="$net" -v host="$host" -v first="$first" -v second="$second" -v mark="# ddp $name" '
    BEGIN { split(names, k, " "); for (i in k) drop[k[i]] = 1 }
    index($0, mark) { next }
    /^[ \t]*(#|$)/ { print; next }
    { line = $1; rest = ""; kept = 0; dropped = 0
      for (i = 2; i <= NF; i++) {
          if ($i ~ /^#/) { for (j = i; j <= NF; j++) rest = rest " " $j; break }
          if ($i in drop) dropped++; else { line = line " " $i; kept++ } }
      if (dropped == 0) print        # lines without our names stay as they were
      else if (kept > 0) print line rest }
    END { if (host in drop) print net ".1 " host " " mark
          print net ".2 " first " " mark
          print net ".3 " second " " mark }' /etc/hosts > "$tmp" || exit 1
if ! cmp -s "$tmp" /etc/hosts; then
    [ -f "/etc/hosts.before-$name" ] || $sudo cp /etc/hosts "/etc/hosts.before-$name"
    # Rewritten in place (not moved over): /etc/hosts may be a bind mount.
    $sudo sh -c "cat '$tmp' > /etc/hosts" || { log "cannot write /etc/hosts"; exit 1; }
    log "/etc/hosts: $ours -> this cluster's addresses (the file was saved as /etc/hosts.before-$name)"
fi

# --- daemons: stopped, and started again on a port checked free
stop_daemon $ctld_pid slurmctld
for n in $nodes; do stop_daemon "$(node_pid "$n")" slurmd; done
port=$(pick_port "${port:-6827}" 6900 6999) || { log "the controller's port: see above"; exit 1; }
$sudo mkdir -p "$conf_dir" "$logs" "$state" || { log "cannot make its folders"; exit 1; }
if [ "$(cat "$conf" 2>/dev/null)" != "$(config_for "$port")" ]; then
    config_for "$port" | $sudo tee "$conf" >/dev/null || { log "cannot write $conf"; exit 1; }
    log "wrote $conf (controller port $port)"
fi
gres=$(fake_gpus "$first" 4) && gres2=$(fake_gpus "$second" 4) &&
    printf '%s\n%s\n' "$gres" "$gres2" | $sudo tee "$conf_dir/gres.conf" >/dev/null ||
    { log "cannot write $conf_dir/gres.conf"; exit 1; }
start_daemon slurmctld $ctld_pid "$logs/slurmctld.log" $sudo env SLURM_CONF="$conf" slurmctld -f "$conf" || exit 1
for n in $nodes; do
    $sudo mkdir -p "$spool/$n"
    held=$($sudo nsenter --net="/run/netns/$tag-$n" sh -c ". '$here/slurm_conf.sh'; port_holder 6818")
    [ -n "$held" ] && { log "port 6818 in the namespace $tag-$n is held by $held: another cluster's node" \
        "daemon runs there (give this cluster other names with DDP_SLURM_TWO_TAG and DDP_SLURM_TWO_NODES)"; exit 1; }
    # nsenter joins only the network namespace; `ip netns exec` would also remount
    # /sys, hiding the cgroup file system slurmd wants.
    start_daemon slurmd "$(node_pid "$n")" "$logs/slurmd-$n.log" \
        $sudo env SLURM_CONF="$conf" nsenter --net="/run/netns/$tag-$n" slurmd -f "$conf" -N "$n" || exit 1
done
for i in 1 2 3 4 5 6 7 8 9 10 11 12; do
    if works 20; then
        log "up: $name, SLURM_CONF=$conf, controller $host($net.1):$port, nodes $first ($net.2, netns" \
            "$tag-$first) $second ($net.3, netns $tag-$second): $(sinfo -h -o '%P %D %T' 2>/dev/null)"
        exit 0
    fi
    # A node still drained or down after its slurmd came back (ReturnToService=2 brings
    # back a down node that registers, but not a drained one) is put back by hand.
    [ $i -eq 3 ] && $sudo env SLURM_CONF="$conf" scontrol update nodename="$first,$second" state=resume >/dev/null 2>&1
    sleep 2
done
log "the two-node cluster $name did not come up: srun -N 2 -n 4 true fails:"
timeout 20 srun -N 2 -n 4 -t 1 true 2>&1 | tail -n 5
sinfo -N 2>&1 | tail -n 5
log_tail "$logs/slurmctld.log"
for n in $nodes; do log_tail "$logs/slurmd-$n.log"; done
exit 1
