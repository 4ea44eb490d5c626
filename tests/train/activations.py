#!/usr/bin/env python3
"""activations.py DDPC: every activation's values, as PyTorch defines them, on a grid
of inputs from -30 to 30, at +-100, +-1e4 and 3e7, through a built program's --predict.

The model applies each activation (and the layer forms with their numbers) to its
input alone and joins the results, so row i of the predictions holds every
activation of x_i. Each must match the definition computed here in float64 to float32's
precision: relu, relu6, leaky_relu (0.01, and 0.2), elu (alpha 1, and 0.5), gelu
(erf), silu, mish, hard_swish, softplus, sigmoid, tanh. At +-100, where exp overflows
f32, every value is finite; far out, clamps stay exact (hard_swish at 3e7 is 3e7)."""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from datafiles import check, npy, run, scratch_folder  # noqa: E402
import datafiles  # noqa: E402

ACTIVATIONS = [
    ("relu", "relu", lambda x: max(x, 0.0)),
    ("relu6", "relu6", lambda x: min(max(x, 0.0), 6.0)),
    ("leaky_relu", "leaky_relu", lambda x: x if x > 0 else 0.01 * x),
    ("leaky_relu(0.2)", "leaky_relu(negative_slope = 0.2)", lambda x: x if x > 0 else 0.2 * x),
    ("elu", "elu", lambda x: x if x > 0 else math.expm1(x)),
    ("elu(0.5)", "elu(alpha = 0.5)", lambda x: x if x > 0 else 0.5 * math.expm1(x)),
    ("gelu", "gelu", lambda x: x * math.erfc(-x / math.sqrt(2)) / 2),
    ("silu", "silu", lambda x: x * sigmoid(x)),
    ("mish", "mish", lambda x: x * math.tanh(softplus(x))),
    ("hard_swish", "hard_swish", lambda x: x * min(max(x + 3, 0.0), 6.0) / 6),
    ("softplus", "softplus", lambda x: softplus(x)),
    ("sigmoid", "sigmoid", lambda x: sigmoid(x)),
    ("tanh", "tanh", math.tanh),
]


def sigmoid(x):
    return 1 / (1 + math.exp(-x)) if x >= 0 else math.exp(x) / (1 + math.exp(x))


def softplus(x):
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))


def program():
    lets = "\n".join("    let a%d = in -> %s" % (i, layer) for i, (_, layer, _) in enumerate(ACTIVATIONS))
    names = ", ".join("a%d" % i for i in range(1, len(ACTIVATIONS)))
    return """dataset d = npy(inputs = "x.npy", labels = "y.npy")
model m(input: [1]) {
%s
    a0
    concat(%s)
}
train m on d {
    batch_per_replica = 8
    loss = mean_squared_error
    optimizer = sgd
    epochs = 1
}
""" % (lets, names)


def main():
    ddpc = sys.argv[1]
    root = scratch_folder()
    xs = [v / 4 for v in range(-120, 121)] + [-100.0, 100.0, -88.5, 88.5, -3.0, 3.0, 1e-3, -1e-3, 5.9375, 6.0, 1e4,
                                              -1e4, 3e7]
    x = np.array(xs, dtype=np.float32).reshape(-1, 1)
    with open(os.path.join(root, "x.npy"), "wb") as f:
        f.write(npy("<f4", [len(xs), 1], x.tobytes()))
    with open(os.path.join(root, "y.npy"), "wb") as f:
        f.write(npy("<f4", [len(xs), 1], x.tobytes()))
    source = os.path.join(root, "activations.ddp")
    with open(source, "w") as f:
        f.write(program())
    binary = os.path.join(root, "activations")
    run([ddpc, "build", source, "-o", binary])
    out = os.path.join(root, "out.npy")
    run([binary, "--data-root", root, "--predict", out,
         "--predict-inputs", os.path.join(root, "x.npy")])
    got = np.load(out)
    check(got.shape == (len(xs), len(ACTIVATIONS)), "predictions of %d inputs by %d activations (%s)" %
          (len(xs), len(ACTIVATIONS), got.shape))
    for k, (name, _, f) in enumerate(ACTIVATIONS):
        worst, where = 0.0, None
        for i, v in enumerate(x[:, 0]):
            want = f(float(v))
            err = abs(float(got[i, k]) - want) / max(abs(want), 1e-6)
            if not math.isfinite(float(got[i, k])):
                err = math.inf
            if err > worst:
                worst, where = err, float(v)
        check(worst <= 2e-6, "%-16s largest relative difference %.1e (at x = %s)" % (name, worst, where))
    sys.exit(1 if datafiles.failures else 0)


if __name__ == "__main__":
    main()
