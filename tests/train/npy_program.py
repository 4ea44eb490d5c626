#!/usr/bin/env python3
"""npy_program.py PROGRAMS: a built program trains on CIFAR-shaped .npy files as
np.save writes them: float32 or uint8 or float64 inputs of shape (N, 32, 32, 3) with
int64, uint8 or float32 labels of shape (N,) or (N, 1). Each run must train and
validate (status 0, a `done:` line); before the labels were read with their own count,
float32 inputs with int64 labels ended in a segmentation fault."""
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


def main():
    program = os.path.join(sys.argv[1], "cifar_npy")
    failures = 0
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
