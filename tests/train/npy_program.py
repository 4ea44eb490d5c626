#!/usr/bin/env python3
"""npy_program.py PROGRAMS: a built program trains on CIFAR-shaped .npy files as
np.save writes them: float32 or uint8 or float64 inputs of shape (N, 32, 32, 3) with
int64, uint8 or float32 labels of shape (N,) or (N, 1). Each run must train and
validate (status 0, a `done:` line); before the labels were read with their own count,
float32 inputs with int64 labels ended in a segmentation fault.

Then the same samples as one pair of files and as three (of 37, 50 and 13 samples,
the second compressed, named so that their order by name byte by byte is neither the
order written nor the numbers' order): a program validating on the three must report
the validation figures, to the last digit, of one validating on the one (which the
samples in another order would miss in the last digits of the loss). Last, the inputs
file rewritten in place once training has begun: the run ends at the end of that
epoch, with status 1 and the file named."""
import gzip
import json
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from datafiles import npy, scratch_folder  # noqa: E402

SAMPLES = 100
VALUES = 32 * 32 * 3
CASES = [("<f4", "f", "<i8", "q", False), ("<f4", "f", "<i8", "q", True), ("|u1", "B", "|u1", "B", False),
         ("|u1", "B", "|u1", "B", True), ("<f8", "d", "<f4", "f", False), ("<f4", "f", "|u1", "B", True)]


def write_pair(folder, name_x, name_y, first, count, compress=False):
    """samples first .. first + count - 1: u8 pixels and their class"""
    pixels = bytes((s * 7 + k) % 256 for s in range(first, first + count) for k in range(VALUES))
    inputs = npy("|u1", [count, 32, 32, 3], pixels)
    with open(os.path.join(folder, name_x), "wb") as f:
        f.write(gzip.compress(inputs) if compress else inputs)
    with open(os.path.join(folder, name_y), "wb") as f:
        f.write(npy("|u1", [count], bytes(s % 10 for s in range(first, first + count))))


def validation_figures(program, root):
    """the metrics line's val_ figures of one epoch on root's files, and its output"""
    metrics = os.path.join(root, "%s.json" % os.path.basename(program))
    p = subprocess.run([program, "--data-root", root, "--threads", "1", "--metrics", metrics,
                        "--run-dir", os.path.join(root, "run-%s" % os.path.basename(program))],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if p.returncode != 0:
        print(p.stdout[-2000:])
        return None, p.stdout
    line = json.loads(open(metrics).readline())
    return {k: v for k, v in line.items() if k.startswith("val_")}, p.stdout


def several_files(programs):
    root = scratch_folder()
    os.mkdir(os.path.join(root, "parts"))
    write_pair(root, "x.npy", "y.npy", 0, SAMPLES)
    # in order of their names byte by byte (10 before 2), as the dataset takes them
    write_pair(root, "parts/x-3.npy", "parts/y-3.npy", 87, 13)
    write_pair(root, "parts/x-2.npy", "parts/y-2.npy", 37, 50, compress=True)
    write_pair(root, "parts/x-10.npy", "parts/y-10.npy", 0, 37)
    one, _ = validation_figures(os.path.join(programs, "cifar_npy_validate_one"), root)
    parts, said = validation_figures(os.path.join(programs, "cifar_npy_validate_parts"), root)
    ok = one is not None and one == parts and "val_loss" in one
    print("%s three files validate as the one: %s and %s" % ("ok  " if ok else "FAIL", one, parts))
    # the two plain files mapped (50 samples of 3,072 bytes), the compressed one read, with every label
    held = "parts/x-*.npy (3 files); 150.0 KiB mapped (one copy for the node's workers), 150.8 KiB in memory"
    shown = held in said
    print("%s the banner says how the three are held: %s" % ("ok  " if shown else "FAIL", held))
    if not shown:
        print(said[-2000:])
    return 0 if ok and shown else 1


def changed_during_the_run(program):
    """a mapped file rewritten in place once training has begun ends the run at the end
    of the epoch, naming the file (of 50 epochs, so that the change comes before the
    end however slow this side is; the run stops at the first epoch's end after it)"""
    root = scratch_folder()
    write_pair(root, "x.npy", "y.npy", 0, 2000)
    p = subprocess.Popen([program, "--data-root", root, "--threads", "1", "--epochs", "50", "--log-every", "1",
                          "--run-dir", os.path.join(root, "run")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said = []
    for line in p.stdout:
        said.append(line)
        if "step 1/" in line and len(said) < 20:
            path = os.path.join(root, "x.npy")
            with open(path, "r+b") as f:  # one byte of the last sample, in place
                f.seek(-1, os.SEEK_END)
                f.write(b"\x7f")
            later = os.stat(path).st_mtime + 2  # past any tick of the file system's clock
            os.utime(path, (later, later))
    p.wait(timeout=300)
    out = "".join(said)
    ok = p.returncode == 1 and "x.npy: the file was changed during the run" in out and "the end of epoch" in out
    print("%s a file changed in place during the run ends it: status %d" % ("ok  " if ok else "FAIL", p.returncode))
    if not ok:
        print(out[-2000:])
    return 0 if ok else 1


def main():
    program = os.path.join(sys.argv[1], "cifar_npy")
    failures = several_files(sys.argv[1]) + changed_during_the_run(program)
    for x_descr, x_code, y_descr, y_code, column in CASES:
        root = scratch_folder()
        pixels = [(s * 7 + k) % 256 for s in range(SAMPLES) for k in range(VALUES)]
        labels = [s % 10 for s in range(SAMPLES)]
        with open(os.path.join(root, "x.npy"), "wb") as f:
            f.write(npy(x_descr, [SAMPLES, 32, 32, 3], struct.pack("<%d%s" % (len(pixels), x_code), *pixels)))
        with open(os.path.join(root, "y.npy"), "wb") as f:
            f.write(npy(y_descr, [SAMPLES, 1] if column else [SAMPLES],
                        struct.pack("<%d%s" % (SAMPLES, y_code), *labels)))
        p = subprocess.run([program, "--data-root", root, "--threads", "1"], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, timeout=300)
        what = "inputs %s, labels %s of shape %s" % (x_descr, y_descr, "(N, 1)" if column else "(N,)")
        ok = p.returncode == 0 and "\ndone:" in p.stdout
        print("%s %s: status %d" % ("ok  " if ok else "FAIL", what, p.returncode))
        if not ok:
            print(p.stdout[-2000:])
            failures += 1
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
