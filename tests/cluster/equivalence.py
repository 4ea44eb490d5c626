#!/usr/bin/env python3
"""equivalence.py PROGRAMS LAUNCHER...: N workers x batch B train exactly as one worker
x N B (S1): the same model and seed, dropout included (its masks follow the global
sample index, not the worker). LAUNCHER is the command that starts N workers, e.g.
`ddprun -n` or `srun -n`, completed here with the worker count.

- equivalence_16 with 4 workers against equivalence_64 with one, 20 steps (one step an
  epoch, so the metrics file gives every step's global loss);
- remainder_16 with 3 workers against remainder_48 with one: 98 samples, the last
  global batch of 2 leaves worker 2 empty, which still joins every collective.
Per tensor ||a - b|| / ||b|| <= 1e-5 and every step's loss within 1e-5 relative."""
import json
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from datafiles import read_safetensors  # noqa: E402

TOLERANCE = 1e-5


def run(command):
    p = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    if p.returncode:
        sys.exit("FAIL: %s exited %d\n%s" % (" ".join(command), p.returncode, p.stdout[-3000:]))
    return p.stdout


def compare(name, workers, launcher, programs, small, big, tmp):
    a, b = (os.path.join(tmp, "%s_%s.safetensors" % (name, k)) for k in ("many", "one"))
    ma, mb = (os.path.join(tmp, "%s_%s.json" % (name, k)) for k in ("many", "one"))
    run(launcher + [str(workers), os.path.join(programs, small), "--threads", "1", "--save", a, "--metrics", ma])
    run([os.path.join(programs, big), "--threads", "1", "--save", b, "--metrics", mb])
    ok = True
    many, _ = read_safetensors(a)
    one, _ = read_safetensors(b)
    worst = 0.0
    for tensor in one:
        diff = math.sqrt(sum((x - y) ** 2 for x, y in zip(many[tensor], one[tensor])))
        norm = math.sqrt(sum(y * y for y in one[tensor]))
        worst = max(worst, diff / norm)
    ok &= worst <= TOLERANCE
    la = [json.loads(line)["loss"] for line in open(ma)]
    lb = [json.loads(line)["loss"] for line in open(mb)]
    step_worst = max(abs(x - y) / abs(y) for x, y in zip(la, lb)) if la and len(la) == len(lb) else float("inf")
    ok &= step_worst <= TOLERANCE
    print("%s %s: %d workers x %s against 1 x %s over %d epochs: worst tensor %.2e, worst loss %.2e" % (
        "ok  " if ok else "FAIL", " ".join(launcher), workers, small, big, len(lb), worst, step_worst))
    return ok


def main():
    programs, launcher = sys.argv[1], sys.argv[2:]
    tmp = tempfile.mkdtemp()
    ok = compare("steps", 4, launcher, programs, "equivalence_16", "equivalence_64", tmp)
    ok &= compare("remainder", 3, launcher, programs, "remainder_16", "remainder_48", tmp)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
