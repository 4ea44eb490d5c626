#!/usr/bin/env python3
"""language_model.py PROGRAMS: one training step of tests/train/language_model.ddp
against figures computed here by hand, in float64 with nothing but the standard
library.

The test writes a flat file of 33 uint16 tokens to train on (8 windows of 4, each
token's label the next), validation files (uint16 .npy: [samples, 4] indices, the next
tokens as int32 labels of the same shape) and initial weights, runs one full-batch
SGD step, and checks:
- the training loss and accuracy at the initial weights: the mean over every token of
  every sample, each position's row of 300 scores against its own next token;
- the updated weights: the embedding's rows of the tokens the batch holds moved by
  their summed gradients (the rest unchanged), the dense layer's by theirs;
- the validation figures at the updated weights;
- the same run on the emulated GPU, and --predict's [samples, 4, 300] rows;
- a bf16 program on the emulated GPU keeps indices above 256 exact (bf16 holds whole
  numbers exactly only to 256): its predictions are the f32 ones within bf16's
  precision, where token 257 read as 256 would give another row;
- a token outside 0..299 (in either file), labels of one class a sample, a file of
  tokens of an odd number of bytes or too short for a window stop the run before it
  trains (status 1) with a message naming the file."""
import json
import math
import os
import struct
import subprocess
import sys

import datafiles
from datafiles import check, npy, read_safetensors, run, scratch_folder, write_safetensors

VOCAB, UNITS, POSITIONS, RATE = 300, 3, 4, 0.5
STREAM = [(7 * t + t * t // 3) % VOCAB for t in range(8 * POSITIONS + 1)]
STREAM[1], STREAM[6], STREAM[9] = 257, 299, 256  # indices bf16 would round
CHECK = [[(11 * s + 29 * i + 3) % VOCAB for i in range(POSITIONS + 1)] for s in range(5)]
CHECK[0][0], CHECK[1][1] = 257, 299


def f32(v):
    return struct.unpack("<f", struct.pack("<f", v))[0]


E0 = [[f32(math.sin(1.7 * v + 0.9 * u) * 0.8) for u in range(UNITS)] for v in range(VOCAB)]
W0 = [[f32(math.cos(0.37 * u * VOCAB + 0.61 * j) * 0.9) for j in range(VOCAB)] for u in range(UNITS)]
B0 = [f32(0.01 * ((j % 7) - 3)) for j in range(VOCAB)]


def scores(e, w, b, token):
    x = e[token]
    return [sum(x[u] * w[u][j] for u in range(UNITS)) + b[j] for j in range(VOCAB)]


def predicted(e, w, b, token):
    z = scores(e, w, b, token)
    return max(range(VOCAB), key=lambda j: (z[j], -j))


for s in range(8):  # a quarter of the tokens right at w0, for the accuracy
    STREAM[POSITIONS * s + POSITIONS] = predicted(E0, W0, B0, STREAM[POSITIONS * s + POSITIONS - 1])
TRAIN = [STREAM[POSITIONS * s:POSITIONS * s + POSITIONS + 1] for s in range(8)]  # the windows and their next


def write_stream(root, tokens, fmt="<%dH"):
    open(os.path.join(root, "text.bin"), "wb").write(struct.pack(fmt % len(tokens), *tokens))


def write_tokens(root, name, rows):
    """inputs: each row's first 4 tokens (uint16); labels: the 4 after them (int32)"""
    n = len(rows)
    open(os.path.join(root, name + "tokens.npy"), "wb").write(
        npy("<u2", [n, POSITIONS], b"".join(struct.pack("<4H", *r[:POSITIONS]) for r in rows)))
    open(os.path.join(root, name + "next.npy"), "wb").write(
        npy("<i4", [n, POSITIONS], b"".join(struct.pack("<4i", *r[1:]) for r in rows)))


def figures(e, w, b, rows):
    """the mean loss and accuracy over every token, and the gradients of the mean loss"""
    tokens = len(rows) * POSITIONS
    loss, right = 0.0, 0
    ge = [[0.0] * UNITS for _ in range(VOCAB)]
    gw = [[0.0] * VOCAB for _ in range(UNITS)]
    gb = [0.0] * VOCAB
    for r in rows:
        for p in range(POSITIONS):
            token, label = r[p], r[p + 1]
            z = scores(e, w, b, token)
            m = max(z)
            ex = [math.exp(v - m) for v in z]
            s = sum(ex)
            loss += math.log(s) + m - z[label]
            right += predicted(e, w, b, token) == label
            for j in range(VOCAB):
                d = (ex[j] / s - (j == label)) / tokens
                gb[j] += d
                for u in range(UNITS):
                    gw[u][j] += e[token][u] * d
                    ge[token][u] += w[u][j] * d
    return loss / tokens, right / tokens, ge, gw, gb


def close(what, got, want, tol, quiet=False):
    ok = abs(got - want) <= tol * max(1.0, abs(want))
    if not ok and not quiet:
        print("FAIL %-28s ddp %.9g  by hand %.9g" % (what, got, want))
    return ok


def status_of(command):
    p = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    return p.returncode, p.stdout


def read_npy_f32(path):
    blob = open(path, "rb").read()
    n = struct.unpack("<H", blob[8:10])[0]
    return struct.unpack("<%df" % ((len(blob) - 10 - n) // 4), blob[10 + n:])


def main():
    programs = sys.argv[1]
    program, bf16 = os.path.join(programs, "language_model"), os.path.join(programs, "language_model_bf16")
    root = scratch_folder()
    path = lambda name: os.path.join(root, name)
    write_stream(root, STREAM)
    write_tokens(root, "check_", CHECK)
    write_safetensors(path("w0.safetensors"), [
        ("lm.embedding_1.weight", [VOCAB, UNITS], [v for row in E0 for v in row]),
        ("lm.logits.weight", [UNITS, VOCAB], [v for row in W0 for v in row]),
        ("lm.logits.bias", [VOCAB], B0)])
    given = ["--data-root", root, "--load", path("w0.safetensors")]

    loss0, acc0, ge, gw, gb = figures(E0, W0, B0, TRAIN)
    e1 = [[E0[v][u] - RATE * ge[v][u] for u in range(UNITS)] for v in range(VOCAB)]
    w1 = [[W0[u][j] - RATE * gw[u][j] for j in range(VOCAB)] for u in range(UNITS)]
    b1 = [B0[j] - RATE * gb[j] for j in range(VOCAB)]
    val_loss, val_acc, _, _, _ = figures(e1, w1, b1, CHECK)

    for device in ("cpu", "emulated"):
        saved, metrics = path(device + ".safetensors"), path(device + ".json")
        run([program, *given, "--device", device, "--save", saved, "--metrics", metrics])
        m = json.loads(open(metrics).read().splitlines()[0])
        check(close("loss", m["loss"], loss0, 1e-6) and close("accuracy", m["accuracy"], acc0, 0),
              "%s: the training loss %.6f and accuracy %.4f at w0: the mean over all 32 tokens (by hand %.6f, %.4f)"
              % (device, m["loss"], m["accuracy"], loss0, acc0))
        check(close("val_loss", m["val_loss"], val_loss, 1e-6) and close("val_accuracy", m["val_accuracy"], val_acc, 0),
              "%s: the validation figures at w1 (%.6f, %.4f)" % (device, m["val_loss"], m["val_accuracy"]))
        t, _ = read_safetensors(saved)
        emb = t["lm.embedding_1.weight"]
        check(all(close("e1", emb[v * UNITS + u], e1[v][u], 1e-6) for v in range(VOCAB) for u in range(UNITS)),
              "%s: every embedding row after the step, those of tokens the batch holds moved" % device)
        check(all(close("w1", t["lm.logits.weight"][u * VOCAB + j], w1[u][j], 1e-6)
                  for u in range(UNITS) for j in range(VOCAB)) and
              all(close("b1", t["lm.logits.bias"][j], b1[j], 1e-6) for j in range(VOCAB)),
              "%s: the dense layer's weights after the step" % device)

    want = [z for r in CHECK for p in range(POSITIONS) for z in scores(E0, W0, B0, r[p])]
    run([program, *given, "--predict", path("f32.npy")])
    got = read_npy_f32(path("f32.npy"))
    check(len(got) == len(want) and all(close("logit", g, h, 1e-6) for g, h in zip(got, want)),
          "--predict: a row of 300 scores at each of the 4 positions of every validation sample")
    run([bf16, *given, "--device", "emulated", "--predict", path("bf16.npy")])
    got = read_npy_f32(path("bf16.npy"))
    wrong = scores(E0, W0, B0, 256)
    check(len(got) == len(want) and all(close("bf16 logit", g, h, 3e-2) for g, h in zip(got, want)) and
          not all(close("257 as 256", g, h, 3e-2, True) for g, h in zip(got[:VOCAB], wrong)),
          "bf16: token 257's row, not 256's, and every score within bf16's precision")

    def refused(what, message):
        status, said = status_of([program, *given])
        check(status == 1 and message in said, "%s: status 1, the file named (status %s)" % (what, status))

    write_stream(root, STREAM[:20] + [VOCAB] + STREAM[21:])
    refused("a token past the vocabulary in the file of tokens", "%s: holds the token 300, but the model `lm` looks "
            "tokens up in an embedding of token indices 0..299" % path("text.bin"))
    write_stream(root, STREAM)
    bad = [r[:] for r in CHECK]
    bad[3][0] = VOCAB  # an input alone: the labels are the tokens after it
    write_tokens(root, "check_", bad)
    refused("a token past the vocabulary in a .npy file", "%s: sample 3 holds 300 at position 0, but the model `lm` "
            "looks it up in an embedding of token indices 0..299" % path("check_tokens.npy"))
    bad = [r[:] for r in CHECK]
    bad[3][2] = VOCAB  # an input and a label: the labels, checked first
    write_tokens(root, "check_", bad)
    refused("a token past the classes in a .npy file of labels", "%s: sample 3 has the label value 300 (value 1 of "
            "its label), but the model `lm` outputs [4, 300], so class indices run 0..299" % path("check_next.npy"))
    write_tokens(root, "check_", CHECK)
    open(path("check_next.npy"), "wb").write(npy("<i4", [5], b"".join(struct.pack("<i", r[1]) for r in CHECK)))
    refused("one class a sample for a class at each position", "%s: holds 1 class index a sample, but the model `lm` "
            "outputs [4, 300], a class at each of 4 positions" % path("check_next.npy"))
    write_tokens(root, "check_", CHECK)
    open(path("text.bin"), "wb").write(struct.pack("<%dH" % len(STREAM), *STREAM) + b"\0")
    refused("a file of tokens of an odd number of bytes", "%s: holds 67 bytes, not a whole number of 2-byte tokens "
            "(type = uint16)" % path("text.bin"))
    write_stream(root, STREAM[:4])
    refused("a file of tokens shorter than a window and its next", "%s: holds 4 tokens (type = uint16), too few for "
            "one window of 4 and the token after it" % path("text.bin"))
    sys.exit(1 if datafiles.failures else 0)


if __name__ == "__main__":
    main()
