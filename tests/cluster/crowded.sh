#!/bin/sh
# crowded.sh up|down: the machine the test clusters must live beside. `up` stops this
# machine's test clusters (slurm_up.sh's and two_nodes_up.sh's), then starts two
# others made by the same scripts under other names, so that they hold first the
# ports ours want (6817, 6818, 6827) and, on a machine whose hostname names a
# loopback address, the hostname too:
#   other-one   one node, SLURM_CONF=/etc/slurm-other-one/slurm.conf
#   other-two   nodes m1, m2 on 10.78.0.0/24 (bridge othbr0, namespaces oth-m1, oth-m2),
#               SLURM_CONF=/etc/slurm-other-two/slurm.conf
# Then the cluster tests are run as usual, and must pass, e.g.
#   sh tests/cluster/crowded.sh up && ctest --test-dir build -R cluster --repeat until-fail:3
# `down` stops the other two (their files stay).
set -u
here=$(dirname "$0")
. "$here/slurm_conf.sh"
others() {
    DDP_SLURM_ONE=other-one DDP_SLURM_TWO=other-two DDP_SLURM_TWO_NET=10.78.0 DDP_SLURM_TWO_TAG=oth \
        DDP_SLURM_TWO_NODES="m1 m2" "$@"
}
case ${1:-} in
up)
    cluster_down "$one_node_name"
    cluster_down "$two_nodes_name"
    others sh "$here/slurm_up.sh" || exit 1
    others sh "$here/two_nodes_up.sh" || exit 1
    echo "crowded: other-one and other-two run; this machine's test clusters will start beside them"
    ;;
down)
    cluster_down other-one
    cluster_down other-two
    ;;
*)
    echo "usage: crowded.sh up|down" >&2
    exit 2
    ;;
esac
