#!/usr/bin/env python3
"""bn_far_from_zero.py: batch-norm statistics of values far from zero, on the CPU and
the emulated device, one stage (batch 8) and two (batch 1024, fuse.c).

tests/train/bf16.ddp built with precision = fp32 trains one step on rows whose
features are 1e8 plus multiples of 8 (each one an f32 value, their spread about 80).
The statistics sum each value's difference with a shift in f64 (kernels.c); summed as
they are, their squares (1e16 each) would lose the variance's digits. The running
statistics saved after the step must match the batch's mean and variance, computed
here exactly, to 1e-6; the same sums without the shift are shown off by far more.

Then the batch-8 program with drop_remainder = false trains an epoch of 9 rows: its
second step has one sample, which must leave the running statistics as the first step
left them (an unbiased variance of one value would divide by zero).

usage: bn_far_from_zero.py PROGRAM_BATCH_8 PROGRAM_BATCH_1024 PROGRAM_BATCH_8_REMAINDER"""
import os
import sys
from fractions import Fraction

from datafiles import check, read_safetensors, run, scratch_folder
import datafiles

BASE, ROWS, MOMENTUM = 10 ** 8, 1024, 0.9


def feature(row, c):
    """1e8 plus a multiple of 8 in [-160, 160]: an f32 value"""
    return BASE + 8 * (((row * 7919 + c * 104729) % 41) - 20)


def exact(values):
    """the mean and the biased variance, as fractions"""
    n = len(values)
    mean = sum(Fraction(v) for v in values) / n
    return mean, sum((Fraction(v) - mean) ** 2 for v in values) / n


def unshifted_variance(values):
    """the variance from f64 sums of the values and of their squares, in order"""
    s1 = s2 = 0.0
    for v in values:
        s1 += float(v)
        s2 += float(v) * float(v)
    mean = s1 / len(values)
    return s2 / len(values) - mean * mean


def write_rows(root, rows):
    with open(os.path.join(root, "big.csv"), "w") as f:
        f.write("x0,x1,x2,x3,label\n")
        for r in range(rows):
            f.write(",".join(str(feature(r, c)) for c in range(4)) + ",%d\n" % (r % 3))


def main():
    root, remainder_root = scratch_folder(), scratch_folder()
    write_rows(root, ROWS)
    write_rows(remainder_root, 9)
    cases = [(sys.argv[1], root, 8, ["--steps-per-epoch", "1"]), (sys.argv[2], root, ROWS, ["--steps-per-epoch", "1"]),
             (sys.argv[3], remainder_root, 8, [])]
    for program, data, batch, steps in cases:
        for device in ("cpu", "emulated"):
            saved = os.path.join(root, "saved.safetensors")
            said = run([program, "--device", device, "--data-root", data, "--save", saved] + steps)
            if not steps:
                check("1 epoch, 2 steps, 9 samples" in said, "%s: the epoch of 9 rows ends with a step of one "
                      "sample" % device)
            tensors = read_safetensors(saved)[0]
            for c in range(4):
                values = [feature(r, c) for r in range(batch)]
                mean, var = exact(values)
                want_mean = float((1 - Fraction(MOMENTUM)) * mean)
                want_var = float(Fraction(MOMENTUM) + (1 - Fraction(MOMENTUM)) * var * batch / (batch - 1))
                got_mean, got_var = tensors["wide.norm.running_mean"][c], tensors["wide.norm.running_var"][c]
                naive = MOMENTUM + (1 - MOMENTUM) * unshifted_variance(values) * batch / (batch - 1)
                check(abs(got_mean - want_mean) <= 1e-6 * abs(want_mean) and
                      abs(got_var - want_var) <= 1e-6 * abs(want_var),
                      "%s, batch %d, channel %d: running mean %.9g (exact %.9g), running variance %.9g "
                      "(exact %.9g; from unshifted sums %.9g)" % (device, batch, c, got_mean, want_mean, got_var,
                                                                  want_var, naive))
                if device == "cpu" and c == 0:
                    check(abs(naive - want_var) > 1e-5 * abs(want_var),
                          "batch %d: unshifted sums would be off by more than 10 times the tolerance" % batch)
    sys.exit(1 if datafiles.failures else 0)


if __name__ == "__main__":
    main()
