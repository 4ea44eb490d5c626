#!/usr/bin/env python3
"""statistics.py PROGRAMS DDPRUN: batch normalisation with three workers under ddprun
(tests/cluster/statistics.ddp): the last global batch leaves a worker empty, the
validation set (2 samples) is smaller than the job, and only worker 0 is given --save
and --metrics, as a user would (every worker must still run the same collectives).

statistics_steps validates every 2 steps, statistics_end only after the last step.
Validation must not change the training: every epoch's training figures are the same
in both runs, and so are the trained weights, bit for bit; the running statistics
(averaged over the workers at different moments) and the final validation agree to
1e-6. Both runs end with the runtime's own check that every worker holds the same
parameters and statistics."""
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from datafiles import read_safetensors, with_port  # noqa: E402

TOLERANCE = 1e-6


def train(programs, ddprun, name, tmp):
    save, metrics = os.path.join(tmp, name + ".safetensors"), os.path.join(tmp, name + ".json")
    program = os.path.join(programs, name)
    worker = ('if [ "$DDP_RANK" = 0 ]; then exec "$0" --threads 1 --save "$1" --metrics "$2"; '
              'else exec "$0" --threads 1; fi')
    p = subprocess.run(with_port([ddprun], 3) + ["-n", "3", "sh", "-c", worker, program, save, metrics], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=300)
    if p.returncode:
        sys.exit("FAIL: %s with --save on worker 0 only: status %d\n%s" % (name, p.returncode, p.stdout[-3000:]))
    epochs = [json.loads(line) for line in open(metrics)]
    tensors, _ = read_safetensors(save)
    return epochs, tensors


def relative(a, b):
    return abs(a - b) / max(abs(b), 1e-30)


def main():
    programs, ddprun = sys.argv[1], sys.argv[2]
    tmp = tempfile.mkdtemp()
    steps, steps_tensors = train(programs, ddprun, "statistics_steps", tmp)
    end, end_tensors = train(programs, ddprun, "statistics_end", tmp)
    problems = []
    if len(steps) != len(end):
        problems.append("%d epoch lines against %d" % (len(steps), len(end)))
    for a, b in zip(steps, end):
        for key in ("loss", "accuracy"):
            if a[key] != b[key]:
                problems.append("epoch %d: training %s %r with validations every 2 steps, %r without" % (
                    a["epoch"], key, a[key], b[key]))
    for key in ("val_loss", "val_accuracy"):
        if relative(steps[-1][key], end[-1][key]) > TOLERANCE:
            problems.append("final %s %r against %r" % (key, steps[-1][key], end[-1][key]))
    worst = 0.0
    for name, values in end_tensors.items():
        if "running_" in name:
            worst = max([worst] + [relative(x, y) for x, y in zip(steps_tensors[name], values)])
        elif steps_tensors[name] != values:
            problems.append("%s differs between the runs" % name)
    if worst > TOLERANCE:
        problems.append("running statistics differ by %.2e relative" % worst)
    for p in problems:
        print("FAIL: " + p)
    if not problems:
        print("ok: 3 workers, --save on worker 0 only: %d epochs of the same training figures with and without "
              "validations every 2 steps, the same weights, statistics within %.1e, final val_loss %.6f" % (
                  len(end), worst, end[-1]["val_loss"]))
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
