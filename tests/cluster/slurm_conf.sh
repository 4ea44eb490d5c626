# slurm_conf.sh: sourced by slurm_up.sh, two_nodes_up.sh and the tests that use their
# clusters. What the two test clusters share:
#   - where each keeps its files (its own configuration, pid files, spool, state and
#     logs, so that it runs beside any other Slurm on the machine, /etc/slurm's
#     included, and never edits theirs);
#   - the settings of their slurm.conf: munge, no cgroups (task/none: none are needed,
#     and slurmd in a network namespace cannot reach them), root daemons,
#     config_overrides so a node may claim more CPUs than a small machine has, and
#     credentials that last 30 s, not 120 (Slurm holds a requeued job at least that long);
#   - checked steps: installing, munge, ports that must be free (another is picked,
#     or the process holding it named), daemons that must come up (the tail of their
#     log shown when they do not).
# Functions keep their variables to names starting with _ (sh has no locals).
# Another pair of clusters may be made from the same scripts with other names and
# ports (DDP_SLURM_ONE, DDP_SLURM_TWO, DDP_SLURM_TWO_NET: tests/cluster/crowded.sh).

one_node_name=${DDP_SLURM_ONE:-ddp-tests}
one_node_conf=/etc/slurm-$one_node_name/slurm.conf
two_nodes_name=${DDP_SLURM_TWO:-ddp-tests2}
two_nodes_conf=/etc/slurm-$two_nodes_name/slurm.conf

slurm_common_conf() {
    cat <<'CONF'
AuthType=auth/munge
AuthInfo=cred_expire=30
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmUser=root
SlurmdUser=root
ReturnToService=2
MpiDefault=none
SlurmdParameters=config_overrides
GresTypes=gpu
CONF
}

if [ "$(id -u)" -eq 0 ]; then sudo=""; elif sudo -n true 2>/dev/null; then sudo="sudo -n"; else sudo=none; fi

# log_tail FILE: the end of a daemon's log, to say why it failed
log_tail() {
    echo "--- the last lines of $1:"
    if [ -r "$1" ]; then tail -n 15 "$1"; else $sudo tail -n 15 "$1" 2>/dev/null || echo "(cannot read it)"; fi
    echo "---"
}

# alive PIDFILE NAME: the pid file names a running process called NAME
alive() {
    _p=$(cat "$1" 2>/dev/null) && [ -n "$_p" ] && [ "$(cat /proc/"$_p"/comm 2>/dev/null)" = "$2" ]
}

# stop_daemon PIDFILE NAME: ends it if it runs, waiting up to 10 s
stop_daemon() {
    alive "$1" "$2" || return 0
    $sudo kill "$(cat "$1")"
    _i=0
    while alive "$1" "$2" && [ $_i -lt 20 ]; do sleep 0.5; _i=$((_i + 1)); done
    alive "$1" "$2" && $sudo kill -KILL "$(cat "$1")"
    return 0
}

# port_holder PORT: who listens on the TCP port or holds it (empty when it is free)
port_holder() {
    _line=$($sudo ss -Htanp exclude time-wait "( sport = :$1 )" 2>/dev/null | head -n 1)
    if [ -z "$_line" ] && ! command -v ss >/dev/null; then
        # without ss: /proc/net/tcp, which names no process
        awk -v p="$1" 'NR > 1 { split($2, a, ":"); if (("0x" a[2]) + 0 == p) { print "a socket"; exit } }' \
            /proc/net/tcp /proc/net/tcp6 2>/dev/null
        return
    fi
    [ -z "$_line" ] && return
    _who=$(printf '%s\n' "$_line" | sed -n 's/.*users:((\("[^"]*",pid=[0-9]*\).*/\1/p' | tr -d '"')
    echo "${_who:-a socket} ($(printf '%s\n' "$_line" | awk '{print $1}'))"
}

# pick_port WANTED LO HI [TAKEN...]: WANTED if it is free, else the first free port in
# LO..HI other than TAKEN; says on stderr which process held WANTED. Fails when none is.
pick_port() {
    _wanted=$1 _lo=$2 _hi=$3
    shift 3
    _holder=$(port_holder "$_wanted")
    case " $* " in *" $_wanted "*) _holder=${_holder:-"another daemon of this cluster"} ;; esac
    if [ -z "$_holder" ]; then
        echo "$_wanted"
        return 0
    fi
    _p=$_lo
    while [ "$_p" -le "$_hi" ]; do
        case " $* " in *" $_p "*) ;; *)
            if [ -z "$(port_holder "$_p")" ]; then
                echo "port $_wanted is held by $_holder: using $_p" >&2
                echo "$_p"
                return 0
            fi ;;
        esac
        _p=$((_p + 1))
    done
    echo "port $_wanted is held by $_holder, and no port from $_lo to $_hi is free" >&2
    return 1
}

# conf_value FILE KEY: a setting of a slurm.conf (empty if absent)
conf_value() { sed -n "s/^$2=\([^ ]*\).*/\1/p" "$1" 2>/dev/null | head -n 1; }

# slurm_installed: Slurm's daemons and munge are here, installed if missing and
# allowed. 77 (skip) where they can be neither found nor installed.
slurm_installed() {
    if command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null &&
        command -v ss >/dev/null; then
        return 0
    fi
    [ "$sudo" = none ] && { echo "not root and no sudo: cannot install Slurm; skipped"; return 77; }
    echo "installing slurm-wlm, munge and iproute2"
    export DEBIAN_FRONTEND=noninteractive
    if ! $sudo apt-get install -y -q slurm-wlm munge iproute2 >/dev/null 2>&1; then
        _out=$({ $sudo apt-get update -q && $sudo apt-get install -y -q slurm-wlm munge iproute2; } 2>&1) || {
            printf '%s\n' "$_out" | tail -n 10
            echo "could not install Slurm: skipped"
            return 77
        }
    fi
    return 0
}

# munge_up: a munged that signs and checks credentials, this machine's own if one runs
munge_up() {
    munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
    $sudo mkdir -p /run/munge /var/log/munge /var/lib/munge
    $sudo chown munge:munge /run/munge /var/log/munge /var/lib/munge /etc/munge/munge.key ||
        { echo "munge: cannot give its folders and key to the user munge"; return 1; }
    _out=$($sudo su munge -s /bin/sh -c /usr/sbin/munged 2>&1) || {
        echo "munged did not start: $_out"
        log_tail /var/log/munge/munged.log
        return 1
    }
    _i=0
    while [ $_i -lt 10 ]; do
        munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && return 0
        sleep 0.5
        _i=$((_i + 1))
    done
    echo "munged runs, but munge -n | unmunge fails: $(munge -n 2>&1 | unmunge 2>&1 | tail -n 1)"
    log_tail /var/log/munge/munged.log
    return 1
}

# start_daemon NAME PIDFILE LOG COMMAND...: runs COMMAND (which forks NAME) and waits
# until PIDFILE names it, up to 15 s; says what failed, with the log's end, if not
start_daemon() {
    _name=$1 _pidfile=$2 _logfile=$3
    shift 3
    _out=$("$@" 2>&1)
    _rc=$?
    _i=0
    while [ $_rc -eq 0 ] && ! alive "$_pidfile" "$_name" && [ $_i -lt 30 ]; do sleep 0.5; _i=$((_i + 1)); done
    alive "$_pidfile" "$_name" && return 0
    echo "$_name did not start ($*: status $_rc${_out:+: $_out})"
    log_tail "$_logfile"
    return 1
}

# quietly COMMAND...: runs COMMAND, showing what it said only when it did not succeed
# (a skip included), so that a test never fails or skips without saying why
quietly() {
    _out=$("$@" 2>&1)
    _rc=$?
    [ $_rc -ne 0 ] && printf '%s\n' "$_out"
    return $_rc
}

# cluster_down NAME: stops the daemons of the test cluster NAME (its files stay)
cluster_down() {
    stop_daemon "/run/slurmctld-$1.pid" slurmctld
    for _f in "/run/slurmd-$1.pid" "/run/slurmd-$1"-*.pid; do
        [ -f "$_f" ] && stop_daemon "$_f" slurmd
    done
    return 0
}

# fake_gpus NODE COUNT: gres.conf's line for COUNT GPUs of NODE (Slurm wants a device file
# for each GPU, and a node that reports fewer than slurm.conf says is set invalid).
# They are character devices like /dev/null (regular files where mknod is refused):
# nothing opens them; they let `sbatch --test-only` take GPU job scripts.
fake_gpus() {
    dir=/var/lib/ddp-tests-gpus/$1
    $sudo mkdir -p "$dir" || return 1
    i=0
    while [ $i -lt "$2" ]; do
        [ -e "$dir/gpu$i" ] || $sudo mknod "$dir/gpu$i" c 1 3 2>/dev/null || $sudo touch "$dir/gpu$i" || return 1
        i=$((i + 1))
    done
    echo "NodeName=$1 Name=gpu File=$dir/gpu[0-$(($2 - 1))]"
}
