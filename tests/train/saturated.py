#!/usr/bin/env python3
"""saturated.py DDPC: sigmoid and silu far into their flat ends train on.

A dense layer of ones (init = ones) over four inputs of +-100 gives pre-activations of
+-400, where exp(400) overflows f32 (and exp(-400) is 0). The derivative of sigmoid
written out as the derivative of 1 / (1 + exp(-x)) is inf / inf there, a NaN that
stops the run; as s (1 - s) it is exactly 0. So, two epochs of SGD each:

- sigmoid: the run ends with status 0, and the first layer is still all ones (no
  gradient reaches it through a saturated unit), the second layer has moved;
- silu (x sigmoid(x)), and elu, softplus and mish, whose exp(400) is never formed or
  never kept: status 0, every parameter finite, and the first layer moved (each
  one's slope is 1 at +400)."""
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from datafiles import check, npy, read_safetensors, scratch_folder  # noqa: E402
import datafiles  # noqa: E402

PROGRAM = """dataset d = npy(inputs = "x.npy", labels = "y.npy")
model m(input: [4]) {
    wide: dense(8, activation = %s, init = ones)
    out: dense(2)
}
strategy multi_worker_mirrored {
    batch_per_replica = 8
    train m on d {
        loss      = sparse_categorical_crossentropy(from_logits = true)
        optimizer = sgd(learning_rate = 0.1)
        epochs    = 2
    }
}
"""


def train(ddpc, root, activation):
    source = os.path.join(root, activation + ".ddp")
    with open(source, "w") as f:
        f.write(PROGRAM % activation)
    program, saved = os.path.join(root, activation), os.path.join(root, activation + ".safetensors")
    subprocess.run([ddpc, "build", source, "-o", program], check=True, stdout=subprocess.DEVNULL)
    p = subprocess.run([program, "--data-root", root, "--run-dir", program + "_run", "--save", saved],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    check(p.returncode == 0, "%s at +-400: trains two epochs (status %d)%s" %
          (activation, p.returncode, "" if p.returncode == 0 else ": " + p.stdout.strip().splitlines()[-1]))
    return read_safetensors(saved)[0] if p.returncode == 0 else None


def main():
    ddpc = sys.argv[1]
    root = scratch_folder()
    x = np.full((8, 4), -100, dtype=np.float32)
    x[::2] = 100
    with open(os.path.join(root, "x.npy"), "wb") as f:
        f.write(npy("<f4", [8, 4], x.tobytes()))
    with open(os.path.join(root, "y.npy"), "wb") as f:
        f.write(npy("|u1", [8], bytes([0, 1] * 4)))
    sigmoid = train(ddpc, root, "sigmoid")
    if sigmoid:
        wide = np.array(sigmoid["m.wide.weight"])
        check(np.all(wide == 1) and np.all(np.array(sigmoid["m.wide.bias"]) == 0),
              "sigmoid: the saturated layer is still its initial ones")
        check(np.any(np.array(sigmoid["m.out.weight"]) != 0) and
              all(np.all(np.isfinite(np.array(v))) for v in sigmoid.values()), "sigmoid: the layer after it moved")
    for activation in ["silu", "elu", "softplus", "mish"]:
        trained = train(ddpc, root, activation)
        if trained:
            check(all(np.all(np.isfinite(np.array(v))) for v in trained.values()) and
                  np.any(np.array(trained["m.wide.weight"]) != 1),
                  "%s: every parameter finite, the first layer moved" % activation)
    sys.exit(1 if datafiles.failures else 0)


if __name__ == "__main__":
    main()
