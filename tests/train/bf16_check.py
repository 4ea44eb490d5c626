#!/usr/bin/env python3
"""bf16_check.py: what precision = bf16 keeps in f32, checked on tests/train/bf16.ddp
(batch normalisation, then a linear layer) on the emulated device.

The features lie near 1000 and are all bf16 values, so the batch reaches the device
unchanged; the weights make logits of tens, where bf16 keeps a quarter at best. One
full-batch step is computed here in float64, with the roundings precision = bf16
makes and no other: the normalised values stored in bf16, the product's factors
(those values and the weights) read in bf16, the product summed and kept in f32.
Then:
  - the epoch's loss (at the initial weights) must match to 1e-5: it would be off by
    far more (printed) if the logits, softmax or the loss were rounded to bf16, or if
    the batch's mean and variance were;
  - the running statistics saved after the step must match to 1e-6: a mean rounded
    to bf16 is off by up to 2^-9;
  - the last layer's weights and bias after the step must match to 1e-6: their
    gradient is a product of bf16 factors (the normalised values, the logits'
    gradient rounded from f32) summed and kept in f32; one rounded to bf16 would be
    off by up to 2^-9 of the step.
The same program built with precision = fp32 must differ from the bf16 one: the test
could not fail if bf16 changed nothing.

usage: bf16_check.py PROGRAM_BF16 PROGRAM_FP32"""
import json
import math
import os
import struct
import sys

from datafiles import check, read_safetensors, run, scratch_folder, write_safetensors
import datafiles

ROWS = [  # x0..x3 (multiples of 4 in [512, 1024): bf16 values), label
    (1000, 996, 1012, 988, 0), (1004, 1020, 984, 992, 1), (992, 1008, 1000, 1016, 2),
    (1012, 988, 996, 1004, 0), (988, 1000, 1016, 980, 1), (1016, 1012, 992, 996, 2),
    (996, 984, 1004, 1012, 1), (1008, 992, 988, 1000, 0),
]
GAMMA = [40.0, -30.0, 25.0, 35.0]
BETA = [0.5, -0.25, 0.0, 1.0]
W0 = [[0.3, -0.2, 0.1], [0.05, 0.25, -0.15], [-0.3, 0.1, 0.2], [0.15, -0.05, 0.35]]  # [4 in, 3 out]
B0 = [0.01, -0.02, 0.03]
MOMENTUM, EPSILON, RATE = 0.9, 0.001, 0.5


def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


def bf16(v):
    """v rounded to bf16 from its value: 8 significant bits, ties to even"""
    if v == 0 or math.isinf(v) or math.isnan(v):
        return v
    m, e = math.frexp(v)
    step = math.ldexp(1.0, max(e - 8, -133))
    return round(v / step) * step  # round() ties to even; v / step is exact


def cross_entropy(z, label):
    m = max(z)
    return math.log(sum(math.exp(v - m) for v in z)) + m - z[label]


def batch_statistics(round_to=lambda v: v):
    n = len(ROWS)
    mean = [round_to(sum(r[c] for r in ROWS) / n) for c in range(4)]
    var = [round_to(sum((r[c] - mean[c]) ** 2 for r in ROWS) / n) for c in range(4)]
    return mean, var


def forward(mean, var, logit=lambda v: v):
    """each row's normalised values (bf16), logits and label, at the initial weights"""
    w = [[bf16(f32(v)) for v in row] for row in W0]
    out = []
    for *x, label in ROWS:
        y = [bf16(f32(GAMMA[c] * (x[c] - mean[c]) / math.sqrt(var[c] + EPSILON) + BETA[c])) for c in range(4)]
        z = [logit(f32(f32(sum(y[c] * w[c][j] for c in range(4))) + f32(B0[j]))) for j in range(3)]
        out.append((y, z, label))
    return out


def step_loss(mean, var, logit=lambda v: v):
    """the mean loss of the batch at the initial weights, logits passed through logit"""
    return sum(cross_entropy(z, label) for _, z, label in forward(mean, var, logit)) / len(ROWS)


def last_layer_step(mean, var, round_gradient=lambda v: v):
    """the logits' weights and bias after one SGD step: the logits' gradient (softmax
    minus the label, over the batch) kept f32, read in bf16 by the product"""
    gw, gb = [[0.0] * 3 for _ in range(4)], [0.0] * 3
    for y, z, label in forward(mean, var):
        m = max(z)
        e = [math.exp(v - m) for v in z]
        dz = [f32((e[j] / sum(e) - (j == label)) / len(ROWS)) for j in range(3)]
        for j in range(3):
            gb[j] += dz[j]
            for c in range(4):
                gw[c][j] += y[c] * bf16(dz[j])
    w1 = [[f32(W0[c][j]) - RATE * round_gradient(f32(gw[c][j])) for j in range(3)] for c in range(4)]
    b1 = [f32(B0[j]) - RATE * f32(gb[j]) for j in range(3)]
    return w1, b1


def close(what, got, want, tol):
    ok = abs(got - want) <= tol * max(1.0, abs(want))
    check(ok, "%-34s ddp %.9g  here %.9g" % (what, got, want))


def main():
    bf16_program, fp32_program = sys.argv[1], sys.argv[2]
    root = scratch_folder()
    with open(os.path.join(root, "big.csv"), "w") as f:
        f.write("x0,x1,x2,x3,label\n")
        for r in ROWS:
            f.write(",".join(str(v) for v in r) + "\n")
    init = os.path.join(root, "w0.safetensors")
    write_safetensors(init, [("wide.norm.weight", [4], GAMMA), ("wide.norm.bias", [4], BETA),
                             ("wide.norm.running_mean", [4], [0.0] * 4), ("wide.norm.running_var", [4], [1.0] * 4),
                             ("wide.logits.weight", [4, 3], [v for row in W0 for v in row]),
                             ("wide.logits.bias", [3], B0)])
    figures = {}
    for name, program in (("bf16", bf16_program), ("fp32", fp32_program)):
        saved, metrics = os.path.join(root, name + ".safetensors"), os.path.join(root, name + ".json")
        run([program, "--device", "emulated", "--data-root", root, "--load", init, "--save", saved,
             "--metrics", metrics])
        figures[name] = (json.loads(open(metrics).read().splitlines()[0]), read_safetensors(saved)[0])
    m, tensors = figures["bf16"]

    mean, var = batch_statistics()
    want = step_loss(mean, var)
    close("loss at the initial weights", m["loss"], want, 1e-5)
    bf16_logits = step_loss(mean, var, logit=bf16)
    bf16_stats = step_loss(*batch_statistics(round_to=bf16))
    print("     (the same loss with the logits rounded to bf16: %.9g; with the batch's statistics "
          "rounded to bf16: %.9g)" % (bf16_logits, bf16_stats))
    check(abs(bf16_logits - want) > 1e-3 * abs(want) and abs(bf16_stats - want) > 1e-3 * abs(want),
          "those roundings would move the loss by more than 100 times the tolerance")

    n = len(ROWS)
    for c in range(4):
        close("running_mean[%d]" % c, tensors["wide.norm.running_mean"][c], (1 - MOMENTUM) * mean[c], 1e-6)
        close("running_var[%d]" % c, tensors["wide.norm.running_var"][c],
              MOMENTUM + (1 - MOMENTUM) * var[c] * n / (n - 1), 1e-6)
    check(abs(bf16(mean[0]) - mean[0]) > 1e-6 * abs(mean[0]) * 100,
          "a mean rounded to bf16 would be off by more than 100 times the tolerance (%.9g against %.9g)"
          % (bf16(mean[0]), mean[0]))

    w1, b1 = last_layer_step(mean, var)
    for c in range(4):
        for j in range(3):
            close("logits.weight[%d][%d] after the step" % (c, j), tensors["wide.logits.weight"][c * 3 + j],
                  w1[c][j], 1e-6)
    for j in range(3):
        close("logits.bias[%d] after the step" % j, tensors["wide.logits.bias"][j], b1[j], 1e-6)
    rounded, _ = last_layer_step(mean, var, round_gradient=bf16)
    off = max(abs(rounded[c][j] - w1[c][j]) / max(1.0, abs(w1[c][j])) for c in range(4) for j in range(3))
    check(off > 1e-5, "a weight gradient rounded to bf16 would move a weight by %.3g (over 10 times the tolerance)"
          % off)

    f32_loss = figures["fp32"][0]["loss"]
    check(abs(f32_loss - m["loss"]) > 1e-4 * abs(f32_loss),
          "precision = fp32 gives another loss (%.9g against bf16's %.9g)" % (f32_loss, m["loss"]))
    sys.exit(1 if datafiles.failures else 0)


if __name__ == "__main__":
    main()
