#!/usr/bin/env python3
"""repeats.py DDPC DDPRUN: augment_repeats (repeated augmentation) through built programs.

Programs written here train on 8 x 8 RGB bytes in .npy files, cropped (padding 2) and
flipped, each built by DDPC:

- --dump-batch with augment_repeats = 3 and shuffle off: rows 3k, 3k + 1 and 3k + 2
  are sample k, its label each time, each row one of the 50 crops and flips of its
  sample, the copies of most samples unlike each other; the first copy is the row the
  program without repeats makes (its draws are the sample's own); with shuffle on the
  first batch holds each of its samples three times in a row;
- the banner says the repeats; --seed 7 and --seed 8 dump other batches;
- 2 workers of batch 8 under DDPRUN train as one worker of batch 16, shuffled, with
  repeats: the saved parameters within 1e-5 of the norm (S1 holds: the order, copies
  included, is the job's, whatever its workers);
- without augmentations, ddpc warns that the copies are the same sample."""
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from datafiles import check, npy, read_safetensors, run, scratch_folder, with_port  # noqa: E402
import datafiles  # noqa: E402

SAMPLES, REPEATS = 48, 3

PROGRAM = """dataset images = npy(inputs = "x.npy", labels = "y.npy", scale = 1 / 255%(augment)s)
model net(input: [8, 8, 3]) {
    flatten()
    dense(16, activation = relu)
    dropout(0.25)
    logits: dense(10)
}
strategy multi_worker_mirrored {
    batch_per_replica = %(batch)d
    shuffle           = %(shuffle)s
    augment_repeats   = %(repeats)d
    train net on images {
        loss      = sparse_categorical_crossentropy(from_logits = true)
        optimizer = sgd(learning_rate = 0.05, momentum = 0.9)
        epochs    = 2
    }
}
"""
AUGMENT = ",\n                      augment = [random_crop(padding = 2), random_flip(horizontal)]"


def build(ddpc, root, name, batch=16, shuffle=False, repeats=REPEATS, augment=AUGMENT):
    source = os.path.join(root, name + ".ddp")
    with open(source, "w") as f:
        f.write(PROGRAM % {"batch": batch, "shuffle": "true" if shuffle else "false", "repeats": repeats,
                           "augment": augment})
    p = subprocess.run([ddpc, "build", source, "-o", os.path.join(root, name)], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True)
    if p.returncode:
        sys.exit("FAIL: ddpc build %s\n%s" % (name, p.stdout))
    return os.path.join(root, name), p.stdout


def dumped(program, root, seed=1):
    out = os.path.join(root, "batch.npy")
    said = run([program, "--data-root", root, "--dump-batch", out, "--seed", str(seed), "--run-dir",
                os.path.join(root, "run")])
    return np.load(out), np.load(out[:-4] + "-labels.npy"), said


def views(image):
    """the 50 crops (padding 2) and flips of an 8 x 8 x 3 image, scaled"""
    padded = np.zeros((12, 12, 3))
    padded[2:10, 2:10] = image / 255
    out = []
    for y in range(5):
        for x in range(5):
            crop = padded[y:y + 8, x:x + 8]
            out += [crop, crop[:, ::-1]]
    return out


def which_view(row, image):
    for i, v in enumerate(views(image)):
        if np.max(np.abs(v - row)) <= 1e-6:
            return i
    return None


def main():
    ddpc, ddprun = sys.argv[1], sys.argv[2]
    root = scratch_folder()
    rng = np.random.default_rng(3)
    pixels = rng.integers(1, 256, size=(SAMPLES, 8, 8, 3), dtype=np.uint8)
    labels = np.array([s % 10 for s in range(SAMPLES)], dtype=np.uint8)
    with open(os.path.join(root, "x.npy"), "wb") as f:
        f.write(npy("|u1", [SAMPLES, 8, 8, 3], pixels.tobytes()))
    with open(os.path.join(root, "y.npy"), "wb") as f:
        f.write(npy("|u1", [SAMPLES], labels.tobytes()))

    repeated, _ = build(ddpc, root, "repeated")
    x, y, said = dumped(repeated, root)
    samples = [r // REPEATS for r in range(len(x))]
    seen = [which_view(x[r], pixels[samples[r]]) for r in range(len(x))]
    check(all(v is not None for v in seen) and list(y) == [labels[s] for s in samples],
          "shuffle off: row r is a crop and flip of sample r / %d, with its label (views %s)" % (REPEATS, seen))
    apart = sum(len(set(seen[k:k + REPEATS])) > 1 for k in range(0, len(x) - REPEATS + 1, REPEATS))
    check(apart >= 4, "the copies of %d of the %d whole triples differ" % (apart, len(x) // REPEATS))
    check("samples 0, 0, ..." in said, "--dump-batch names the dataset's samples: %s" % said.strip())
    plain, _ = build(ddpc, root, "plain", repeats=1)
    x1, _, _ = dumped(plain, root)
    firsts = all(np.array_equal(x[k * REPEATS], x1[k]) for k in range(len(x) // REPEATS))
    check(firsts, "each sample's first copy is the row the program without repeats makes")
    other, _, _ = dumped(repeated, root, seed=8)
    check(not np.array_equal(other, dumped(repeated, root, seed=7)[0]), "another seed, other augmentations")

    shuffled, _ = build(ddpc, root, "shuffled", shuffle=True)
    x, y, _ = dumped(shuffled, root)
    found = [None] * len(x)
    for r in range(len(x)):
        for s in range(SAMPLES):
            if which_view(x[r], pixels[s]) is not None:
                found[r] = s
                break
    triples = [found[k:k + REPEATS] for k in range(0, len(x) - REPEATS + 1, REPEATS)]
    check(None not in found and all(len(set(t)) == 1 for t in triples) and len({t[0] for t in triples}) == len(triples)
          and found != [r // REPEATS for r in range(len(x))],
          "shuffle on: the first batch holds shuffled samples three times in a row (%s)" % found)

    out = run([shuffled, "--data-root", root, "--run-dir", os.path.join(root, "one"), "--threads", "1", "--save",
               os.path.join(root, "one.safetensors")])
    check("each sample 3 times in a row, augmented apart" in out, "the banner says the repeats")
    half, _ = build(ddpc, root, "half", batch=8, shuffle=True)
    run(with_port([ddprun, "-n"], 2) + ["2", half, "--data-root", root, "--run-dir", os.path.join(root, "two"),
                                         "--threads", "1", "--save", os.path.join(root, "two.safetensors")],
        timeout=300)
    one, _ = read_safetensors(os.path.join(root, "one.safetensors"))
    two, _ = read_safetensors(os.path.join(root, "two.safetensors"))
    a = np.concatenate([np.array(one[k]) for k in sorted(one)])
    b = np.concatenate([np.array(two[k]) for k in sorted(two)])
    d = float(np.linalg.norm(a - b) / np.linalg.norm(a))
    check(sorted(one) == sorted(two) and d <= 1e-5,
          "2 workers x 8 against 1 x 16, with repeats, 2 epochs: %.2e of the norm" % d)

    _, warned = build(ddpc, root, "bare", augment="")
    check("augment_repeats = 3 shows each sample 3 times in a row" in warned and "[repeats-without-augment]" in warned,
          "without augmentations, ddpc warns: %s" % warned.strip().splitlines()[0])
    sys.exit(1 if datafiles.failures else 0)


if __name__ == "__main__":
    main()
