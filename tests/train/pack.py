#!/usr/bin/env python3
"""pack.py DDPPACK PROGRAM: ddppack turns a folder of JPEG and PNG images, one
subfolder per class, into .npy files: classes and images in byte order of their
names, labels the class's place, each image resized by its shorter side and its
centre kept (checked against a gradient's known values and solid colours), grayscale,
CMYK, palette, RGBA and 16-bit images made 8-bit RGB, each read as what its bytes say
whatever its name, the same bytes on any number of threads, and a program
(packed.ddp) trains on them. Bad input (a damaged or false JPEG or PNG, a header
claiming a huge image, an empty class, a folder already packed, bad usage) gets its
message and status, and a failed packing leaves nothing behind; --skip-bad leaves the
bad image out and lists it. The JPEGs are written by cjpeg, the PNGs here."""
import os
import resource
import signal
import struct
import subprocess
import sys
import tempfile
import zlib

import numpy as np

ddppack, program = sys.argv[1], sys.argv[2]
failures = 0


def check(ok, what):
    global failures
    print(("ok   " if ok else "FAIL ") + what)
    failures += not ok


def jpeg(path, pixels, *flags):
    """pixels (h, w, 3) uint8 into a JPEG at path, through a PPM and cjpeg"""
    h, w, _ = pixels.shape
    ppm = path + ".ppm"
    with open(ppm, "wb") as f:
        f.write(b"P6\n%d %d\n255\n" % (w, h) + pixels.astype(np.uint8).tobytes())
    subprocess.run(["cjpeg", "-quality", "100", *flags, "-outfile", path, ppm], check=True)
    os.remove(ppm)


def solid(h, w, rgb):
    return np.broadcast_to(np.array(rgb, np.uint8), (h, w, 3)).copy()


def png(path, values, bit_depth=8, color_type=2, palette=None):
    """values (h, w, samples), as the PNG holds them, into a PNG at path (one IDAT,
    no filtering), as the format's specification says"""
    h, w = values.shape[:2]
    rows = values.astype(">u2" if bit_depth == 16 else np.uint8)
    raw = b"".join(b"\0" + rows[y].tobytes() for y in range(h))

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    body = chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, bit_depth, color_type, 0, 0, 0))
    body += chunk(b"PLTE", bytes(palette)) if palette else b""
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + body + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))


def pack(*args):
    r = subprocess.run([ddppack, *args], capture_output=True, text=True)
    return r.returncode, r.stdout + r.stderr


def expect(status, text, *args):
    got, out = pack(*args)
    # a sanitizer's report fails it too: LeakSanitizer keeps a failing run's status
    check(got == status and text in out and "Sanitizer" not in out, "ddppack %s -> %d, says %r%s" % (" ".join(args[2:]) if len(args) > 2 else
                                                                             " ".join(args), got, text,
                                                                             "" if got == status and text in out
                                                                             and "Sanitizer" not in out
                                                                             else ":\n" + out))
    return out


root = tempfile.mkdtemp()
src = os.path.join(root, "src")
for c in ["ant", "bee", "cat"]:
    os.makedirs(os.path.join(src, c))
# the gradient: red is x and green is y, 256 x 160
ys, xs = np.mgrid[0:160, 0:256]
gradient = np.stack([xs, ys, np.full_like(xs, 90)], axis=-1).astype(np.uint8)
jpeg(os.path.join(src, "bee", "b0.jpg"), gradient)
jpeg(os.path.join(src, "ant", "a1.JPEG"), solid(30, 40, (200, 30, 30)))
jpeg(os.path.join(src, "ant", "a0.jpg"), solid(50, 30, (20, 180, 40)))
jpeg(os.path.join(src, "ant", "a2.jpeg"), solid(64, 64, (120, 120, 120)), "-grayscale")
jpeg(os.path.join(src, "cat", "c0.jpg"), solid(100, 80, (10, 20, 230)))
jpeg(os.path.join(src, "cat", "c1.jpg"), solid(20, 20, (250, 250, 0)))
jpeg(os.path.join(src, "cat", ".hidden.jpg"), solid(20, 20, (0, 0, 0)))
with open(os.path.join(src, "bee", "notes.txt"), "w") as f:
    f.write("not an image\n")

out = os.path.join(root, "packed")
says = expect(0, "6 images of 3 classes", src, out, "--size", "12x16", "--resize", "20", "--per-file", "4")
check("1 file not named .jpg, .jpeg or .png left out" in says and "notes.txt" in says, "the other file is named")
names = sorted(os.listdir(out))
check(names == ["classes.txt", "images-00000.npy", "images-00001.npy", "labels-00000.npy", "labels-00001.npy"],
      "two files of at most 4, and the classes: %s" % names)
x = np.concatenate([np.load(os.path.join(out, "images-%05d.npy" % i)) for i in range(2)])
y = np.concatenate([np.load(os.path.join(out, "labels-%05d.npy" % i)) for i in range(2)])
check(x.shape == (6, 12, 16, 3) and x.dtype == np.uint8, "images (6, 12, 16, 3) uint8: %s %s" % (x.shape, x.dtype))
check(y.dtype == np.int32 and y.tolist() == [0, 0, 0, 1, 2, 2], "labels by class, in order: %s" % y.tolist())
check(open(os.path.join(out, "classes.txt")).read() == "ant\nbee\ncat\n", "classes.txt names them in order")
# ant: a0 (green), a1 (red), a2 (gray, from a grayscale JPEG); cat: c0 (blue), c1 (yellow)
for i, rgb in [(0, (20, 180, 40)), (1, (200, 30, 30)), (2, (120, 120, 120)), (4, (10, 20, 230)), (5, (250, 250, 0))]:
    err = np.abs(x[i].astype(int) - np.array(rgb)).max()
    check(err <= 3, "image %d is %s to %d levels" % (i, rgb, err))
# the gradient resized from 256 x 160 to 32 x 20 (the shorter side to 20: 8 pixels
# become 1), its centre 12 x 16 from row 4 and column 8: each pixel the mean of its
# 8 x 8 block, whose red is its x and green its y at the block's centre
ii, jj = np.mgrid[0:12, 0:16]
want = np.stack([(jj + 8) * 8 + 3.5, (ii + 4) * 8 + 3.5, np.full(ii.shape, 90.0)], axis=-1)
err = np.abs(x[3].astype(float) - want).max()
check(err <= 4, "the gradient's centre, resized: within %.1f levels" % err)

one = os.path.join(root, "one_thread")
expect(0, "6 images", src, one, "--size", "12x16", "--resize", "20", "--per-file", "4", "--threads", "1")
same = all(open(os.path.join(out, n), "rb").read() == open(os.path.join(one, n), "rb").read() for n in names)
check(same, "one thread packs the same bytes as two")

# CMYK, as Photoshop writes it (inverted, with Adobe's marker), where Pillow can write it
try:
    from PIL import Image
except ImportError:
    Image = None
if Image:
    cmyk_src = os.path.join(root, "cmyk", "x")
    os.makedirs(cmyk_src)
    for name, cmyk in [("red.jpg", (0, 255, 255, 0)), ("gray.jpg", (0, 0, 0, 128)), ("teal.jpg", (200, 0, 60, 40))]:
        Image.new("CMYK", (24, 20), cmyk).save(os.path.join(cmyk_src, name), quality=100)
    cmyk_out = os.path.join(root, "cmyk_packed")
    expect(0, "3 images of 1 class", os.path.dirname(cmyk_src), cmyk_out, "--size", "8")
    got = np.load(os.path.join(cmyk_out, "images-00000.npy"))[:, 4, 4].astype(int)
    want = np.array([[(255 - c) * (255 - k) / 255 for c in cmyk[:3]] for cmyk, k in
                     [((0, 0, 0), 128), ((0, 255, 255), 0), ((200, 0, 60), 40)]])
    check(np.abs(got - want).max() <= 3, "CMYK images become RGB: %s, wanted %s" % (got.tolist(), want.round().tolist()))
else:
    print("ok   (no Pillow here to write CMYK JPEGs: their conversion is not checked)")

# PNG: RGB, grey, RGBA (alpha dropped), a palette, 16-bit (scaled to 8), each read as
# what its bytes say whatever its name (a PNG named .JPEG, as one of ImageNet's is; a
# JPEG named .png)
png_src = os.path.join(root, "png", "p")
os.makedirs(png_src)
solid_values = lambda values: np.broadcast_to(np.array(values), (24, 20, len(values))).copy()
png(os.path.join(png_src, "0_rgb.png"), solid_values((200, 100, 50)))
png(os.path.join(png_src, "1_grey.png"), solid_values((77,)), color_type=0)
png(os.path.join(png_src, "2_rgba.png"), solid_values((10, 20, 30, 128)), color_type=6)
png(os.path.join(png_src, "3_palette.png"), solid_values((1,)), color_type=3, palette=[0, 0, 0, 9, 99, 199])
png(os.path.join(png_src, "4_deep.png"), solid_values((200 * 257, 10 * 257 + 128, 65535)), bit_depth=16)
png(os.path.join(png_src, "5_named.JPEG"), solid_values((1, 2, 3)))
jpeg(os.path.join(png_src, "6_jpeg.png"), solid(24, 20, (30, 60, 90)))
png_out = os.path.join(root, "png_packed")
expect(0, "7 images of 1 class", os.path.dirname(png_src), png_out, "--size", "8")
got = np.load(os.path.join(png_out, "images-00000.npy"))[:, 4, 4].astype(int).tolist()
want = [[200, 100, 50], [77, 77, 77], [10, 20, 30], [9, 99, 199], [200, 10, 255], [1, 2, 3], [30, 60, 90]]
check(np.abs(np.array(got) - np.array(want)).max() <= 2, "PNGs of every kind become RGB: %s, wanted %s" % (got, want))
# a PNG cut short, one whose data fail their check (a bit of its CRC flipped), one
# whose header (with its CRC) claims 65000 x 65000 pixels
whole_png = open(os.path.join(png_src, "0_rgb.png"), "rb").read()
idat = whole_png.index(b"IDAT")
crc_at = idat + 4 + struct.unpack(">I", whole_png[idat - 4:idat])[0]
ihdr = b"IHDR" + struct.pack(">IIBBBBB", 65000, 65000, 8, 2, 0, 0, 0)
for name, data, says in [("cut.png", whole_png[: idat + 12], "not a readable PNG image: the file is cut short"),
                         ("crc.png", whole_png[:crc_at] + bytes([whole_png[crc_at] ^ 1]) + whole_png[crc_at + 1:],
                          "not a readable PNG image: IDAT: CRC error"),
                         ("huge.png", whole_png[:12] + ihdr + struct.pack(">I", zlib.crc32(ihdr)) + whole_png[33:],
                          "it says it is 65000 x 65000 pixels, more than ddppack decodes")]:
    bad = os.path.join(png_src, name)
    open(bad, "wb").write(data)
    expect(1, bad + ": " + says, os.path.dirname(png_src), os.path.join(root, "png_failed"), "--size", "8")
    os.remove(bad)

# a file that cannot be written (the process's file size limit, 600 bytes, below the
# images file's) stops the packing, naming it, and leaves nothing behind
def small_files():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (600, 600))


limited = os.path.join(root, "limited")
r = subprocess.run([ddppack, os.path.dirname(png_src), limited, "--size", "8"], capture_output=True, text=True,
                   preexec_fn=small_files)
check(r.returncode == 1 and "images-00000.npy: cannot write it: File too large" in r.stderr
      and "Sanitizer" not in r.stderr and os.listdir(limited) == [],
      "a file that cannot be written is named, and nothing is left: %d %s %s" % (r.returncode, r.stderr.strip(),
                                                                                os.listdir(limited)))

r = subprocess.run([program, "--data-root", root, "--run-dir", os.path.join(root, "run")], capture_output=True,
                   text=True)
check(r.returncode == 0 and "6 samples of [12, 16, 3]" in r.stdout and "done: 2 epochs" in r.stdout
      and "random_resized_crop(size = [10, 14], scale = [0.5, 1]" in r.stdout
      and "val_accuracy" in r.stdout, "packed.ddp trains on random windows of them resized and validates on their "
      "centres:\n" + "\n".join(l for l in r.stdout.splitlines() if "data" in l or "done" in l)
      + ("" if r.returncode == 0 else r.stdout + r.stderr))

# --data-stats: each channel's mean and std of the packed images, as NumPy has them
r = subprocess.run([program, "--data-root", root, "--data-stats"], capture_output=True, text=True)
pixels = np.concatenate([np.load(os.path.join(out, "images-%05d.npy" % i)) for i in range(2)]) / 255
numpy = "    mean = [%s]\n    std  = [%s]" % tuple(", ".join("%.5g" % v for v in f(pixels.reshape(-1, 3), axis=0))
                                                  for f in (np.mean, np.std))
check(r.returncode == 0 and r.stdout.endswith(numpy + "\n") and "6 samples of [12, 16, 3], every one read" in r.stdout,
      "--data-stats gives each channel's mean and std as NumPy does:\n" + r.stdout + r.stderr + "--- NumPy:\n" + numpy)

# --dump-batch: the first batch as trained on, of the model's shape, the same bytes run
# after run (the draws are the seed's)
dumps = []
for i in range(2):
    path = os.path.join(root, "dump%d.npy" % i)
    r = subprocess.run([program, "--data-root", root, "--dump-batch", path], capture_output=True, text=True)
    dumps.append((r.returncode, open(path, "rb").read() if r.returncode == 0 else r.stdout + r.stderr))
batch = np.load(os.path.join(root, "dump0.npy"))
check(dumps[0][0] == 0 and dumps[0] == dumps[1] and batch.shape == (2, 10, 14, 3) and batch.dtype == np.float32
      and batch.min() >= 0 and batch.max() <= 1,
      "--dump-batch writes the first batch's windows, the same twice: %s %s" % (batch.shape, dumps[0][0]))

# a damaged image stops the packing, naming it; what was written is removed
cut = os.path.join(src, "cat", "c2.jpg")
whole = open(os.path.join(src, "cat", "c0.jpg"), "rb").read()
open(cut, "wb").write(whole[: len(whole) // 2])
failed = os.path.join(root, "failed")
expect(1, cut + ": not a readable JPEG image", src, failed, "--size", "12x16", "--resize", "20", "--per-file", "4")
check(os.listdir(failed) == [], "a failed packing leaves nothing: %s" % os.listdir(failed))
skipping = os.path.join(root, "skipping")
says = expect(0, "1 bad image left out", src, skipping, "--size", "12x16", "--resize", "20", "--per-file", "4",
              "--skip-bad")
skipped = open(os.path.join(skipping, "skipped.txt")).read().split()
labels = np.concatenate([np.load(os.path.join(skipping, "labels-%05d.npy" % i)) for i in range(2)])
check(skipped == [cut] and labels.tolist() == [0, 0, 0, 1, 2, 2], "--skip-bad lists it and packs the rest: %s %s"
      % (skipped, labels.tolist()))
os.remove(cut)
false = os.path.join(src, "cat", "c3.jpg")
open(false, "w").write("<html>not found</html>\n")
expect(1, false + ": not a readable JPEG image: Not a JPEG file", src, os.path.join(root, "f2"), "--size", "8")
os.remove(false)
# a header claiming 65000 x 65000 pixels (its SOF0 marker rewritten) is named, not decoded
huge = bytearray(whole)
sof = huge.index(b"\xff\xc0")
huge[sof + 5:sof + 9] = (65000).to_bytes(2, "big") * 2
claims = os.path.join(src, "cat", "c4.jpg")
open(claims, "wb").write(bytes(huge))
expect(1, claims + ": it says it is 65000 x 65000 pixels, more than ddppack decodes (268435456 pixels",
       src, os.path.join(root, "f6"), "--size", "8", "--resize", "20000")
os.remove(claims)

os.makedirs(os.path.join(src, "dog"))
expect(1, "the class `dog` holds no image (.jpg, .jpeg or .png)", src, os.path.join(root, "f3"), "--size", "8")
os.rmdir(os.path.join(src, "dog"))
expect(1, "already holds packed files (images-00000.npy)", src, out, "--size", "8")
expect(1, "classes.txt: not a folder; OUT is the folder the packed files go to", src, os.path.join(out, "classes.txt"),
       "--size", "8")
expect(1, "no such file or directory".capitalize(), os.path.join(root, "nowhere"), os.path.join(root, "f4"),
       "--size", "8")
expect(2, "--size H[xW] is needed", src, os.path.join(root, "f5"))
expect(2, "--size takes H or HxW, whole numbers of pixels from 1 to 65536, not `0`", src, os.path.join(root, "f5"),
       "--size", "0")
expect(2, "--resize must be at least the larger of the size's sides (16)", src, os.path.join(root, "f5"),
       "--size", "12x16", "--resize", "12")
expect(2, "unknown option `--bogus`", src, os.path.join(root, "f5"), "--size", "8", "--bogus", "1")
expect(0, "usage: ddppack DIR OUT", "--help")

subprocess.run(["rm", "-rf", root])
sys.exit(1 if failures else 0)
