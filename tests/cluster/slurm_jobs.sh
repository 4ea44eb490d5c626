#!/bin/sh
# slurm_jobs.sh PROGRAMS: real Slurm jobs (run through with_slurm.sh): the Fashion-MNIST
# MLP built with 16 samples per replica, trained by `srun -n 4` for one epoch, reaches
# the one-worker accuracy bar (0.82); and a job script run by `sbatch --wait` trains
# with `srun -n 2` inside it.
set -u
programs=$1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

timeout 600 srun -n 4 "$programs/fashion_mlp_16" --threads 1 --metrics "$dir/m.json" > "$dir/out" 2>&1
status=$?
accuracy=$(sed -n 's/.*"val_accuracy": \([^,}]*\).*/\1/p' "$dir/m.json" 2>/dev/null)
if [ $status -eq 0 ] && awk -v a="$accuracy" 'BEGIN { exit !(a != "" && a + 0 >= 0.82) }'; then
    echo "ok: srun -n 4 x 16: validation accuracy $accuracy after 1 epoch (at least 0.82)"
else
    fail "srun -n 4 x 16: status $status, accuracy '$accuracy'"
    tail -n 20 "$dir/out"
fi

printf 'x0,x1,x2,x3,label\n' > "$dir/tiny.csv"
for i in $(seq 1 32); do echo "$i,0,1,2,$((i % 3))" >> "$dir/tiny.csv"; done
cp "$dir/tiny.csv" "$dir/tiny_check.csv"
cat > "$dir/job.sh" <<JOB
#!/bin/sh
#SBATCH --ntasks=2
#SBATCH --output=$dir/job.out
srun "$programs/tiny" --data-root "$dir" --threads 1 --save "$dir/p.safetensors"
JOB
timeout 300 sbatch --wait "$dir/job.sh" > /dev/null
status=$?
if [ $status -eq 0 ] && grep -q "cluster     slurm: 2 workers on 1 node" "$dir/job.out" && [ -s "$dir/p.safetensors" ]
then
    echo "ok: sbatch --wait: a job script's srun trains with 2 workers"
else
    fail "sbatch --wait: status $status"
    cat "$dir/job.out"
fi
[ "$failures" -eq 0 ]
