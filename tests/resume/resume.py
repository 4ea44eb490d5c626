#!/usr/bin/env python3
"""resume.py PROGRAMS WORKERS [LAUNCHER...]: a run stopped by a signal and resumed is the
run that was never stopped, bit for bit: the same saved parameters and the same figures
in metrics.jsonl (timings aside). resume_16 trains alone (WORKERS 1), resume_8 with 2
workers started by LAUNCHER (`ddprun -n`, `srun -n`): the same global batch of 16.

Before the resume, --check --resume reads the checkpoint and says where the run would
go on, leaving the run folder as it was. With WORKERS 1, also what goes wrong around it: SIGINT (status 130); a damaged newest
checkpoint named and the one before it used; a crash at each named point of a
checkpoint's write (before the rename, before the folder's sync, while pruning) leaving
a checkpoint to resume from; a resume with other settings refused with each difference,
unless --resume-changed; a new run refused a folder that holds checkpoints; Python's
safetensors reading a checkpoint (when installed: tests/ci.sh installs it)."""
import os
import random
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from datafiles import check, read_safetensors, with_port  # noqa: E402
import datafiles  # noqa: E402

programs, workers, launcher = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
program = os.path.join(programs, "resume_16" if workers == 1 else "resume_8")
root = datafiles.scratch_folder()


def write_points(name, n, seed):
    rng = random.Random(seed)
    with open(os.path.join(root, name), "w") as f:
        f.write("a,b,c,d,e,f,g,h,y\n")
        for _ in range(n):
            x = [rng.uniform(-1, 1) for _ in range(8)]
            y = (x[0] + x[1] > 0) + (x[2] > 0.5)
            f.write(",".join("%.6f" % v for v in x) + ",%d\n" % y)


write_points("points.csv", 200, 1)  # 12 global batches of 16 an epoch, 8 dropped
write_points("points_check.csv", 50, 2)


def train(run_dir, *args, env=None, expect=0):
    """The program (under the launcher with several workers) in run_dir; its output."""
    command = [program, "--data-root", root, "--run-dir", run_dir, "--threads", "1"] + list(args)
    if workers > 1:
        command = with_port(launcher, workers) + [str(workers)] + command
    p = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                       env=dict(os.environ, **(env or {})), cwd=root)
    if p.returncode != expect:
        sys.exit("FAIL: %s exited %d, not %d\n%s" % (" ".join(command), p.returncode, expect, p.stdout[-3000:]))
    return p.stdout


def figures(run_dir):
    """metrics.jsonl without its timings"""
    lines = []
    for line in open(os.path.join(root, run_dir, "metrics.jsonl")):
        lines.append(", ".join(part for part in line.strip().strip("{}").split(", ")
                               if not part.startswith(('"samples_per_sec"', '"seconds"'))))
    return lines


def checkpoints(run_dir):
    folder = os.path.join(root, run_dir, "ckpt")
    return sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))


def scalars(run_dir):
    """TensorBoard's view of the run folder's event files (None without tensorboard),
    samples/s aside: the points a stopped run wrote after the checkpoint that the run
    resumed from are dropped, as the SessionLog START says."""
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    except ImportError:
        return None
    events = EventAccumulator(os.path.join(root, run_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"] if tag != "samples_per_sec"}


def same_run(run_dir, what):
    saved = open(os.path.join(root, run_dir + ".safetensors"), "rb").read()
    check(saved == reference and figures(run_dir) == reference_figures,
          "%s: the same parameters bit for bit and the same %d lines of metrics.jsonl as the run never stopped"
          % (what, len(reference_figures)))
    seen = scalars(run_dir)
    if seen is None:
        check(os.environ.get("CI") != "true", "TensorBoard is not installed (CI installs it): its view unchecked")
    else:
        check(seen == reference_scalars, "%s: TensorBoard shows the same %d scalars as the run never stopped"
              % (what, sum(len(v) for v in seen.values())))


train("whole", "--save", "whole.safetensors")
reference = open(os.path.join(root, "whole.safetensors"), "rb").read()
reference_figures = figures("whole")
reference_scalars = scalars("whole")
if reference_scalars is not None:  # TensorBoard reads nothing from a file whose checksums are wrong
    check(sorted(reference_scalars) == ["learning_rate", "train/accuracy", "train/loss", "val/accuracy", "val/loss"]
          and len(reference_scalars["train/loss"]) == 8 and len(reference_scalars["val/loss"]) == 7,
          "TensorBoard reads the run's events: %s" % {k: len(v) for k, v in reference_scalars.items()})
check(len(reference_figures) == 4 and checkpoints("whole") == ["step-0000000040.safetensors",
                                                              "step-0000000045.safetensors"],
      "%d worker(s), 4 epochs of 12 steps, a checkpoint every 5 steps, the newest 2 kept: %s"
      % (workers, checkpoints("whole")))

# a signal in mid-epoch (step 17 of 48, epoch 2), to worker 1 only when there are two
signal = "USR1@17" + (":1" if workers > 1 else "")
out = train("stopped", env={"DDP_TEST_SIGNAL": signal}, expect=4)
check("SIGUSR1" in out and "stopped after step 17" in out and checkpoints("stopped")[-1] == "step-0000000017.safetensors",
      "SIGUSR1 (%s): every worker stops after step 17, status 4, checkpoint step-0000000017" % signal)
logs = ["log.txt"] + ["log.rank%d.txt" % r for r in range(1, workers)]
said = [open(os.path.join(root, "stopped", log)).read() for log in logs]
check(all("stopped after step 17" in text for text in said), "each worker's log in the run folder: %s" % logs)


def folder_state(run_dir):
    """Every file under run_dir with its size, time and bytes."""
    state = {}
    for where, _, names in os.walk(os.path.join(root, run_dir)):
        for name in names:
            path = os.path.join(where, name)
            state[path] = (os.stat(path).st_mtime_ns, open(path, "rb").read())
    return state


before = folder_state("stopped")
out = train("stopped", "--check", "--resume")
check("resumes     " in out and "step-0000000017.safetensors at step 17: epoch 2, step 6 of 12 next" in out and
      "checked: " in out and folder_state("stopped") == before,
      "--check --resume: the checkpoint read%s, where the run goes on said, the run folder untouched"
      % (" by worker 0 and sent to the other" if workers > 1 else ""))
out = train("stopped", "--resume", "--save", "stopped.safetensors")
check("resumed     " in out and "step-0000000017.safetensors at step 17: epoch 2, step 6 of 12 next" in out,
      "--resume names the checkpoint and where the run goes on: %s" %
      [line for line in out.splitlines() if "resumed" in line][:1])
same_run("stopped", "stopped at step 17 and resumed")

if workers == 1:
    # on the emulated GPU: the state comes down for the checkpoint and goes up on resume
    train("gpu-whole", "--device", "emulated", "--save", "gpu-whole.safetensors")
    train("gpu-stopped", "--device", "emulated", env={"DDP_TEST_SIGNAL": "USR1@17"}, expect=4)
    train("gpu-stopped", "--device", "emulated", "--resume", "--save", "gpu-stopped.safetensors")
    check(open(os.path.join(root, "gpu-stopped.safetensors"), "rb").read() ==
          open(os.path.join(root, "gpu-whole.safetensors"), "rb").read() and
          figures("gpu-stopped") == figures("gpu-whole"),
          "on the emulated GPU too: stopped at step 17 and resumed, the run never stopped bit for bit")
    p = subprocess.run([program, "--data-root", root, "--run-dir", "gpu-stopped", "--resume"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, cwd=root)
    check(p.returncode == 1 and "device emulated -> cpu" in p.stdout,
          "a GPU's checkpoint resumed on the CPU is refused, the device named: %s"
          % p.stdout.strip().splitlines()[-1][-100:])

    out = train("interrupted", env={"DDP_TEST_SIGNAL": "INT@30"}, expect=130)
    check("SIGINT" in out and "stopped after step 30" in out, "SIGINT: stops after step 30 with a checkpoint, status 130")
    # the newest checkpoint damaged: named, and the one before it used
    newest = os.path.join(root, "interrupted", "ckpt", checkpoints("interrupted")[-1])
    blob = bytearray(open(newest, "rb").read())
    blob[-3] ^= 0x40
    open(newest, "wb").write(blob)
    out = train("interrupted", "--resume", "--save", "interrupted.safetensors")
    check("step-0000000030.safetensors is damaged" in out and "step-0000000025.safetensors at step 25" in out,
          "a damaged checkpoint is named and the one before it used")
    same_run("interrupted", "SIGINT at step 30, its checkpoint damaged, resumed from step 25")

    # a crash at each point of a checkpoint's write leaves one to resume from
    for point, resumes_at in (("before-rename", 17), ("before-folder-sync", 20), ("during-pruning", 20)):
        folder = "crash-" + point
        train(folder, env={"DDP_TEST_SIGNAL": "USR1@17"}, expect=4)
        train(folder, "--resume", env={"DDP_CRASH_AT": point}, expect=9)
        left = checkpoints(folder)
        out = train(folder, "--resume", "--save", folder + ".safetensors")
        check("at step %d:" % resumes_at in out, "a crash %s in writing step 20's checkpoint leaves %s; the run "
              "resumes at step %d" % (point.replace("-", " "), left, resumes_at))
        same_run(folder, "after that crash")

    # other settings: refused with each difference, unless --resume-changed
    train("changed", env={"DDP_TEST_SIGNAL": "USR1@9"}, expect=4)
    p = subprocess.run([program, "--data-root", root, "--run-dir", "changed", "--resume", "--lr", "0.5",
                        "--seed", "3"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=root)
    check(p.returncode == 1 and "seed 7 -> 3" in p.stdout and "learning_rate program -> 0.5" in p.stdout
          and "--resume-changed" in p.stdout,
          "other settings refused, each named: %s" % p.stdout.strip().splitlines()[-1][-160:])
    out = train("changed", "--resume", "--resume-changed", "--lr", "0.5")
    check("changed: " in out and "learning_rate program -> 0.5" in out,
          "--resume-changed continues, the banner naming what changed")
    p = subprocess.run([program, "--data-root", root, "--run-dir", "changed"], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, cwd=root)
    check(p.returncode == 1 and "already holds checkpoints" in p.stdout,
          "a new run refuses a folder with checkpoints: %s" % p.stdout.strip().splitlines()[-1][-120:])

    # what Python's safetensors reads: the model's tensors, the optimizer's, the run's place
    tensors, meta = read_safetensors(os.path.join(root, "whole", "ckpt", "step-0000000045.safetensors"))
    check(sorted(tensors) == ["net.hidden.weight", "net.logits.bias", "net.logits.weight", "net.norm.bias",
                              "net.norm.running_mean", "net.norm.running_var", "net.norm.weight",
                              "optimizer.state.0", "optimizer.state.1", "worker.0.accumulators"]
          and meta["step"] == "45" and meta["epoch"] == "3" and meta["batch"] == "9"
          and meta["format"] == "ddp-checkpoint",
          "a checkpoint's tensors and metadata: %s" % sorted(tensors))
    try:
        from safetensors.numpy import load_file
        loaded = load_file(os.path.join(root, "whole", "ckpt", "step-0000000045.safetensors"))
        check(sorted(loaded) == sorted(tensors), "Python's safetensors reads it")
    except ImportError:
        check(os.environ.get("CI") != "true", "Python's safetensors is not installed (CI installs it)")

sys.exit(1 if datafiles.failures else 0)
