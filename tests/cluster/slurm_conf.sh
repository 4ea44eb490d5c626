# slurm_conf.sh: sourced by slurm_up.sh and two_nodes_up.sh. The settings both test
# clusters share: munge, no cgroups (task/none: none are needed, and slurmd in a
# network namespace cannot reach them), root daemons, and config_overrides so a node
# may claim more CPUs than a small machine has.
slurm_common_conf() {
    cat <<'CONF'
AuthType=auth/munge
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
CONF
}
