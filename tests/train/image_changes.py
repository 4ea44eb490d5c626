#!/usr/bin/env python3
"""image_changes.py DDPC: random_color, random_grayscale, random_erasing,
trivial_augment, rand_augment and auto_augment through a built program, read back from
--dump-batch.

Programs written here train on 8 x 8 images in .npy files (shuffle off, so the first
batch is samples 0 .. 15), each built by DDPC and dumped:

- brightness alone on RGB bytes, scale 1 / 255, normalised per channel: with the
  normalisation undone, every value of a sample is its byte / 255 times one factor
  in [0.5, 1.5], clipped at 1 (some are);
- the same with scale 1 and no normalisation: clipped at 255, the bytes' top;
- float32 inputs in [0, 1] with scale 2: clipped at 1, as torchvision takes float
  images, whatever the scale;
- contrast alone on grey bytes: every value is f x + (1 - f) m, clipped at 1, with m
  the sample's mean and f in [0.7, 1.3] (fitted);
- all four changes: values in [0, 1], the samples changed, two dumps alike and
  another seed's otherwise; the banner names them; a run of 2 epochs trains;
- random_grayscale(probability = 0.5): each sample grey or as it was;
- random_erasing(probability = 1) on 16 x 16 images: each sample's changed values a
  box, zero (normalised) or, with value = random, of mean 0 and deviation 1;
- trivial_augment, rand_augment and auto_augment: every value still a byte / 255,
  most samples changed, the same twice; the banner names them.
ddp_color_image and ddp_image_op_apply themselves are held to torchvision's functions in
tests/unit/augment.c."""
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from datafiles import check, npy, run, scratch_folder  # noqa: E402
import datafiles  # noqa: E402

SAMPLES, BATCH = 48, 16
MEAN, STD = [0.5, 0.4, 0.3], [0.25, 0.2, 0.3]

PROGRAM = """dataset images = npy(inputs = "x.npy", labels = "y.npy", scale = %(scale)s%(normalise)s,
                      augment = [%(augment)s])
model net(input: %(shape)s) {
    flatten()
    logits: dense(10)
}
train net on images {
    batch_per_replica = %(batch)d
    shuffle           = false
    loss              = sparse_categorical_crossentropy(from_logits = true)
    optimizer         = sgd(learning_rate = 0.01)
    epochs            = 1
}
"""


def build(ddpc, root, name, augment, scale="1 / 255", normalise=True, grey=False, shape=None):
    source = os.path.join(root, name + ".ddp")
    channels = 1 if grey else 3
    with open(source, "w") as f:
        f.write(PROGRAM % {"scale": scale, "augment": augment, "batch": BATCH,
                           "shape": shape or ("[8, 8]" if grey else "[8, 8, 3]"),
                           "normalise": ", mean = %s, std = %s" % (MEAN[:channels], STD[:channels])
                           if normalise else ""})
    run([ddpc, "build", source, "-o", os.path.join(root, name)])
    return os.path.join(root, name)


def write_inputs(root, values, descr):
    with open(os.path.join(root, "x.npy"), "wb") as f:
        f.write(npy(descr, list(values.shape), values.tobytes()))
    with open(os.path.join(root, "y.npy"), "wb") as f:
        f.write(npy("|u1", [SAMPLES], bytes(s % 10 for s in range(SAMPLES))))


def dumped(program, root, normalise, grey=False, seed=1):
    """the first batch with its normalisation undone, float64"""
    out = os.path.join(root, "batch.npy")
    run([program, "--data-root", root, "--dump-batch", out, "--seed", str(seed), "--run-dir",
         os.path.join(root, "run")])
    x = np.load(out).astype(np.float64)
    if normalise:
        channels = 1 if grey else 3
        x = x * np.array(STD[:channels]) + np.array(MEAN[:channels])  # along the last axis: grey's one pair too
    return x


def brightness_factors(raw, got, top, tolerance):
    """each sample's factor, where its unclipped values agree on one; None if they do not"""
    factors = []
    for s in range(len(raw)):
        free = (got[s] < top * (1 - 1e-6)) & (raw[s] > 0.05 * top)
        ratios = got[s][free] / raw[s][free]
        f = float(np.median(ratios))
        clipped_right = np.all(np.abs(got[s][~free & (raw[s] * f >= top)] - top) <= tolerance * top)
        if not (np.all(np.abs(ratios - f) <= tolerance * f) and clipped_right):
            return None
        factors.append(f)
    return factors


def brightness(ddpc):
    rng = np.random.default_rng(5)
    root = scratch_folder()
    pixels = rng.integers(0, 256, size=(SAMPLES, 8, 8, 3), dtype=np.uint8)
    write_inputs(root, pixels, "|u1")
    raw = pixels[:BATCH].astype(np.float64)
    for name, scale, normalise, top in (("bright", "1 / 255", True, 1.0), ("bright255", "1", False, 255.0)):
        program = build(ddpc, root, name, "random_color(brightness = 0.5)", scale, normalise)
        got = dumped(program, root, normalise)
        factors = brightness_factors(raw / 255 * top, got, top, 1e-5)
        ok = factors is not None and all(0.5 <= f <= 1.5 for f in factors) and min(factors) < 0.9 < 1.1 < max(factors)
        clipped = int(np.sum(np.abs(got - top) <= 1e-6 * top) - np.sum(raw == 255))
        check(ok and clipped > 0 and got.max() <= top * (1 + 1e-6),
              "%s: each sample its byte times one factor in [0.5, 1.5] (%s), clipped at %g (%d values)"
              % (name, "none" if factors is None else "%.4f .. %.4f" % (min(factors), max(factors)), top, clipped))
    floats = rng.random(size=(SAMPLES, 8, 8, 3), dtype=np.float32) * 0.5
    write_inputs(root, floats, "<f4")
    program = build(ddpc, root, "bright_float", "random_color(brightness = 0.5)", "2", False)
    got = dumped(program, root, False)
    factors = brightness_factors(floats[:BATCH].astype(np.float64) * 2, got, 1.0, 1e-5)
    check(factors is not None and got.max() <= 1 + 1e-6 and np.sum(got >= 1 - 1e-6) > 0,
          "float inputs (scale 2) clipped at 1, not at 2")


def contrast(ddpc):
    root = scratch_folder()
    pixels = np.random.default_rng(6).integers(0, 256, size=(SAMPLES, 8, 8), dtype=np.uint8)
    write_inputs(root, pixels, "|u1")
    program = build(ddpc, root, "contrast", "random_color(contrast = 0.3)", grey=True)
    got = dumped(program, root, True, grey=True)
    ok, seen = True, []
    for s in range(BATCH):
        x = pixels[s].astype(np.float64).ravel() / 255
        m = x.mean()
        y = got[s].ravel()
        free = (y > 1e-6) & (y < 1 - 1e-6)
        f = float(np.sum((x[free] - m) * (y[free] - m)) / np.sum((x[free] - m) ** 2))
        want = np.clip(f * x + (1 - f) * m, 0, 1)
        ok &= 0.7 <= f <= 1.3 and np.max(np.abs(want - y)) < 1e-5
        seen.append(f)
    check(ok, "grey contrast: f x + (1 - f) mean, clipped, f in [0.7, 1.3] (%.3f .. %.3f)" % (min(seen), max(seen)))


def all_four(ddpc):
    root = scratch_folder()
    pixels = np.random.default_rng(7).integers(0, 256, size=(SAMPLES, 8, 8, 3), dtype=np.uint8)
    write_inputs(root, pixels, "|u1")
    augment = "random_color(brightness = 0.4, contrast = 0.4, saturation = 0.4, hue = 0.1)"
    program = build(ddpc, root, "colors", augment)
    a, b = dumped(program, root, True), dumped(program, root, True)
    other = dumped(program, root, True, seed=2)
    raw = pixels[:BATCH].astype(np.float64) / 255
    changed = np.mean(np.abs(a - raw) > 0.02)
    check(np.array_equal(a, b) and not np.array_equal(a, other) and a.min() >= -1e-6 and a.max() <= 1 + 1e-6
          and changed > 0.5, "all four: in [0, 1], %.0f%% of the values changed, the same for a seed and "
          "another for another" % (100 * changed))
    out = run([program, "--data-root", root, "--epochs", "2", "--threads", "1", "--run-dir",
               os.path.join(root, "trained")])
    check("augmented: " + augment in out and "\ndone:" in out, "the banner names it and 2 epochs train")


def grayscale(ddpc):
    root = scratch_folder()
    pixels = np.random.default_rng(8).integers(0, 256, size=(SAMPLES, 8, 8, 3), dtype=np.uint8)
    write_inputs(root, pixels, "|u1")
    got = dumped(build(ddpc, root, "grey", "random_grayscale(probability = 0.5)"), root, True)
    raw = pixels[:BATCH].astype(np.float64) / 255
    grey = (0.2989 * raw[..., 0] + 0.587 * raw[..., 1] + 0.114 * raw[..., 2])[..., None]
    made = [bool(np.max(np.abs(got[s] - grey[s])) < 1e-5) for s in range(BATCH)]
    kept = [bool(np.max(np.abs(got[s] - raw[s])) < 1e-5) for s in range(BATCH)]
    check(all(m != k for m, k in zip(made, kept)) and 3 <= sum(made) <= 13,
          "random_grayscale(probability = 0.5): %d of %d samples grey (0.2989 R + 0.587 G + 0.114 B), the others "
          "as they were" % (sum(made), BATCH))


def erasing(ddpc):
    root = scratch_folder()
    pixels = np.random.default_rng(9).integers(1, 256, size=(SAMPLES, 16, 16, 3), dtype=np.uint8)
    write_inputs(root, pixels, "|u1")
    normalised = ((pixels[:BATCH].astype(np.float32) / np.float32(255) - np.array(MEAN)) / np.array(STD))
    for value in ("zero", "random"):
        program = build(ddpc, root, "erase_" + value, "random_erasing(probability = 1, value = %s)" % value,
                        shape="[16, 16, 3]")
        said = run([program, "--data-root", root, "--check", "--run-dir", os.path.join(root, "run")])
        named = "random_erasing(probability = 1, scale = [0.02, 0.33], ratio = [0.3, 3.3], value = %s)" % value
        check(named in said, "the banner names " + named)
        out = os.path.join(root, "batch.npy")
        run([program, "--data-root", root, "--dump-batch", out, "--run-dir", os.path.join(root, "run")])
        got = np.load(out).astype(np.float64)
        ok, shares, inside = True, [], []
        for s in range(BATCH):
            changed = np.any(np.abs(got[s] - normalised[s]) > 1e-5, axis=-1)
            ys, xs = np.nonzero(changed)
            if len(ys) == 0:
                continue  # no try of ten fitted: the sample as it was
            y0, y1, x0, x1 = ys.min(), ys.max() + 1, xs.min(), xs.max() + 1
            box = got[s, y0:y1, x0:x1]
            shares.append((y1 - y0) * (x1 - x0) / 256)
            ok &= bool(changed[y0:y1, x0:x1].all() or value == "random")  # a random value may land near the old
            ok &= bool(np.all(box == 0)) if value == "zero" else True
            inside.extend(box.ravel())
        inside = np.array(inside)
        if value == "random":
            ok &= abs(inside.mean()) < 0.15 and abs(inside.std() - 1) < 0.15
        check(ok and len(shares) >= BATCH - 2 and min(shares) >= 0.01 and max(shares) <= 0.4,
              "random_erasing(value = %s): a box a sample of %.2f .. %.2f of the area, %s, the rest as it was"
              % (value, min(shares or [0]), max(shares or [0]), "the normalised zero" if value == "zero" else
                 "normal values (mean %.2f, sd %.2f)" % (inside.mean(), inside.std())))


def auto_augment(ddpc):
    root = scratch_folder()
    pixels = np.random.default_rng(10).integers(0, 256, size=(SAMPLES, 16, 16, 3), dtype=np.uint8)
    write_inputs(root, pixels, "|u1")
    for name, augment, banner in (
            ("trivial", "trivial_augment(interpolation = bilinear)",
             "trivial_augment(bins = 31, interpolation = bilinear)"),
            ("rand", "rand_augment()", "rand_augment(ops = 2, magnitude = 9, bins = 31, interpolation = nearest)"),
            ("auto", "auto_augment(policy = cifar10)", "auto_augment(policy = cifar10, interpolation = nearest)")):
        program = build(ddpc, root, name, augment, shape="[16, 16, 3]")
        said = run([program, "--data-root", root, "--check", "--run-dir", os.path.join(root, "run")])
        check("augmented: " + banner in said, "the banner names " + banner)
        a, b = dumped(program, root, True), dumped(program, root, True)
        bytes_ = a * 255
        whole = np.max(np.abs(bytes_ - np.round(bytes_)))
        changed = sum(not np.array_equal(np.round(bytes_[s]), pixels[s]) for s in range(BATCH))
        check(np.array_equal(a, b) and whole < 1e-3 and changed >= BATCH // 2,
              "%s: every value a byte / 255 (within %.1e), %d of %d samples changed, two dumps alike"
              % (augment, whole, changed, BATCH))


def main():
    ddpc = sys.argv[1]
    auto_augment(ddpc)
    brightness(ddpc)
    contrast(ddpc)
    all_four(ddpc)
    grayscale(ddpc)
    erasing(ddpc)
    sys.exit(1 if datafiles.failures else 0)


if __name__ == "__main__":
    main()
