#!/usr/bin/env python3
"""watch.py PROGRAMS LAUNCHER...: save_best, early_stopping and reduce_lr on tests/train/tiny.ddp,
whose validation loss falls for 33 epochs and then rises (8 training rows learnt by
heart). LAUNCHER starts N workers given N (`ddprun -n`).

programs/tiny_watch saves the best val_loss and stops after 3 validations without a
lower one, with a checkpoint every epoch (tiny_watch_half the same for two workers); programs/tiny_watch_steps validates every 3
steps of 2-step epochs, saves the best val_accuracy and stops after 2 validations
without a higher one. The test checks, from each run's own metrics.jsonl:

- the run stops where the rule says (the first validation that ends `patience` in a
  row without improvement), before its 40 epochs, says so and exits 0;
- best.safetensors holds the parameters of the best validation (the first of equals),
  bit for bit those of the checkpoint of that step, with the step, figure and value in
  its metadata;
- a run stopped by a signal after the best and resumed stops at the same epoch with
  the same best file and figures (the watch's state travels in the checkpoint);
  resuming a run that stopped early trains nothing;
- validations in mid-epoch stop the run in mid-epoch, and no checkpoint claims the
  epoch that was cut short;
- the emulated GPU writes the same best parameters (copied back from its memory), and
  two workers stop where one does;
- a best file that cannot be written ends the run with status 1, naming it;
- programs/tiny_plateau halves the rate (down to 0.02) after 2 validations without a
  lower val_loss: each epoch's rate is the rule's from the figures before it, and a
  run stopped after a reduction and resumed goes on with the reduced rate."""
import json
import os
import subprocess
import sys

import datafiles
from datafiles import check, read_safetensors, run, scratch_folder, with_port
from tiny_check import CHECK, TRAIN, write_tiny_files

EPOCHS = 40


def figures(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def expected_stop(values, patience, higher):
    """(index of the best value, index of the validation that stops) by the rule:
    an improvement is strictly better than the best so far; None: no stop"""
    best, since = 0, 0
    for i in range(1, len(values)):
        if (values[i] > values[best]) if higher else (values[i] < values[best]):
            best, since = i, 0
        else:
            since += 1
            if since == patience:
                return best, i
    return best, None


def same_tensors(a, b):
    ta, _ = read_safetensors(a)
    tb, _ = read_safetensors(b)
    return ta.keys() <= tb.keys() and all(ta[k] == tb[k] for k in ta)


def launch(command, env=None):
    return subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
                          env=dict(os.environ, **(env or {})))


def main():
    programs, launcher = sys.argv[1], sys.argv[2:]
    root = scratch_folder()
    write_tiny_files(root, TRAIN, CHECK, "w0.safetensors")
    given = ["--data-root", root, "--load", os.path.join(root, "w0.safetensors"), "--epochs", str(EPOCHS),
             "--threads", "1"]
    watch = os.path.join(programs, "tiny_watch")

    # one worker: val_loss watched by both
    first = os.path.join(root, "first")
    out = run([watch, *given, "--run-dir", first])
    epochs = figures(first)
    losses = [e["val_loss"] for e in epochs]
    best, stop = expected_stop(losses, 3, False)
    check(stop is not None and len(epochs) == stop + 1 < EPOCHS and epochs[-1]["step"] == stop + 1,
          "the run stops at the validation the rule names (epoch %s of %d), not before or after" %
          (None if stop is None else stop + 1, EPOCHS))
    check("early stopping: val_loss has not improved on %.4f (after step %d) for 3 validations; training ends "
          "with epoch %d of %d" % (losses[best], best + 1, len(epochs), EPOCHS) in out and
          "done: %d epochs, %d steps" % (len(epochs), len(epochs)) in out, "it says why it stopped, and where")
    check("  best        the parameters of the best val_loss in %s/best.safetensors" % first in out and
          "  early stop  after 3 validations in a row without val_loss improving" in out,
          "the banner says what is watched")
    best_file = os.path.join(first, "best.safetensors")
    _, meta = read_safetensors(best_file)
    check(meta.get("step") == str(best + 1) and meta.get("figure") == "val_loss" and
          float(meta.get("value", "nan")) == losses[best],
          "best.safetensors says its step (%d), figure and value" % (best + 1))
    check(same_tensors(best_file, os.path.join(first, "ck", "step-%010d.safetensors" % (best + 1))),
          "best.safetensors holds that step's parameters bit for bit")
    check(out.count("best val_loss so far") == best + 1, "each new best is said (%d)" % (best + 1))

    # the emulated GPU, whose memory is apart from the host's: the same best, copied back
    gpu = os.path.join(root, "gpu")
    run([watch, *given, "--run-dir", gpu, "--device", "emulated"])
    got, meta = read_safetensors(os.path.join(gpu, "best.safetensors"))
    want, _ = read_safetensors(best_file)
    check(meta.get("step") == str(best + 1) and
          all(abs(g - w) <= 1e-6 for k in want for g, w in zip(got[k], want[k])),
          "on the emulated GPU the best file holds the same step's parameters, copied back from the device")

    # stopped by a signal after the best, then resumed: the same stop, file and figures
    again = os.path.join(root, "again")
    p = launch([watch, *given, "--run-dir", again], {"DDP_TEST_SIGNAL": "USR1@%d" % (best + 2)})
    check(p.returncode == 4, "a signal after the best stops the run with a checkpoint (status %d)" % p.returncode)
    out = run([watch, *given, "--run-dir", again, "--resume"])
    keys = ("epoch", "step", "loss", "val_loss", "val_accuracy")
    check([[e[k] for k in keys] for e in figures(again)] == [[e[k] for k in keys] for e in epochs],
          "resumed, it stops at the same epoch with the same figures")
    check(open(os.path.join(again, "best.safetensors"), "rb").read() == open(best_file, "rb").read() and
          "best val_loss so far" not in out, "and keeps the best file it had, bit for bit")
    out = run([watch, *given, "--run-dir", first, "--resume"])
    check("early stopping: val_loss has not improved" in out and len(figures(first)) == len(epochs) and
          "done: %d epochs, %d steps" % (len(epochs), len(epochs)) in out,
          "resuming a run that stopped early trains nothing")

    # validations in mid-epoch: the run stops in mid-epoch
    steps = os.path.join(root, "steps")
    out = run([os.path.join(programs, "tiny_watch_steps"), *given, "--run-dir", steps])
    logged = [line.split() for line in out.splitlines() if line.startswith("step ") and ": validation" in line]
    accuracies = [float(w[w.index("val_accuracy") + 1]) for w in logged]
    at = [int(w[1].rstrip(":")) for w in logged]
    best, stop = expected_stop(accuracies, 2, True)
    last = at[stop] if stop is not None else None
    check(stop is not None and at[-1] == last and last % 2 == 1 and "%d steps" % last in out,
          "validated every 3 steps, it stops after step %s, in mid-epoch" % last)
    checkpoints = sorted(os.listdir(os.path.join(steps, "ck")))
    check(checkpoints[-1] == "step-%010d.safetensors" % (last - 1), "no checkpoint of the epoch cut short")
    _, meta = read_safetensors(os.path.join(steps, "best.safetensors"))
    check(meta.get("step") == str(at[best]) and meta.get("figure") == "val_accuracy",
          "the best val_accuracy is the first of the highest (after step %d)" % at[best])

    # two workers of half the batch stop where one does
    two = os.path.join(root, "two")
    run(with_port(launcher, 2) + ["2", os.path.join(programs, "tiny_watch_half"), *given, "--run-dir", two])
    check([e["step"] for e in figures(two)] == [e["step"] for e in epochs] and
          read_safetensors(os.path.join(two, "best.safetensors"))[1].get("step") == str(len(epochs) - 3),
          "two workers stop at the epoch one does, with the same best step")

    # reduce_lr: the rate the rule gives, through a resume
    plateau = os.path.join(programs, "tiny_plateau")
    lowered = os.path.join(root, "lowered")
    out = run([plateau, *given, "--epochs", "60", "--run-dir", lowered])
    epochs = figures(lowered)
    rate, best, since, reductions, rule = 0.5, None, 0, 0, []
    for e in epochs:
        rule.append(rate)
        if best is None or e["val_loss"] < best:
            best, since = e["val_loss"], 0
        else:
            since += 1
        if since >= 2:
            since = 0
            lower = max(rate * 0.5, 0.02)
            reductions += lower < rate
            rate = lower
    check([e["lr"] for e in epochs] == rule and reductions == 5 and rule[-1] == 0.02,
          "each epoch's rate is the one reduce_lr's rule gives (%d reductions, down to 0.02)" % reductions)
    check(out.count("reduce_lr: val_loss has not improved") == reductions, "each reduction is said")
    again = os.path.join(root, "lowered_again")
    p = launch([plateau, *given, "--epochs", "60", "--run-dir", again],
               {"DDP_TEST_SIGNAL": "USR1@%d" % (rule.index(0.125) + 2)})
    run([plateau, *given, "--epochs", "60", "--run-dir", again, "--resume"])
    check(p.returncode == 4 and figures(again) == [{**e, "samples_per_sec": f["samples_per_sec"],
                                                    "seconds": f["seconds"]} for e, f in zip(epochs, figures(again))],
          "stopped after a reduction and resumed, the run goes on with the reduced rate, figure for figure")

    # a best file that cannot be written
    bad = os.path.join(root, "bad")
    os.makedirs(os.path.join(bad, "best.safetensors"))
    p = launch([watch, *given, "--run-dir", bad])
    check(p.returncode == 1 and "saving the best parameters" in p.stdout and
          os.path.join(bad, "best.safetensors") in p.stdout,
          "a best file that cannot be written ends the run naming it (status %d)" % p.returncode)
    sys.exit(1 if datafiles.failures else 0)


if __name__ == "__main__":
    main()
