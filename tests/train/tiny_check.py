#!/usr/bin/env python3
"""tiny_check.py: one training step of tests/train/tiny.ddp against figures computed
here by hand, in float64 with nothing but the standard library.

The test writes two small CSV files and the initial weights (a safetensors file), runs
the program for one epoch of one full-batch SGD step, and checks: the epoch's training
loss and accuracy (at the initial weights), the validation loss and accuracy (at the
updated weights), the saved weights (one SGD step), the metrics file's keys, and that
--evaluate on the saved weights gives the same validation figures to the last digit.

usage: tiny_check.py PROGRAM"""
import json
import math
import os
import struct
import subprocess
import sys

from datafiles import read_safetensors, write_safetensors, scratch_folder

TRAIN = [  # x0..x3, label
    (0.5, -1.0, 0.25, 2.0, 0), (1.5, 0.5, -0.75, 0.0, 1), (-0.5, 2.0, 1.0, -1.0, 2),
    (0.0, 0.0, 0.0, 0.0, 1), (2.0, -0.5, 0.5, 1.0, 0), (-1.5, 1.0, -1.0, 0.5, 2),
    (0.75, 0.25, 2.0, -0.5, 1), (1.0, 1.0, 1.0, 1.0, 0),
]
CHECK = [
    (0.25, 0.5, -0.5, 1.5, 0), (-1.0, 1.5, 0.5, 0.0, 2), (1.25, -0.25, 0.0, 0.5, 1),
    (0.5, 0.5, 1.5, -1.0, 1), (-0.5, -0.5, 0.5, 0.25, 2),
]
W0 = [[0.1, -0.2, 0.3], [0.0, 0.25, -0.1], [-0.3, 0.1, 0.2], [0.15, -0.05, 0.05]]  # [4 in, 3 out]
B0 = [0.01, -0.02, 0.03]
RATE = 0.5


def write_csv(path, rows):
    with open(path, "w") as f:
        f.write("x0,x1,x2,x3,label\n")
        for r in rows:
            f.write(",".join(repr(v) for v in r) + "\n")


def write_tiny_files(root, train, check, name):
    """the two CSV files and the initial weights (W0, B0 rounded to float32) in root,
    as root/name; the weights returned"""
    write_csv(os.path.join(root, "tiny.csv"), train)
    write_csv(os.path.join(root, "tiny_check.csv"), check)
    w0 = [[f32(v) for v in row] for row in W0]
    b0 = [f32(v) for v in B0]
    write_safetensors(os.path.join(root, name), [("tiny.logits.weight", [4, 3], [v for row in w0 for v in row]),
                                                 ("tiny.logits.bias", [3], b0)])
    return w0, b0


def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


def logits(w, b, x):
    return [sum(x[i] * w[i][j] for i in range(4)) + b[j] for j in range(3)]


def figures(w, b, rows):
    """mean cross-entropy and accuracy, and the gradients of the mean loss"""
    loss, right = 0.0, 0
    gw = [[0.0] * 3 for _ in range(4)]
    gb = [0.0] * 3
    for *x, label in rows:
        z = logits(w, b, x)
        m = max(z)
        e = [math.exp(v - m) for v in z]
        s = sum(e)
        loss += math.log(s) + m - z[label]
        right += max(range(3), key=lambda j: (z[j], -j)) == label
        for j in range(3):
            d = (e[j] / s - (j == label)) / len(rows)
            gb[j] += d
            for i in range(4):
                gw[i][j] += x[i] * d
    return loss / len(rows), right / len(rows), gw, gb


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit("FAIL: %s exited %d\n%s%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
    return p.stdout


def close(what, got, want, tol):
    ok = abs(got - want) <= tol * max(1.0, abs(want))
    print("%s %-28s ddp %.9g  by hand %.9g" % ("ok  " if ok else "FAIL", what, got, want))
    return ok


def main():
    program = sys.argv[1]
    root = scratch_folder()
    w0, b0 = write_tiny_files(root, TRAIN, CHECK, "w0.safetensors")
    init = os.path.join(root, "w0.safetensors")
    saved, metrics = os.path.join(root, "w1.safetensors"), os.path.join(root, "m.json")
    out = run([program, "--data-root", root, "--load", init, "--save", saved, "--metrics", metrics])
    ok = "\r" not in out

    loss0, acc0, gw, gb = figures(w0, b0, TRAIN)
    w1 = [[w0[i][j] - RATE * gw[i][j] for j in range(3)] for i in range(4)]
    b1 = [b0[j] - RATE * gb[j] for j in range(3)]
    val_loss, val_acc, _, _ = figures(w1, b1, CHECK)

    lines = open(metrics).read().splitlines()
    ok &= len(lines) == 1
    m = json.loads(lines[0])
    keys = ["epoch", "step", "loss", "accuracy", "val_loss", "val_accuracy", "lr", "samples_per_sec", "seconds"]
    ok &= list(m)[:len(keys)] == keys and m["epoch"] == 1 and m["step"] == 1 and m["lr"] == RATE
    ok &= close("training loss (at w0)", m["loss"], loss0, 1e-6)
    ok &= close("training accuracy", m["accuracy"], acc0, 0)
    ok &= close("validation loss (at w1)", m["val_loss"], val_loss, 1e-6)
    ok &= close("validation accuracy", m["val_accuracy"], val_acc, 0)

    tensors, meta = read_safetensors(saved)
    ok &= sorted(tensors) == ["tiny.logits.bias", "tiny.logits.weight"] and len(meta.get("program_hash", "")) == 16
    for i in range(4):
        for j in range(3):
            ok &= close("w1[%d][%d]" % (i, j), tensors["tiny.logits.weight"][i * 3 + j], w1[i][j], 1e-6)
    for j in range(3):
        ok &= close("b1[%d]" % j, tensors["tiny.logits.bias"][j], b1[j], 1e-6)

    again = os.path.join(root, "again.json")
    run([program, "--data-root", root, "--load", saved, "--evaluate", "--metrics", again])
    e = json.loads(open(again).read())
    same = e["val_loss"] == m["val_loss"] and e["val_accuracy"] == m["val_accuracy"] and e["epoch"] is None
    print("%s --evaluate on the saved weights gives the same figures" % ("ok  " if same else "FAIL"))
    ok &= same
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
