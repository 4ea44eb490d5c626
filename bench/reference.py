#!/usr/bin/env python3
"""reference.py FRAMEWORK MODEL THREADS STEPS: samples/s of one training step of the
sample models in another framework, on random data, for bench/train_throughput.sh.

FRAMEWORK: numpy (the MLP only: forward, backward and SGD written out) or torch.
MODEL: mlp (samples/fashion_mlp.ddp: 784-256-10, relu, sgd 0.1), cnn
(samples/fashion.ddp: two 5x5 convolutions with max-pooling, dense 1024, dropout 0.4,
adam 0.001) or gpt (tests/train/char_lm.ddp: std/gpt over 64 tokens of a vocabulary
of 256, two blocks of 64 channels and 4 heads, adamw 0.003; written as nanoGPT
writes it, the attention by scaled_dot_product_attention) or vit
(samples/cifar10_vit.ddp: 4x4 patches of 32x32x3 images, six pre-norm encoder blocks
of 192 channels, 3 heads and an MLP of 384, dropout 0.1, the mean of the tokens;
adamw 0.001 with weight decay 0.05, gradients clipped to norm 1, label smoothing
0.1). Batch 64, float32. Prints one number: samples per second over STEPS steps after
a warm-up."""
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
TOKENS, VOCAB, WIDTH, HEADS, DEPTH = 64, 256, 64, 4, 2
text = rng.integers(0, VOCAB, (BATCH * 8, TOKENS + 1))
PATCH, VIT_WIDTH, VIT_DEPTH, VIT_HEADS, VIT_MLP, VIT_DROPOUT = 4, 192, 6, 3, 384, 0.1


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


def torch_gpt(torch):
    nn = torch.nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
            self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
            self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(WIDTH, dim=2)
            q, k, v = (a.view(b, t, HEADS, c // HEADS).transpose(1, 2) for a in (q, k, v))
            y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.mlp(self.ln2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens, self.positions = nn.Embedding(VOCAB, WIDTH), nn.Parameter(torch.zeros(TOKENS, WIDTH))
            self.blocks = nn.Sequential(*[Block() for _ in range(DEPTH)])
            self.ln, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

        def forward(self, idx):
            return self.head(self.ln(self.blocks(self.tokens(idx) + self.positions)))
    return GPT()


def torch_vit(torch):
    nn = torch.nn

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(VIT_WIDTH, eps=1e-6), nn.LayerNorm(VIT_WIDTH, eps=1e-6)
            self.attention = nn.MultiheadAttention(VIT_WIDTH, VIT_HEADS, batch_first=True)
            self.drop = nn.Dropout(VIT_DROPOUT)
            self.mlp = nn.Sequential(nn.Linear(VIT_WIDTH, VIT_MLP), nn.GELU(), nn.Dropout(VIT_DROPOUT),
                                     nn.Linear(VIT_MLP, VIT_WIDTH), nn.Dropout(VIT_DROPOUT))

        def forward(self, x):
            y = self.ln1(x)
            x = x + self.drop(self.attention(y, y, y, need_weights=False)[0])
            return x + self.mlp(self.ln2(x))

    class ViT(nn.Module):
        def __init__(self):
            super().__init__()
            self.patches = nn.Conv2d(3, VIT_WIDTH, PATCH, stride=PATCH)
            self.positions = nn.Parameter(torch.zeros((32 // PATCH) ** 2, VIT_WIDTH))
            self.drop = nn.Dropout(VIT_DROPOUT)
            self.blocks = nn.Sequential(*[Encoder() for _ in range(VIT_DEPTH)])
            self.ln, self.head = nn.LayerNorm(VIT_WIDTH, eps=1e-6), nn.Linear(VIT_WIDTH, 10)

        def forward(self, x):  # x: (batch, 32, 32, 3), channels last as ddp holds images
            x = self.patches(x.permute(0, 3, 1, 2)).flatten(2).transpose(1, 2)
            x = self.blocks(self.drop(x + self.positions))
            return self.head(self.ln(x).mean(dim=1))
    return ViT()


def torch_model():
    import torch
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    nn = torch.nn
    if model == "gpt":
        net = torch_gpt(torch)
        optimizer = torch.optim.AdamW(net.parameters(), lr=0.003)
        windows = torch.from_numpy(text)

        def gpt_step(i):
            k = i % 8
            w = windows[k * BATCH:(k + 1) * BATCH]
            loss = nn.functional.cross_entropy(net(w[:, :-1]).reshape(-1, VOCAB), w[:, 1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        return gpt_step
    if model == "vit":
        net = torch_vit(torch)
        optimizer = torch.optim.AdamW(net.parameters(), lr=0.001, weight_decay=0.05)
        pictures = torch.from_numpy(rng.uniform(-1, 1, (BATCH * 8, 32, 32, 3)).astype(np.float32))
        classes = torch.from_numpy(labels)

        def vit_step(i):
            k = i % 8
            out = net(pictures[k * BATCH:(k + 1) * BATCH])
            loss = nn.functional.cross_entropy(out, classes[k * BATCH:(k + 1) * BATCH], label_smoothing=0.1)
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), 1.0)
            optimizer.step()
        return vit_step
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
