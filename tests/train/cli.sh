#!/bin/sh
# cli.sh DIR: a built program's command line (programs in DIR): --help, bad usage
# (status 2), run-time errors (status 1) and settings this runtime cannot honour yet,
# refused at start; each with the message a user needs. Also: progress in a log file
# has no carriage returns, parameters saved by one model do not load into another,
# --data-stats gives the figures worked out by hand and by NumPy, and --dump-batch
# writes the samples the first step trains on; runs started together take a run folder
# each.
set -u
dir=$1
root=$(mktemp -d)
ports="$(dirname "$0")/../cluster/free_ports.sh"
trap 'rm -rf "$root"; sh "$ports" --release $$' EXIT
printf 'x0,x1,x2,x3,label\n1,2,3,4,0\n0,1,0,1,1\n2,2,1,0,2\n1,0,0,1,1\n' > "$root/tiny.csv"
cat "$root/tiny.csv" > "$root/tiny_check.csv"
tail -n 4 "$root/tiny_check.csv" >> "$root/tiny.csv"
failures=0

# expect STATUS PATTERN COMMAND...: the command exits with STATUS and says PATTERN
expect() {
    want=$1 pattern=$2
    shift 2
    out=$("$@" 2>&1)
    got=$?
    if [ "$got" -ne "$want" ] || ! printf '%s\n' "$out" | grep -q -- "$pattern"; then
        echo "FAIL: $* -> status $got (wanted $want and \"$pattern\"):"
        printf '%s\n' "$out" | head -n 8
        failures=$((failures + 1))
    else
        echo "ok: $* -> $got: $(printf '%s\n' "$out" | grep -m 1 -- "$pattern")"
    fi
}

tiny="$dir/tiny --data-root $root --epochs 1 --steps-per-epoch 1"
expect 0 "--steps-per-epoch N" "$dir/tiny" --help
expect 2 "unknown option \`--bogus\`" "$dir/tiny" --bogus
expect 2 "takes no file arguments" "$dir/tiny" data.csv
expect 2 "\-\-epochs needs a value" "$dir/tiny" --epochs
expect 2 "\-\-epochs wants a whole number" "$dir/tiny" --epochs=-1
expect 2 "\-\-steps-per-epoch wants a positive" "$dir/tiny" --steps-per-epoch 0
expect 2 "\-\-threads wants a number of threads" "$dir/tiny" --threads 0
expect 2 "\-\-loader-threads wants a number of threads from 1 to 256, not \`257\`" "$dir/tiny" --loader-threads 257
expect 2 "\-\-lr wants a positive number, not \`fast\`" "$dir/tiny" --lr fast
expect 2 "\-\-device is auto, cpu, gpu or emulated, not \`tpu\`" "$dir/tiny" --device tpu
expect 2 "\-\-evaluate needs a validation dataset" "$dir/zeros" --evaluate
expect 1 "\-\-device gpu: no usable GPU: the CUDA driver DDP_CUDA_DRIVER=/nonexistent/libcuda.so.1 cannot be loaded" env DDP_CUDA_DRIVER=/nonexistent/libcuda.so.1 $tiny --device gpu
# a driver too old for the PTX, and a good driver without cuBLAS (tests/gpu/fake_cuda.c)
old_driver="env -u CUDA_VISIBLE_DEVICES DDP_CUDA_DRIVER=$dir/libfake_cuda.so FAKE_CUDA_VERSION=11020"
no_cublas="env -u CUDA_VISIBLE_DEVICES DDP_CUDA_DRIVER=$dir/libfake_cuda.so FAKE_CUDA_VERSION=13000 DDP_CUDA_LIBRARY_PATH=/nonexistent/cublas"
expect 1 "supports CUDA 11.2, but the program's PTX (ISA 7.5, sm_80) needs CUDA 11.5 or newer: update the NVIDIA driver" $old_driver $tiny --device gpu
expect 1 "cuBLAS (libcublas.so.13 or libcublas.so.12) is not installed, or not in any place searched: /nonexistent/cublas" $no_cublas $tiny --device gpu
expect 0 "a GPU is visible but cannot be used: .*cuBLAS.*training on the CPU" $no_cublas $tiny
expect 1 "this task was given GPUs (CUDA_VISIBLE_DEVICES=0), but none is usable: the CUDA driver .* supports CUDA 11.2" $old_driver CUDA_VISIBLE_DEVICES=0 $tiny
expect 1 "cuBLAS (libcublas.so.13 or libcublas.so.12) is not installed" $no_cublas CUDA_VISIBLE_DEVICES=0 $tiny
# gpus_per_worker = 2: more GPUs than visible, and the CPU, refused with both counts / why
expect 1 "gpus_per_worker = 2: this node's 1 task need 2 GPUs, but this task sees 1 (CUDA_VISIBLE_DEVICES=0): give each task 2 GPUs" \
    $no_cublas CUDA_VISIBLE_DEVICES=0 "$dir/tiny_g2" --data-root "$root"
expect 1 "gpus_per_worker = 2 puts each replica on a GPU of its own, but this worker trains on the CPU" \
    "$dir/tiny_g2" --data-root "$root" --device cpu
expect 1 "tiny.csv: no such file (the dataset \`tiny_data\`, CSV file); check the path or give --data-root" "$dir/tiny"
expect 1 "steps_per_epoch is 5, but 8 samples make only 1 global batch of 8" $tiny --steps-per-epoch 5
expect 0 "run folder  $root/run: checkpoints every 1 epoch in $root/run/ck" "$dir/tiny_checkpoint" --data-root "$root" --run-dir "$root/run"
expect 1 "$root/run/ck already holds checkpoints of another run: pass --resume" "$dir/tiny_checkpoint" --data-root "$root" --run-dir "$root/run"
expect 1 "\-\-resume: no checkpoint in $root/none/checkpoints: give the checkpoint" $tiny --resume --run-dir "$root/none"
expect 1 "\-\-resume: $root/run/ck/step-0000000001.safetensors is not a ddp checkpoint" sh -c \
    "$dir/tiny --data-root $root --run-dir $root/run-tiny --save $root/run/ck/step-0000000001.safetensors && $tiny --run-dir $root/run --resume $root/run/ck/step-0000000001.safetensors"
expect 0 "DDP_TEST_SIGNAL=HUP@3 is not USR1|TERM|INT@STEP" env DDP_TEST_SIGNAL=HUP@3 $tiny --run-dir "$root/hup"
expect 9 "DDP_CRASH_AT=before-rename:KILL: \`KILL\` is not INT, TERM, HUP or USR1; crashing there instead" \
    env DDP_CRASH_AT=before-rename:KILL $tiny --run-dir "$root/crash" --save "$root/crash.safetensors"
expect 2 "\-\-resume-changed goes with --resume" $tiny --resume-changed
expect 2 "\-\-evaluate does not go with --resume" $tiny --evaluate --resume
expect 2 "\-\-evaluate and \-\-profile do not go together" $tiny --evaluate --profile
expect 2 "unknown option \`--profile=yes\`" $tiny --profile=yes
expect 0 "\-\-profile  *time every kernel" "$dir/tiny" --help
expect 0 "\-\-no-cuda-graphs  *on a GPU, queue every kernel" "$dir/tiny" --help
expect 2 "unknown option \`--no-cuda-graphs=1\`" $tiny --no-cuda-graphs=1
expect 2 "\-\-convolutions fast: generated or library" $tiny --convolutions fast
expect 2 "\-\-conv-search fastest: heuristic or timed" $tiny --conv-search fastest
expect 0 "\-\-conv-search S  *how cuDNN's engine for each convolution is chosen" "$dir/tiny" --help
# timed on a device without cuDNN's engines (the emulated one): nothing to time, the
# banner claims nothing
expect 0 "convolution the emulated device's reference convolution$" "$dir/convolution" --device emulated \
    --conv-search timed
# A convolution the GPU's library has no engine for (the emulated one told to have
# none): the library is given up at the start, the generated steps train; asked for
# by name, the run stops saying why.
expect 0 "convolution generated: im2col and products (the library's were given up at the start: .*no engine" \
    env DDP_EMULATED_CONV_ENGINES=none "$dir/convolution" --device emulated
expect 1 "the emulated cuDNN has no engine for it" env DDP_EMULATED_CONV_ENGINES=none "$dir/convolution" \
    --device emulated --convolutions library

# precision = bf16: refused on the CPU, and on a GPU older than compute capability 8.0,
# which is named with its capability (the check comes before cuBLAS is looked for)
expect 1 "precision = bf16 runs on a GPU" "$dir/tiny_bf16" --data-root "$root" --device cpu
expect 1 "GPU 0 (Tesla V100-SXM2-16GB): precision = bf16 needs a GPU of compute capability 8.0 or later .*, and this one is 7.0: .*set precision = fp32" \
    $no_cublas FAKE_CUDA_CC=70 FAKE_CUDA_NAME="Tesla V100-SXM2-16GB" "$dir/tiny_bf16" --data-root "$root" --device gpu
expect 1 "cuBLAS (libcublas.so.13 or libcublas.so.12) is not installed" $no_cublas FAKE_CUDA_CC=80 "$dir/tiny_bf16" \
    --data-root "$root" --device gpu
expect 1 "communication = nccl needs every replica on a GPU, but this worker trains on the CPU" env DDP_SECRET=s \
    DDP_WORLD_SIZE=2 DDP_RANK=0 DDP_COORDINATOR=localhost:$(sh "$ports" 1 $$) "$dir/tiny_nccl" --data-root "$root"
expect 1 "not a task of a Slurm job step" env -u SLURM_STEP_ID "$dir/tiny_slurm" --data-root "$root"
slurm_step="SLURM_JOB_ID=7 SLURM_STEP_ID=0 SLURM_STEP_NUM_TASKS=4 SLURM_PROCID=3 SLURM_LOCALID=1 SLURM_NODEID=1"
expect 1 "cannot resolve the host \`ddp-nowhere1\`" env DDP_SECRET=s $slurm_step \
    SLURM_STEP_NODELIST='ddp-nowhere[1-2]' SLURM_STEP_TASKS_PER_NODE='2(x2)' $tiny --rendezvous-timeout 2
expect 1 "SLURM_STEP_TASKS_PER_NODE \`3,2\` adds up to 5 tasks" env $slurm_step SLURM_STEP_NODELIST='n[1-2]' \
    SLURM_STEP_TASKS_PER_NODE='3,2' $tiny
expect 1 "the host list \`n\[1-2\` is malformed: a \`\[\` is not closed" env $slurm_step SLURM_STEP_NODELIST='n[1-2' \
    SLURM_STEP_TASKS_PER_NODE='2(x2)' $tiny
expect 1 "SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE are not set" env $slurm_step $tiny
expect 0 "warning: this is Slurm job 7, but not a task of a job step" env SLURM_JOB_ID=7 $tiny
port=$(sh "$ports" 1 $$) || exit 1
expect 1 "no coordinator (rank 0) at localhost:$port within 1 s (--rendezvous-timeout): cannot connect to \
localhost:$port: Connection refused" env DDP_SECRET=s DDP_WORLD_SIZE=2 DDP_RANK=1 DDP_COORDINATOR=localhost:$port \
    $tiny --rendezvous-timeout 1
expect 1 "DDP_SECRET is not set: workers started without Slurm prove" env -u DDP_SECRET DDP_WORLD_SIZE=2 DDP_RANK=1 \
    DDP_COORDINATOR=localhost:$port $tiny
expect 1 "DDP_COORDINATOR is not set" env DDP_WORLD_SIZE=2 DDP_RANK=1 $tiny
expect 1 "DDP_RANK is \`x\`, not a whole number" env DDP_WORLD_SIZE=2 DDP_RANK=x $tiny
expect 1 "rank 2 from env is not below the world size 2" env DDP_WORLD_SIZE=2 DDP_RANK=2 \
    DDP_COORDINATOR=h:1 $tiny
expect 1 "not every worker joined within 1 s (--rendezvous-timeout): missing rank 1, rank 2" env DDP_SECRET=s \
    $tiny --world-size 3 --rank 0 --coordinator localhost:$port --rendezvous-timeout 1
expect 2 "\-\-rank needs \-\-world-size" $tiny --rank 1
expect 1 "the program says cluster = env, but DDP_WORLD_SIZE is not set" "$dir/tiny_env" --data-root "$root"
expect 1 "cannot write the metrics file" $tiny --metrics "$root/no/such/dir/m.json"
expect 1 "\-\-save $root/no/such/dir/p.safetensors: cannot write: No such file or directory (checked before the run" \
    $tiny --save "$root/no/such/dir/p.safetensors"
mkdir "$root/folder.safetensors"
expect 1 "cannot write: it is a folder; name a file (checked before the run" $tiny --save "$root/folder.safetensors"
expect 1 "\-\-trace $root/no/such/dir/t.json: cannot write" $tiny --trace "$root/no/such/dir/t.json"
expect 1 "cannot open" $tiny --load "$root/missing.safetensors"
printf 'not safetensors at all' > "$root/garbage"
expect 1 "not a safetensors file" $tiny --load "$root/garbage"
expect 0 "done: 0 epochs" $tiny --epochs 0 --save "$root/init.safetensors"
expect 0 "parameters  from" $tiny --load "$root/init.safetensors"
expect 0 "warning: --evaluate without --load evaluates the initial parameters (drawn from seed 0)" $tiny --evaluate
expect 0 "parameters  the initial ones, drawn from seed 0 (no --load)" $tiny --evaluate
expect 1 "has no tensor \`mlp\.[a-z.]*\`: it was saved from another model" "$dir/zeros" --load "$root/init.safetensors"

# --check reads and tries all that a run needs, stops before the first step and
# writes nothing: no run folder, no file given, the metrics file as it was
mkdir "$root/checking"
echo older > "$root/checking/m.json"
expect 0 "checked: the datasets, the parameters and the files to write are usable; nothing was trained" \
    sh -c "cd '$root/checking' && $tiny --check --metrics m.json --save s.safetensors --trace t.json \
           --load '$root/init.safetensors'"
expect 0 "predict     $root/checking/p.npy" $tiny --check --predict "$root/checking/p.npy"
expect 0 "checked: the datasets" $tiny --check --device emulated
# the loader's threads: on a GPU the worker's CPUs but one, at most 8; on the CPU one
expect 0 "^  loader      3 threads assemble each batch" $tiny --check --device emulated --threads 4
expect 0 "^  loader      8 threads assemble each batch" $tiny --check --device emulated --threads 12
expect 0 "^  loader      2 threads assemble each batch" $tiny --check --loader-threads 2
# the banner names OpenBLAS's kernels, those a site's OPENBLAS_CORETYPE holds it to among them
expect 0 "^  device      cpu, .* kernels, OpenBLAS Prescott products" env OPENBLAS_CORETYPE=Prescott $tiny --check --device cpu
out=$($tiny --check --threads 4 2>&1)
printf '%s\n' "$out" | grep -q "^  loader " && { echo "FAIL: a loader line on the CPU: $out"; failures=$((failures + 1)); }
expect 1 "train on the CPU; --check --device emulated checks the rest on a machine without a GPU" \
    "$dir/tiny_bf16" --data-root "$root" --device cpu --check
expect 0 "checked: the datasets" "$dir/tiny_bf16" --data-root "$root" --device emulated --check
expect 0 "the program says cluster = slurm, but this process is not in such a job: --check checks it as one worker" \
    env -u SLURM_STEP_ID "$dir/tiny_slurm" --data-root "$root" --check
expect 0 "checked: the datasets" env -u DDP_WORLD_SIZE "$dir/tiny_env" --data-root "$root" --check
if [ "$(ls "$root/checking")" = m.json ] && [ "$(cat "$root/checking/m.json")" = older ]; then
    echo "ok: --check left the folder as it was"
else
    echo "FAIL: --check wrote:" $(ls "$root/checking")
    failures=$((failures + 1))
fi
expect 1 "tiny.csv: no such file" "$dir/tiny" --check
expect 1 "steps_per_epoch is 99, but 8 samples make only 1 global batch" "$dir/tiny" --data-root "$root" --check \
    --steps-per-epoch 99
expect 1 "not a safetensors file" $tiny --check --load "$root/garbage"
expect 1 "\-\-save $root/no/such/dir/p.safetensors: cannot write" $tiny --check --save "$root/no/such/dir/p.safetensors"
expect 1 "\-\-metrics $root/no/such/dir/m.json: cannot write" $tiny --check --metrics "$root/no/such/dir/m.json"
expect 1 "\-\-predict $root/no/such/dir/p.npy: cannot write" $tiny --check --predict "$root/no/such/dir/p.npy"
# with a run folder, --check makes the run's decision and reads the checkpoint it
# would continue, changing nothing there
ckrun="$dir/tiny --data-root $root --run-dir $root/ckrun --threads 1"
DDP_TEST_SIGNAL=USR1@2 $ckrun --epochs 3 > /dev/null 2>&1
listing() { (cd "$root/ckrun" && ls -lR --full-time . && cat ./* checkpoints/* | cksum); }
before=$(listing)
expect 1 "$root/ckrun/checkpoints already holds checkpoints of another run: pass --resume" $ckrun --epochs 3 --check
expect 0 "^  resumes     $root/ckrun/checkpoints/step-0000000002.safetensors at step 2: the end of epoch 2 (its" \
    $ckrun --epochs 3 --check --resume
expect 0 "checked: the datasets, the parameters, the checkpoint and the files" $ckrun --epochs 3 --check --resume
expect 1 "\-\-resume: $root/ckrun/checkpoints/step-0000000002.safetensors was written by another program or with other settings: epochs 3 -> 1" \
    $ckrun --check --resume
[ "$(listing)" = "$before" ] && echo "ok: --check --resume left the run folder as it was" ||
    { echo "FAIL: --check --resume changed the run folder"; failures=$((failures + 1)); }
# resumed before the end of epoch 2, its line gives the rate of its last step (0.5), not 0
expect 0 "^epoch 2/3  loss [0-9.]*  accuracy [0-9.]*  val_loss [0-9.]*  val_accuracy [0-9.]*  lr 0.5 " \
    $ckrun --epochs 3 --resume
expect 0 "^  run folder  $root/new-run (made when the run starts): " $tiny --check --run-dir "$root/new-run"
[ -e "$root/new-run" ] && { echo "FAIL: --check made the run folder"; failures=$((failures + 1)); }
expect 1 "cannot make the run folder $root/garbage/run: Not a directory" $tiny --check --run-dir "$root/garbage/run"

# --data-stats: each feature's mean and std, worked out by hand from tiny.csv's rows
# (x0: 1 0 2 1, twice; ...); Fashion-MNIST's, every sample read, against NumPy's
expect 0 "^    mean = \[1, 1.25, 1, 1.5\]$" $tiny --data-stats
expect 0 "^    std  = \[0.70711, 0.82916, 1.2247, 1.5\]$" $tiny --data-stats
expect 0 "tiny_check.csv: 4 samples of \[4\], every one read, after scale = 1:" $tiny --data-stats --evaluate
expect 2 "\-\-data-stats and \-\-synthetic do not go together" $tiny --data-stats --synthetic
fashion=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
numpy=$(python3 -c "
import gzip, numpy as np
x = np.frombuffer(gzip.open('$fashion').read()[16:], np.uint8) / 255
print('    mean = %.5g' % x.mean()); print('    std  = %.5g' % x.std())")
stats=$("$dir/fashion_mlp" --data-stats 2>&1)
if [ "$(printf '%s\n' "$stats" | tail -n 2)" = "$numpy" ] &&
    printf '%s\n' "$stats" | grep -q "60000 samples of \[28, 28\], every one read"; then
    echo "ok: Fashion-MNIST's mean and std as NumPy has them: $(printf '%s' "$numpy" | tr -s ' \n' ' ')"
else
    echo "FAIL: Fashion-MNIST's --data-stats:"
    printf '%s\n--- NumPy:\n%s\n' "$stats" "$numpy"
    failures=$((failures + 1))
fi

# --dump-batch: tiny's first batch (no shuffle) is tiny.csv's 8 rows and their labels;
# fashion_mlp's (shuffled) holds the samples the first step trains on, as its trace says
expect 0 "$root/batch.npy: 8 samples of .*tiny.csv's first batch of epoch 1 (samples 0, 1, ...)" \
    $tiny --dump-batch "$root/batch.npy"
if python3 -c "
import numpy as np, sys
x, y = np.load('$root/batch.npy'), np.load('$root/batch-labels.npy')
rows = [[1, 2, 3, 4], [0, 1, 0, 1], [2, 2, 1, 0], [1, 0, 0, 1]] * 2
sys.exit(not (x.dtype == np.float32 and x.tolist() == rows and y.dtype == np.int32 and y.tolist() == [0, 1, 2, 1] * 2))"
then
    echo "ok: --dump-batch wrote tiny.csv's rows and labels"
else
    echo "FAIL: --dump-batch's files are not tiny.csv's rows and labels"
    failures=$((failures + 1))
fi
expect 2 "\-\-dump-batch batch.csv: the file's name ends in .npy" $tiny --dump-batch batch.csv
expect 2 "\-\-dump-batch writes a training batch: it does not go with \-\-evaluate" $tiny --dump-batch x.npy --evaluate
first=$("$dir/fashion_mlp" --dump-batch "$root/fashion.npy" --seed 9 2>&1 | sed -n 's/.*(samples \([0-9]*\), \([0-9]*\), ...).*/\1 \2/p')
"$dir/fashion_mlp" --seed 9 --epochs 1 --steps-per-epoch 1 --threads 1 --trace "$root/trace.json" \
    --run-dir "$root/traced" > /dev/null 2>&1
traced=$(python3 -c "
import json
t = json.load(open('$root/trace.json'))
print(*next(e for e in t['traceEvents'] if e.get('name') == 'data wait')['args']['samples'][:2])")
if [ -n "$first" ] && [ "$first" = "$traced" ]; then
    echo "ok: --dump-batch's samples are the first step's ($first)"
else
    echo "FAIL: --dump-batch's samples ($first) are not the first step's ($traced)"
    failures=$((failures + 1))
fi

# a log file gets whole lines: no carriage return, no escape sequence
$tiny --epochs 2 > "$root/log" 2>&1
if grep -q "$(printf '\r')" "$root/log" || grep -q "$(printf '\033')" "$root/log"; then
    echo "FAIL: the log has carriage returns or escape sequences"
    failures=$((failures + 1))
else
    echo "ok: the log has plain lines"
fi
# a log's progress lines say what is left of the epoch and, while epochs follow, of the run
"$dir/fashion_mlp" --synthetic --epochs 2 --steps-per-epoch 20 --log-every 10 --threads 1 --run-dir "$root/eta" \
    > "$root/log" 2>&1
if grep -q "^epoch 1/2  step 10/20 .* samples/s  ETA [0-9.]* s, run [0-9.]* s$" "$root/log" &&
    grep -q "^epoch 2/2  step 10/20 .* samples/s  ETA [0-9.]* s$" "$root/log" &&
    grep -q "^epoch 1/2  step 1/20 .* [0-9]* samples/s$" "$root/log"; then
    echo "ok: progress lines with the epoch's and the run's ETA"
else
    echo "FAIL: progress lines without their ETA:"
    grep "step" "$root/log"
    failures=$((failures + 1))
fi
# runs started together without --run-dir (a sweep): each its own folder under runs/,
# in the same second too (each name made by one process alone), with its own metrics
mkdir "$root/sweep"
for i in 1 2 3 4; do
    (cd "$root/sweep" && "$dir/tiny" --data-root "$root" --epochs 2 --steps-per-epoch 1 > "out$i" 2>&1) &
done
wait
folders=$(ls "$root/sweep/runs" | wc -l)
twos=$(for m in "$root/sweep"/runs/*/metrics.jsonl; do wc -l < "$m"; done | grep -c "^2$")
if [ "$folders" -eq 4 ] && [ "$twos" -eq 4 ]; then
    echo "ok: four runs started together: four run folders, $(ls "$root/sweep/runs" | tr '\n' ' ')each with its 2 epochs' metrics"
else
    echo "FAIL: four runs started together: $folders run folders, $twos with 2 lines of metrics:"
    ls "$root/sweep/runs"
    failures=$((failures + 1))
fi
[ "$failures" -eq 0 ] || { echo "$failures failed"; exit 1; }
