#!/bin/sh
# job_scripts.sh PROGRAMS: the sample job scripts (samples/slurm/) on the tests' real
# Slurm (with_slurm.sh sets SLURM_CONF). Each GPU script passes `sbatch --test-only` on
# the test clusters, whose nodes have stand-in GPUs (the two-node cluster's nodes claim
# 8 CPUs, so the multi-node script is checked there with --cpus-per-task=2). The CPU
# script runs for real with --time=2 --signal=USR1@60: SIGUSR1 reaches both workers
# 30 to 60 s in (Slurm looks at time limits every 30 s), they write a checkpoint,
# worker 0 requeues the job, and the requeued job (same id, SLURM_RESTART_COUNT=1) resumes by itself and finishes with the
# parameters of a run never stopped, bit for bit (signalled again before it ends, it is
# requeued again). Slurm holds a requeued job at least as long as a credential lasts
# (30 s on the test clusters: slurm_conf.sh; 60 to 90 s with its scheduler's passes),
# so this takes three to five minutes.
set -u
programs=$1
here=$(cd "$(dirname "$0")" && pwd)
scripts=$here/../../samples/slurm
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

for script in one_gpu one_node cpu; do
    out=$(sbatch --test-only "$scripts/$script.sbatch" 2>&1)
    case $out in
    *"to start at"*) echo "ok: sbatch --test-only $script.sbatch: ${out#sbatch: }" ;;
    *) fail "sbatch --test-only $script.sbatch: $out" ;;
    esac
done
if sh "$here/../cluster/two_nodes_up.sh" > "$dir/two_nodes" 2>&1; then
    . "$here/../cluster/slurm_conf.sh"
    out=$(SLURM_CONF=$two_nodes_conf sbatch --test-only --cpus-per-task=2 "$scripts/multi_node.sbatch" 2>&1)
    case $out in
    *"to start at"*) echo "ok: sbatch --test-only multi_node.sbatch on two nodes: ${out#sbatch: }" ;;
    *) fail "sbatch --test-only multi_node.sbatch: $out" ;;
    esac
else
    fail "the two-node cluster for multi_node.sbatch: $(tail -n 5 "$dir/two_nodes")"
fi

# The CPU script for real, beside the same training never stopped (started with it, so
# that the two share the CPUs until the job's first signal, 60 to 90 s in: Slurm looks
# at time limits every 30 s). About 55 s of work alone on this machine, measured first:
# sharing the CPUs, the job has done most of it but not all when the signal comes,
# and the reference is done before Slurm lets the requeued job run the rest alone (a
# second run past 60 s would be signalled and requeued again, which only takes longer).
calibration_start=$(date +%s%N)
(cd "$dir" && srun -n 2 -t 5 "$programs/fashion_mlp" --epochs 20 --threads 1 --run-dir "$dir/calibration" \
    > "$dir/calibration.out" 2>&1) || { echo "FAIL: srun fashion_mlp: $(tail -n 5 "$dir/calibration.out")"; exit 1; }
per_epoch_ms=$((($(date +%s%N) - calibration_start) / 20000000))
epochs=$((55000 / (per_epoch_ms > 0 ? per_epoch_ms : 1) + 1))
args="--epochs $epochs --threads 1 --log-every 100000"
job=$(cd "$dir" && DDP_PROGRAM=$programs/fashion_mlp sbatch --parsable --time=2 --signal=USR1@60 \
    --output="$dir/job.out" --error="$dir/job.out" "$scripts/cpu.sbatch" $args --run-dir "$dir/run" \
    --save "$dir/run.safetensors")
[ -n "$job" ] || { echo "FAIL: sbatch cpu.sbatch gave no job id"; exit 1; }
(cd "$dir" && srun -n 2 -t 10 "$programs/fashion_mlp" $args --run-dir "$dir/whole" \
    --save "$dir/whole.safetensors" > "$dir/whole.out" 2>&1) &
reference=$!
start=$(date +%s)
while squeue -h -j "$job" 2>/dev/null | grep -q .; do
    if [ $(($(date +%s) - start)) -gt 720 ]; then
        fail "job $job still there after 12 minutes: $(squeue -h -j "$job")"
        scancel "$job"
        break
    fi
    sleep 5
done
took=$(($(date +%s) - start))
wait $reference || fail "the run never stopped: status $? $(tail -n 5 "$dir/whole.out")"
restarts=$(grep -c "job $job requeued" "$dir/job.out")
if grep -q "SIGUSR1: stopped after step" "$dir/job.out" && grep -q "job $job requeued" "$dir/job.out" &&
    grep -q "the job was requeued (SLURM_RESTART_COUNT=1): resuming" "$dir/job.out" &&
    grep -q "^done: $epochs epochs" "$dir/job.out" && cmp -s "$dir/run.safetensors" "$dir/whole.safetensors"; then
    echo "ok: sbatch --time=2 --signal=USR1@60 cpu.sbatch ($epochs epochs): $(grep -o 'stopped after step [0-9]*' \
        "$dir/job.out" | head -n 1), requeued, resumed by itself (${restarts:-?} requeue(s)), done in ${took} s with the parameters of a run never stopped"
else
    fail "the requeued job $job (${took} s):"
    grep -v "^epoch" "$dir/job.out" | tail -n 30
    cmp "$dir/run.safetensors" "$dir/whole.safetensors"
fi
exit $((failures > 0))
