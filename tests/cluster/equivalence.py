#!/usr/bin/env python3
"""equivalence.py PROGRAMS LAUNCHER...: N workers x batch B train exactly as one worker
x N B (S1): the same model and seed, dropout included (its masks follow the global
sample index, not the worker). LAUNCHER is the command that starts N workers, e.g.
`ddprun -n` or `srun -n`, completed here with the worker count.

- equivalence_16 with 4 workers against equivalence_64 with one, 20 steps (one step an
  epoch, so the metrics file gives every step's global loss);
- remainder_16 with 3 workers against remainder_48 with one: 98 samples, the last
  global batch of 2 leaves worker 2 empty, which still joins every collective.
Per tensor ||a - b|| / ||b|| <= 1e-5 and every step's loss within 1e-5 relative.

From the traces (--trace) of both runs: in every step each worker read its own slice
of the one worker's batch (their slices, in rank order, are that batch exactly, so
disjoint and together the same samples); every worker sent at least the bytes its
all-reduces need through the ring; and with buckets, a bucket's all-reduce began
before backward ended (the communication thread works during backward)."""
import json
import math
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from datafiles import read_safetensors, with_port  # noqa: E402

TOLERANCE = 1e-5


def run(command, env=None):
    p = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600, env=env)
    if p.returncode:
        sys.exit("FAIL: %s exited %d\n%s" % (" ".join(command), p.returncode, p.stdout[-3000:]))
    return p.stdout


def spans(path):
    """The trace's complete spans, by (pid, name)."""
    out = {}
    for e in json.load(open(path))["traceEvents"]:
        if e.get("ph") == "X":
            out.setdefault((e["pid"], e["name"]), []).append(e)
    return out


def check_trace(workers, many_path, one_path, params):
    many, one = spans(many_path), spans(one_path)
    counters = {e["pid"]: e["args"]["bytes"] for e in json.load(open(many_path))["traceEvents"]
                if e.get("name") == "ring bytes sent"}
    problems = []
    batches = {e["args"]["step"]: e["args"]["samples"] for e in one[(0, "data wait")]}
    for step, want in sorted(batches.items()):
        got = []
        for r in range(workers):
            got += [e["args"]["samples"] for e in many.get((r, "data wait"), []) if e["args"]["step"] == step][0]
        if got != want:
            problems.append("step %d: the workers read %s, one worker %s" % (step, got[:8], want[:8]))
    steps = len(batches)
    need = steps * 2 * (workers - 1) * (params // workers) * 4  # reduce-scatter and all-gather, f32
    for r in range(workers):
        if counters.get(r, 0) < need:
            problems.append("rank %d sent %s bytes through the ring, less than the %d its all-reduces need" % (
                r, counters.get(r), need))
    overlapped = 0
    for r in range(workers):
        backward = {e["args"]["step"]: e["ts"] + e["dur"] for e in many.get((r, "backward"), [])}
        buckets = [e for e in many.get((r, "all-reduce"), [])]
        overlapped += sum(1 for e in buckets if e["ts"] < backward.get(e["args"]["step"], 0))
    nbuckets = len({e["args"]["bucket"] for e in many.get((0, "all-reduce"), [])})
    if nbuckets > 1 and overlapped == 0:
        problems.append("no bucket's all-reduce began before backward ended")
    return problems, "%d steps of samples match, >= %.1f MB sent per worker, %d bucket(s), %d all-reduces " \
        "begun during backward" % (steps, need / 1e6, nbuckets, overlapped)


def compare(name, workers, launcher, programs, small, big, tmp, extra=(), env=None, traced=True):
    """extra: flags of both runs (--device emulated); env: theirs; traced: the ring's
    traces checked (its bytes and overlap). Returns (ok, the many workers' output)."""
    a, b = (os.path.join(tmp, "%s_%s.safetensors" % (name, k)) for k in ("many", "one"))
    ma, mb = (os.path.join(tmp, "%s_%s.json" % (name, k)) for k in ("many", "one"))
    ta, tb = (os.path.join(tmp, "%s_%s.trace" % (name, k)) for k in ("many", "one"))
    out = run(with_port(launcher, workers) + [str(workers), os.path.join(programs, small), "--threads", "1", "--save",
                                              a, "--metrics", ma, "--trace", ta] + list(extra), env)
    run([os.path.join(programs, big), "--threads", "1", "--save", b, "--metrics", mb, "--trace", tb] + list(extra), env)
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
    print("%s %s: %d workers x %s against 1 x %s over %d epochs%s: worst tensor %.2e, worst loss %.2e" % (
        "ok  " if ok else "FAIL", " ".join(launcher), workers, small, big, len(lb), " ".join([""] + list(extra)),
        worst, step_worst))
    if not traced:
        return ok, out
    problems, summary = check_trace(workers, ta, tb, sum(len(v) for v in one.values()))
    for p in problems:
        print("FAIL %s: %s" % (name, p))
    if not problems:
        print("ok   traces: %s" % summary)
    return ok and not problems, out


def main():
    programs, launcher = sys.argv[1], sys.argv[2:]
    tmp = tempfile.mkdtemp()
    ok = compare("steps", 4, launcher, programs, "equivalence_16", "equivalence_64", tmp)[0]
    ok &= compare("remainder", 3, launcher, programs, "remainder_16", "remainder_48", tmp)[0]
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
