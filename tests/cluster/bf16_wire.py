#!/usr/bin/env python3
"""bf16_wire.py PROGRAMS STANDIN LAUNCHER...: allreduce_precision = bf16, the gradients
summed in bf16, on one SGD step of tests/cluster/equivalence.ddp: 4 workers x 16
against one worker x 64 (which sums nothing, so its step is the exact f32 one).

Summing in bf16 rounds each worker's gradient and each partial sum to 8 bits of
mantissa, so the step may differ from the exact one by a few times 2^-9 of its size,
growing with the number of workers; by nothing would mean the sums were not bf16. For
every tensor, with d the exact step (after - before, one worker) and e the 4-worker
bf16 step's distance from it:
    0 < max |e| <= 4 * 2^-8 * max |d|
through the CPU ring, and on the emulated device through the stand-in NCCL and through
the ring staged in pinned memory. The banner says the gradients travel in bf16. The
same 4 workers in f32 (the default) stay within 1e-5 (the equivalence test's bound)."""
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from datafiles import read_safetensors, with_port  # noqa: E402
from equivalence import run  # noqa: E402

WORKERS = 4
BOUND = WORKERS * 2.0 ** -8


def params(path):
    return read_safetensors(path)[0]


def worst_ratio(got, exact, before):
    """max over tensors of max|got - exact| / max|exact - before|"""
    worst = 0.0
    for name in exact:
        step = max(abs(a - b) for a, b in zip(exact[name], before[name]))
        off = max(abs(a - b) for a, b in zip(got[name], exact[name]))
        if step > 0:
            worst = max(worst, off / step)
    return worst


def main():
    programs, standin, launcher = sys.argv[1], sys.argv[2], sys.argv[3:]
    tmp = tempfile.mkdtemp()
    env = dict(os.environ, DDP_CUDA_LIBRARY_PATH=standin)
    one = os.path.join(programs, "equivalence_64")
    before, exact = os.path.join(tmp, "before.safetensors"), os.path.join(tmp, "exact.safetensors")
    run([one, "--epochs", "1", "--lr", "1e-30", "--save", before])  # the initial weights: a step of nothing
    run([one, "--epochs", "1", "--save", exact])
    p0, p1 = params(before), params(exact)
    ok = True
    cases = [("f32 through the CPU ring", "equivalence_16", []),
             ("bf16 through the CPU ring", "equivalence_16_bf16wire", []),
             ("bf16 through the stand-in NCCL", "equivalence_16_nccl_bf16wire", ["--device", "emulated"]),
             ("bf16 through the ring, staged", "equivalence_16_ring_bf16wire", ["--device", "emulated"])]
    for what, program, extra in cases:
        out_path = os.path.join(tmp, program + ".safetensors")
        command = with_port(launcher, WORKERS) + [str(WORKERS), os.path.join(programs, program), "--epochs", "1",
                                                   "--save", out_path] + extra
        out = run(command, env=env)
        r = worst_ratio(params(out_path), p1, p0)
        if "bf16" in what:
            good = 0 < r <= BOUND and "in bf16 (allreduce_precision = bf16" in out
            print("%s %s: worst tensor off the exact step by %.3g of the step (0 < it <= %.3g wanted)%s" % (
                "ok  " if good else "FAIL", what, r, BOUND, "" if good else "\n" + out[-2000:]))
        else:
            good = r <= 1e-5
            print("%s %s: worst tensor off the exact step by %.3g of the step (1e-5 at most)" % (
                "ok  " if good else "FAIL", what, r))
        ok &= good
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
