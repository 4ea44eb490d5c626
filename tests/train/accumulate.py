#!/usr/bin/env python3
"""accumulate.py DDPC DDPRUN STANDIN: accumulate_batches = k trains as one batch k times
as large, through built programs.

Programs written here train an MLP (GELU, dropout) on 50 augmented 8 x 8 RGB samples in
.npy files (crops and flips), shuffled, the last step kept (50 = 3 x 16 + 2), with a
learning rate of global_batch / 16 x 0.05 and momentum, two epochs. Against one
worker of batch 16 (`big`), the saved parameters within 1e-5 of the norm:

- one worker of batch 4 summing 4 batches a step (the draws are each sample's own, the
  rate sees the step's global batch of 16);
- 2 workers of batch 2 summing 4 (DDPRUN), whose buckets go to the ring on a step's last
  batch alone;
- the emulated GPU alone (the batches before a step's last one CUDA graph, the whole
  step another; the same bytes without graphs), and 2 workers of 2 with the stand-in NCCL in STANDIN and with the
  staged ring;
- allreduce_precision = bf16, 2 workers: within 5e-3, not the same (the wire copy sits
  after the gradients' sum);
- a run stopped by SIGUSR1 after step 3 and resumed ends with the uninterrupted run's
  bytes; its checkpoint resumed by `big` (the same global batch cut otherwise) needs no
  --resume-changed and ends within 1e-5;
- 16 x 4 on 50 samples with drop_remainder: status 1, the message naming the dataset
  and accumulate_batches.
The banner says the accumulation, and the step count is the optimizer's (4 an epoch);
--profile's heading the samples a batch and the batches a step."""
import os
import shutil
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from datafiles import check, npy, read_safetensors, scratch_folder, with_port  # noqa: E402
import datafiles  # noqa: E402

SAMPLES = 50

PROGRAM = """dataset pictures = npy(inputs = "x.npy", labels = "y.npy", scale = 1 / 255,
                        augment = [random_flip(horizontal), random_crop(padding = 2)])
model mlp(input: [8, 8, 3]) {
    flatten
    hidden: dense(24, activation = gelu)
    dropout(0.2)
    dense(10)
}
strategy multi_worker_mirrored {
    batch_per_replica   = %(batch)d
    accumulate_batches  = %(k)d
    drop_remainder      = %(drop)s
    communication       = %(communication)s
    allreduce_precision = %(wire)s
    train mlp on pictures {
        loss      = sparse_categorical_crossentropy(from_logits = true)
        optimizer = sgd(learning_rate = 0.05 * global_batch / 16, momentum = 0.9)
        epochs    = 2
    }
}
"""


def build(ddpc, root, name, batch, k, communication="auto", wire="fp32", drop="false"):
    source = os.path.join(root, name + ".ddp")
    with open(source, "w") as f:
        f.write(PROGRAM % {"batch": batch, "k": k, "communication": communication, "wire": wire, "drop": drop})
    p = subprocess.run([ddpc, "build", source, "-o", os.path.join(root, name)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if p.returncode:
        sys.exit("FAIL: ddpc build %s\n%s" % (name, p.stdout))
    return os.path.join(root, name)


def flat(path):
    tensors, _ = read_safetensors(path)
    return sorted(tensors), np.concatenate([np.array(tensors[k]).ravel() for k in sorted(tensors)])


def apart(a, b):
    (na, x), (nb, y) = flat(a), flat(b)
    return float(np.linalg.norm(x - y) / np.linalg.norm(x)) if na == nb else float("inf")


def main():
    ddpc, ddprun, standin = sys.argv[1], sys.argv[2], sys.argv[3]
    root = scratch_folder()
    rng = np.random.default_rng(5)
    pixels = rng.integers(1, 256, size=(SAMPLES, 8, 8, 3), dtype=np.uint8)
    with open(os.path.join(root, "x.npy"), "wb") as f:
        f.write(npy("|u1", [SAMPLES, 8, 8, 3], pixels.tobytes()))
    with open(os.path.join(root, "y.npy"), "wb") as f:
        f.write(npy("|u1", [SAMPLES], bytes(s % 10 for s in range(SAMPLES))))

    def train(program, name, launcher=(), extra=(), env=None, expect=0):
        saved = os.path.join(root, name + ".safetensors")
        command = list(launcher) + [program, "--data-root", root, "--run-dir", os.path.join(root, name + "_run"), "--threads",
                                    "1", "--save", saved] + list(extra)
        p = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, env=env)
        if p.returncode != expect:
            sys.exit("FAIL: %s exited %d, not %d\n%s" % (" ".join(command), p.returncode, expect, p.stdout))
        return saved, p.stdout

    big, _ = train(build(ddpc, root, "big", 16, 1), "big")
    summed = build(ddpc, root, "summed", 4, 4)
    one, out = train(summed, "summed")
    check("batch       4 per replica x 1 replica x 4 accumulated = 16 global; 4 steps per epoch" in out,
          "the banner says the accumulation, and the optimizer's steps")
    check("done: 2 epochs, 8 steps, 100 samples" in out, "8 optimizer steps over 100 samples")
    d = apart(big, one)
    check(d <= 1e-5, "1 worker x 4, 4 batches a step, against 1 x 16: %.2e of the norm" % d)
    _, out = train(summed, "profiled", extra=["--profile"])
    check("7 steps averaged after 1 warm-up step, 4 samples a batch on this worker, 4 batches a step" in out,
          "--profile says the batches a step")

    two = build(ddpc, root, "two", 2, 4)
    saved, _ = train(two, "two", with_port([ddprun, "-n"], 2) + ["2"])
    d = apart(big, saved)
    check(d <= 1e-5, "2 workers x 2, 4 batches a step, against 1 x 16: %.2e of the norm" % d)

    saved, _ = train(summed, "summed_emulated", extra=["--device", "emulated"])
    log = open(os.path.join(root, "summed_emulated_run", "log.txt")).read()
    d = apart(big, saved)
    check(d <= 1e-5 and "the whole training step runs as a CUDA graph from its step 2 on" in log and
          "each batch a step sums before its last (accumulate_batches) runs as one CUDA graph" in log,
          "the emulated GPU, 4 batches a step, the held batches and the whole step CUDA graphs: %.2e of the norm" % d)
    eager, _ = train(summed, "summed_eager", extra=["--device", "emulated", "--no-cuda-graphs"])
    check(flat(eager)[1].tobytes() == flat(saved)[1].tobytes(), "with --no-cuda-graphs: the same bytes")
    env = dict(os.environ, DDP_CUDA_LIBRARY_PATH=standin)
    for transport in ("nccl", "ring"):
        program = build(ddpc, root, "two_" + transport, 2, 4, communication=transport)
        saved, _ = train(program, "two_" + transport, with_port([ddprun, "-n"], 2) + ["2"], ["--device", "emulated"],
                         env=env)
        d = apart(big, saved)
        check(d <= 1e-5, "2 emulated GPUs x 2 through %s, 4 batches a step: %.2e of the norm" % (transport, d))

    saved, _ = train(build(ddpc, root, "two_bf16", 2, 4, wire="bf16"), "two_bf16", with_port([ddprun, "-n"], 2) + ["2"])
    d = apart(big, saved)
    check(0 < d <= 5e-3, "2 workers, gradients summed in bf16 after 4 batches: %.2e of the norm" % d)

    _, out = train(summed, "stopped", env=dict(os.environ, DDP_TEST_SIGNAL="USR1@3"), expect=4)
    check("after step 3" in out, "SIGUSR1 at step 3: a checkpoint after it")
    shutil.copytree(os.path.join(root, "stopped_run"), os.path.join(root, "split_run"))
    resumed, _ = train(summed, "stopped", extra=["--resume"])
    check(flat(resumed)[1].tobytes() == flat(one)[1].tobytes(), "stopped after step 3 and resumed: the same bytes")
    resumed, out = train(os.path.join(root, "big"), "split", extra=["--resume"])
    d = apart(big, resumed)
    check("resumed" in out and d <= 1e-5,
          "its checkpoint resumed by the program of batch 16 alone, the same global batch, no --resume-changed: "
          "%.2e of the norm" % d)
    _, out = train(build(ddpc, root, "too_large", 16, 4, drop="true"), "too_large", expect=1)
    check("pictures: the dataset has 50 samples, fewer than one global batch of 64" in out and
          "accumulate_batches" in out, "a step larger than the dataset, its last dropped: status 1, saying so: %s" %
          out.strip().splitlines()[-1])
    sys.exit(1 if datafiles.failures else 0)


if __name__ == "__main__":
    main()
