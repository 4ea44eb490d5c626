#!/usr/bin/env python3
"""clip.py PROGRAMS LAUNCHER...: the optimizer's clip_norm on tests/train/tiny.ddp,
against one SGD step computed here by hand (float64, the standard library only).

programs/tiny_clip trains with sgd(learning_rate = 0.5, weight_decay = 0.1,
clip_norm = 0.05), whose first full-batch gradient has a norm far above 0.05;
programs/tiny_clip_loose the same with clip_norm = 1000, never reached; programs/
tiny_decay the same without clip_norm. The test checks:

- one step scales the gradients by clip_norm / (norm + 1e-6) before the weight decay
  is added (PyTorch's clip_grad_norm_, then SGD's decay);
- a clip_norm above the norm leaves the step as it is without one, bit for bit;
- the emulated GPU (its block reductions) takes the same step, and so do two workers
  of half the batch under LAUNCHER (`ddprun -n`): the norm is the summed gradient's,
  not each worker's."""
import math
import os
import sys

import datafiles
from datafiles import check, read_safetensors, run, scratch_folder, with_port
from tiny_check import CHECK, TRAIN, figures, write_tiny_files

RATE, DECAY, CLIP = 0.5, 0.1, 0.05


def saved(command, root, name, *flags):
    """the parameters (weights, then biases) COMMAND saves after its one step"""
    path = os.path.join(root, name)
    run([*command, "--data-root", root, "--load", os.path.join(root, "w0.safetensors"), "--save", path,
         "--run-dir", os.path.join(root, "run-" + name), "--threads", "1", *flags])
    tensors, _ = read_safetensors(path)
    return list(tensors["tiny.logits.weight"]) + list(tensors["tiny.logits.bias"])


def main():
    programs, launcher = sys.argv[1], sys.argv[2:]
    root = scratch_folder()
    w0, b0 = write_tiny_files(root, TRAIN, CHECK, "w0.safetensors")
    _, _, gw, gb = figures(w0, b0, TRAIN)
    grads = [gw[i][j] for i in range(4) for j in range(3)] + gb
    params = [w0[i][j] for i in range(4) for j in range(3)] + b0
    norm = math.sqrt(sum(g * g for g in grads))
    scale = min(1.0, CLIP / (norm + 1e-6))
    want = [p - RATE * (g * scale + DECAY * p) for p, g in zip(params, grads)]
    check(scale < 0.2, "the first gradient's norm %.4f is well above clip_norm %g" % (norm, CLIP))

    clip = os.path.join(programs, "tiny_clip")
    got = saved([clip], root, "clip.safetensors")
    worst = max(abs(a - b) for a, b in zip(got, want))
    check(worst <= 1e-6, "one step scales the gradients by %.4f, then adds the decay (worst %.2g)" % (scale, worst))

    loose = saved([os.path.join(programs, "tiny_clip_loose")], root, "loose.safetensors")
    plain = saved([os.path.join(programs, "tiny_decay")], root, "plain.safetensors")
    check(loose == plain, "a clip_norm above the norm changes nothing, bit for bit")

    emulated = saved([clip], root, "emulated.safetensors", "--device", "emulated")
    check(max(abs(a - b) for a, b in zip(emulated, want)) <= 1e-6, "the emulated GPU takes the same step")

    two = saved(with_port(launcher, 2) + ["2", os.path.join(programs, "tiny_clip_half")], root, "two.safetensors")
    check(max(abs(a - b) for a, b in zip(two, want)) <= 1e-6,
          "two workers of half the batch clip by the summed gradient's norm")
    sys.exit(1 if datafiles.failures else 0)


if __name__ == "__main__":
    main()
