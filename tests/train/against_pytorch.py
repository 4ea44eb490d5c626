#!/usr/bin/env python3
"""against_pytorch.py PROGRAM: samples/fashion_mlp.ddp built with -Dshuffle=false,
trained for 50 steps by ddp and by PyTorch from the same initial weights (ddp's, saved
with --epochs 0 --save) on the same batches (samples 0..3199 in order). The final
weights and the mean training loss agree to 1e-4."""
import gzip
import json
import os
import subprocess
import sys

import numpy as np
import torch

from datafiles import scratch_folder

STEPS, BATCH, RATE = 50, 64, 0.1
DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    with gzip.open(path) as f:
        blob = f.read()
    rank = blob[3]
    dims = [int.from_bytes(blob[4 + 4 * i:8 + 4 * i], "big") for i in range(rank)]
    return np.frombuffer(blob, np.uint8, offset=4 + 4 * rank).reshape(dims)


def read_safetensors(path):
    blob = open(path, "rb").read()
    n = int.from_bytes(blob[:8], "little")
    header = json.loads(blob[8:8 + n])
    return {name: np.frombuffer(blob[8 + n + t["data_offsets"][0]:8 + n + t["data_offsets"][1]],
                                np.float32).reshape(t["shape"])
            for name, t in header.items() if name != "__metadata__"}


def run(cmd):
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode:
        sys.exit("FAIL: %s exited %d\n%s" % (" ".join(cmd), p.returncode, p.stdout))


def main():
    program = sys.argv[1]
    tmp = scratch_folder()
    init, final, metrics = (os.path.join(tmp, n) for n in ("init.safetensors", "final.safetensors", "m.json"))
    run([program, "--epochs", "0", "--save", init])
    run([program, "--epochs", "1", "--steps-per-epoch", str(STEPS), "--save", final, "--metrics", metrics])
    ddp_loss = json.loads(open(metrics).read().splitlines()[-1])["loss"]

    torch.manual_seed(0)
    torch.set_num_threads(2)
    w = read_safetensors(init)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    with torch.no_grad():  # ddp keeps dense weights as [in, out], torch as [out, in]
        model[1].weight.copy_(torch.from_numpy(w["mlp.hidden.weight"].T.copy()))
        model[1].bias.copy_(torch.from_numpy(w["mlp.hidden.bias"].copy()))
        model[3].weight.copy_(torch.from_numpy(w["mlp.logits.weight"].T.copy()))
        model[3].bias.copy_(torch.from_numpy(w["mlp.logits.bias"].copy()))
    images = read_idx(DATA + "/train-images-idx3-ubyte.gz")[:STEPS * BATCH].astype(np.float32) * np.float32(1 / 255)
    labels = read_idx(DATA + "/train-labels-idx1-ubyte.gz")[:STEPS * BATCH].astype(np.int64)
    optimizer = torch.optim.SGD(model.parameters(), lr=RATE)
    losses = []
    for step in range(STEPS):
        x = torch.from_numpy(images[step * BATCH:(step + 1) * BATCH])
        y = torch.from_numpy(labels[step * BATCH:(step + 1) * BATCH])
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    torch_loss = sum(losses) / len(losses)

    got = read_safetensors(final)
    want = {"mlp.hidden.weight": model[1].weight.detach().numpy().T, "mlp.hidden.bias": model[1].bias.detach().numpy(),
            "mlp.logits.weight": model[3].weight.detach().numpy().T, "mlp.logits.bias": model[3].bias.detach().numpy()}
    ok = True
    for name in want:
        diff = float(np.max(np.abs(got[name] - want[name])))
        print("%s %-20s max |ddp - torch| after %d steps: %.2e" % ("ok  " if diff <= 1e-4 else "FAIL", name, STEPS, diff))
        ok &= diff <= 1e-4
    diff = abs(ddp_loss - torch_loss)
    print("%s mean training loss: ddp %.7f, torch %.7f, difference %.2e" % ("ok  " if diff <= 1e-4 else "FAIL",
                                                                          ddp_loss, torch_loss, diff))
    ok &= diff <= 1e-4
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
