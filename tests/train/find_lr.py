#!/usr/bin/env python3
"""find_lr.py PROGRAMS LAUNCHER...: --find-lr, the learning-rate range test, on
tests/train/tiny.ddp, whose every step is one full batch of its 8 rows, so that the
test follows the sweep by hand (float64, the standard library only): step k trains at
rate low * (high / low)^(k / (steps - 1)) from the weights step k - 1 left. The rows
are 4 points with two labels each, which no weights fit, so that high rates diverge.

- the file holds a row a step: the rate, the step's own loss (at the weights before
  its update) as computed here, and the smoothed loss (an exponential mean of 0.98,
  bias-corrected); the sweep stops at the first step whose smoothed loss passes 4
  times its lowest, and the suggestion is the rate where the smoothed loss falls
  fastest before its lowest, past the first tenth of the steps;
- a progress line (not a terminal) at the first step and every tenth of the steps,
  with the step's rate and loss;
- with two steps an epoch, each step's loss is its batch's own, not the epoch's mean;
- a loss that is no longer finite ends the sweep (status 0), not the run;
- two workers of half the batch under LAUNCHER (`ddprun -n`) and the emulated GPU
  write the same losses; nothing else is written (no run folder);
- bad usage (a file not .csv, --find-lr with --save, --find-lr-steps alone, a range
  upside down) exits 2, and a file that cannot be written exits 1 before any step."""
import math
import os
import subprocess
import sys

import datafiles
from datafiles import check, run, scratch_folder, with_port
from tiny_check import CHECK, TRAIN, figures, write_tiny_files

LOW, HIGH, STEPS = 0.01, 1000.0, 60
ROWS = TRAIN[:4] + [r[:4] + ((r[4] + 1) % 3,) for r in TRAIN[:4]]


def by_hand(w, b, steps, low, high, batch=8):
    """(rate, loss) of each step of the sweep, whose batches take the rows in order,
    until a loss is no longer finite"""
    out = []
    for k in range(steps):
        rate = low * (high / low) ** (k / (steps - 1))
        first = k * batch % len(ROWS)
        try:
            loss, _, gw, gb = figures(w, b, ROWS[first:first + batch])
        except (OverflowError, ValueError):
            break
        out.append((rate, loss))
        w = [[w[i][j] - rate * gw[i][j] for j in range(3)] for i in range(4)]
        b = [b[j] - rate * gb[j] for j in range(3)]
    return out


def read_csv(path):
    lines = open(path).read().splitlines()
    return lines[0], [tuple(float(v) for v in line.split(",")) for line in lines[1:]]


def suggestion(rows, planned):
    smoothed = [r[3] for r in rows]
    lowest = min(range(len(smoothed)), key=lambda k: (smoothed[k], k))
    best, fastest = None, 0.0
    for k in range(max(1, planned // 10), lowest + 1):
        slope = (smoothed[k] - smoothed[k - 1]) / (math.log(rows[k][1]) - math.log(rows[k - 1][1]))
        if slope < fastest:
            best, fastest = k, slope
    return best


def status_of(command):
    p = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    return p.returncode, p.stdout


def main():
    programs, launcher = os.path.abspath(sys.argv[1]), [os.path.abspath(sys.argv[2])] + sys.argv[3:]
    tiny = os.path.join(programs, "tiny")
    root = scratch_folder()
    w0, b0 = write_tiny_files(root, ROWS, CHECK, "w0.safetensors")
    os.chdir(root)
    given = ["--data-root", root, "--load", "w0.safetensors", "--threads", "1", "--find-lr-steps", str(STEPS),
             "--find-lr-range", "%g,%g" % (LOW, HIGH)]

    out = run([tiny, *given, "--find-lr", "sweep.csv"])
    header, rows = read_csv("sweep.csv")
    want = by_hand(w0, b0, STEPS, LOW, HIGH)
    check(header == "step,learning_rate,loss,smoothed_loss" and [r[0] for r in rows] == list(range(1, len(rows) + 1)),
          "a row a step, numbered")
    check(all(abs(r[1] - w[0]) <= 1e-7 * w[0] for r, w in zip(rows, want)), "the rates rise geometrically")
    agree = [abs(r[2] - w[1]) <= 1e-4 * max(1.0, abs(w[1])) for r, w in zip(rows, want)]
    check(len(rows) > 10 and all(agree[:20]),
          "each step's loss is the loss by hand at the weights before its update (%d steps)" % len(rows))
    mean, smooth_ok = 0.0, True
    for k, r in enumerate(rows):
        mean = 0.98 * mean + 0.02 * r[2]
        smooth_ok &= abs(r[3] - mean / (1 - 0.98 ** (k + 1))) <= 1e-6 * max(1.0, abs(r[3]))
    check(smooth_ok, "the smoothed loss is the bias-corrected exponential mean of the losses")
    smoothed = [r[3] for r in rows]
    passed = [k for k in range(len(rows)) if smoothed[k] > 4 * min(smoothed[:k + 1])]
    check(len(rows) < STEPS and passed == [len(rows) - 1] and
          "(the smoothed loss passed 4 times its lowest)" in out,
          "the sweep stops at the first step past 4 times the lowest smoothed loss (step %d)" % len(rows))
    best = suggestion(rows, STEPS)
    check(best is not None and "suggested learning rate: %.3g, where the smoothed loss falls fastest (at step %d)"
          % (rows[best][1], best + 1) in out, "it suggests the rate where the smoothed loss falls fastest")
    progress = [line for line in out.splitlines() if line.startswith("learning-rate range test: step ")]
    tenth = max(1, STEPS // 10)
    check([int(line.split()[4].split("/")[0]) for line in progress] ==
          [k for k in range(1, len(rows) + 1) if k == 1 or k % tenth == 0] and
          all(line.split()[4].endswith("/%d" % STEPS) for line in progress) and
          "learning rate %.3g  loss %.4f" % (rows[0][1], rows[0][2]) in progress[0],
          "a progress line at the first step and every tenth of them, with its rate and loss")
    check(sorted(os.listdir(root)) == ["sweep.csv", "tiny.csv", "tiny_check.csv", "w0.safetensors"],
          "nothing else is written (no run folder)")

    # two steps an epoch: each step's loss is its own, not the epoch's so far
    run([os.path.join(programs, "tiny_watch_half"), *given, "--find-lr", "half.csv"])
    _, half = read_csv("half.csv")
    want = by_hand(w0, b0, STEPS, LOW, HIGH, batch=4)
    check(len(half) > 10 and all(abs(r[2] - w[1]) <= 1e-4 * max(1.0, abs(w[1])) for r, w in zip(half[:20], want)),
          "with two steps an epoch, each step's loss is its own batch's")

    # a loss that is no longer finite ends the sweep, not the run
    status, out = status_of([tiny, "--data-root", root, "--load", "w0.safetensors", "--find-lr-steps", "2",
                             "--find-lr-range", "1e40,1e41", "--find-lr", "nan.csv"])
    _, nan_rows = read_csv("nan.csv")
    check(status == 0 and "(the loss was no longer finite)" in out and len(nan_rows) == 1,
          "a loss no longer finite ends the sweep, status 0 (%d of 2 steps)" % len(nan_rows))

    # two workers of half the batch, and the emulated GPU: the same losses
    run(with_port(launcher, 2) + ["2", os.path.join(programs, "tiny_watch_half"), *given, "--find-lr", "two.csv"])
    run([tiny, *given, "--find-lr", "gpu.csv", "--device", "emulated"])
    for name, what in (("two.csv", "two workers of half the batch"), ("gpu.csv", "the emulated GPU")):
        _, other = read_csv(name)
        check(len(other) == len(rows) and all(abs(a[2] - b[2]) <= 1e-5 * max(1.0, abs(b[2]))
                                              for a, b in zip(other[:20], rows[:20])),
              "%s sweep the same losses" % what)

    # bad usage, and a file that cannot be written
    for args, what in ((["--find-lr", "sweep.txt"], "a file not .csv"),
                       (["--find-lr", "a.csv", "--save", "p.safetensors"], "--find-lr with --save"),
                       (["--find-lr-steps", "20"], "--find-lr-steps without --find-lr"),
                       (["--find-lr", "a.csv", "--find-lr-range", "1,0.1"], "a range upside down")):
        status, out = status_of([tiny, "--data-root", root, *args])
        check(status == 2, "%s: status 2 (%d)" % (what, status))
    status, out = status_of([tiny, "--data-root", root, "--find-lr", os.path.join(root, "no", "such.csv")])
    check(status == 1 and "such.csv: cannot write" in out and "learning-rate range test" not in out,
          "a file that cannot be written: status 1, before any step (%d)" % status)
    sys.exit(1 if datafiles.failures else 0)


if __name__ == "__main__":
    main()
