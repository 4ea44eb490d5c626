#!/usr/bin/env python3
"""reference.py FRAMEWORK MODEL THREADS STEPS: samples/s of one training step of the
sample models in another framework, on random data, for bench/train_throughput.sh.

FRAMEWORK: numpy (the MLP only: forward, backward and SGD written out) or torch.
MODEL: mlp (samples/fashion_mlp.ddp: 784-256-10, relu, sgd 0.1) or cnn
(samples/fashion.ddp: two 5x5 convolutions with max-pooling, dense 1024, dropout 0.4,
adam 0.001). Batch 64, float32. Prints one number: samples per second over STEPS
steps after a warm-up."""
import os
import sys
import time

framework, model, threads, steps = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[name] = str(threads)  # before numpy loads its BLAS

import numpy as np  # noqa: E402

BATCH, WARMUP = 64, 5
rng = np.random.default_rng(0)
images = rng.uniform(-1, 1, (BATCH * 8, 28, 28)).astype(np.float32)
labels = rng.integers(0, 10, BATCH * 8)


def numpy_mlp():
    w1 = (rng.standard_normal((784, 256)) * 0.05).astype(np.float32)
    b1 = np.zeros(256, np.float32)
    w2 = (rng.standard_normal((256, 10)) * 0.05).astype(np.float32)
    b2 = np.zeros(10, np.float32)
    rate = np.float32(0.1)

    def step(i):
        nonlocal w1, b1, w2, b2
        k = i % 8
        x = images[k * BATCH:(k + 1) * BATCH].reshape(BATCH, 784)
        y = labels[k * BATCH:(k + 1) * BATCH]
        z1 = x @ w1 + b1
        h = np.maximum(z1, 0)
        z2 = h @ w2 + b2
        z2 = z2 - z2.max(axis=1, keepdims=True)
        e = np.exp(z2)
        p = e / e.sum(axis=1, keepdims=True)
        dz2 = p
        dz2[np.arange(BATCH), y] -= 1
        dz2 /= BATCH
        dh = dz2 @ w2.T
        dz1 = dh * (z1 > 0)
        w2 -= rate * (h.T @ dz2)
        b2 -= rate * dz2.sum(axis=0)
        w1 -= rate * (x.T @ dz1)
        b1 -= rate * dz1.sum(axis=0)
    return step


def torch_model():
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    nn = torch.nn
    if model == "mlp":
        net = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
        optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    else:
        net = nn.Sequential(nn.Unflatten(1, (1, 28)), nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                            nn.Linear(3136, 1024), nn.ReLU(), nn.Dropout(0.4), nn.Linear(1024, 10))
        optimizer = torch.optim.Adam(net.parameters(), lr=0.001)
    x_all, y_all = torch.from_numpy(images), torch.from_numpy(labels)

    def step(i):
        k = i % 8
        x, y = x_all[k * BATCH:(k + 1) * BATCH], y_all[k * BATCH:(k + 1) * BATCH]
        loss = nn.functional.cross_entropy(net(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return step


step = numpy_mlp() if framework == "numpy" else torch_model()
for i in range(WARMUP):
    step(i)
start = time.perf_counter()
for i in range(steps):
    step(i)
print("%.1f" % (steps * BATCH / (time.perf_counter() - start)))
