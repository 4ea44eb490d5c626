#!/usr/bin/env python3
"""smoothing.py PROGRAMS: label_smoothing on class indices, on tests/train/tiny.ddp,
against one SGD step computed here by hand (float64, the standard library only).

programs/tiny_smooth trains with sparse_categorical_crossentropy(from_logits = true,
label_smoothing = 0.2), and programs/tiny_smooth_categorical with
categorical_crossentropy and the same smoothing, on the same class indices. The test
checks:

- the training loss is -sum_j t_j log softmax(z)_j with t = 0.8 on the class and 0.2 / 3
  on each output (PyTorch's CrossEntropyLoss(label_smoothing = 0.2)), at the initial
  weights; the validation loss the same at the weights after one step;
- the step follows the gradient (softmax(z) - t) / N;
- categorical_crossentropy with the same smoothing gives the same bits."""
import json
import math
import os
import sys

import datafiles
from datafiles import check, read_safetensors, run, scratch_folder
from tiny_check import CHECK, TRAIN, logits, write_tiny_files

RATE, EPS = 0.5, 0.2


def smoothed(w, b, rows):
    """the mean smoothed cross-entropy and its gradients"""
    loss = 0.0
    gw = [[0.0] * 3 for _ in range(4)]
    gb = [0.0] * 3
    for *x, label in rows:
        z = logits(w, b, x)
        m = max(z)
        lse = m + math.log(sum(math.exp(v - m) for v in z))
        t = [(1 - EPS) * (j == label) + EPS / 3 for j in range(3)]
        loss -= sum(t[j] * (z[j] - lse) for j in range(3))
        for j in range(3):
            d = (math.exp(z[j] - lse) - t[j]) / len(rows)
            gb[j] += d
            for i in range(4):
                gw[i][j] += x[i] * d
    return loss / len(rows), gw, gb


def trained(program, root, name):
    saved, metrics = os.path.join(root, name + ".safetensors"), os.path.join(root, name + ".json")
    run([program, "--data-root", root, "--load", os.path.join(root, "w0.safetensors"), "--save", saved,
         "--metrics", metrics, "--run-dir", os.path.join(root, name)])
    tensors, _ = read_safetensors(saved)
    return json.loads(open(metrics).read()), list(tensors["tiny.logits.weight"]) + list(tensors["tiny.logits.bias"])


def main():
    programs = sys.argv[1]
    root = scratch_folder()
    w0, b0 = write_tiny_files(root, TRAIN, CHECK, "w0.safetensors")
    loss0, gw, gb = smoothed(w0, b0, TRAIN)
    w1 = [[w0[i][j] - RATE * gw[i][j] for j in range(3)] for i in range(4)]
    b1 = [b0[j] - RATE * gb[j] for j in range(3)]
    val_loss, _, _ = smoothed(w1, b1, CHECK)
    want = [v for row in w1 for v in row] + b1

    m, got = trained(os.path.join(programs, "tiny_smooth"), root, "sparse")
    check(abs(m["loss"] - loss0) <= 1e-6, "the training loss is the smoothed cross-entropy (%.6f, by hand %.6f)" %
          (m["loss"], loss0))
    check(abs(m["val_loss"] - val_loss) <= 1e-6, "so is the validation loss after the step (%.6f, by hand %.6f)" %
          (m["val_loss"], val_loss))
    check(max(abs(a - b) for a, b in zip(got, want)) <= 1e-6, "the step follows (softmax(z) - t) / N")
    _, other = trained(os.path.join(programs, "tiny_smooth_categorical"), root, "categorical")
    check(other == got, "categorical_crossentropy with the same smoothing takes the same step, bit for bit")
    sys.exit(1 if datafiles.failures else 0)


if __name__ == "__main__":
    main()
