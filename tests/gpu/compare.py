#!/usr/bin/env python3
"""compare.py A B TOLERANCE: two saved parameter files (safetensors), or two files of
predictions (--predict's .csv), compared as the GPU tests compare them: |a - b| / |a|
over every tensor together (the predictions as one), which must be at most TOLERANCE.
Prints the distance and the tensor that differs most."""
import math
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from datafiles import read_safetensors  # noqa: E402


def tensors(path):
    """a file's values by tensor: a safetensors file's, or a CSV's rows as one"""
    if path.endswith(".csv"):
        rows = open(path).read().splitlines()[1:]
        return {"predictions": [float(v) for row in rows for v in row.split(",")]}
    return read_safetensors(path)[0]


def distance(a, b):
    """|a - b| / |a| over every tensor of two saved files, and the tensor that differs most"""
    x, y = tensors(a), tensors(b)
    diff = norm = 0.0
    worst, worst_name = -1.0, ""
    for name in x:
        d = sum((p - q) ** 2 for p, q in zip(x[name], y[name]))
        diff, norm = diff + d, norm + sum(p * p for p in x[name])
        if d > worst:
            worst, worst_name = d, name
    return math.sqrt(diff / norm) if norm else math.sqrt(diff), worst_name


if __name__ == "__main__":
    d, where = distance(sys.argv[1], sys.argv[2])
    tolerance = float(sys.argv[3])
    print("%s: %.2e of the norm apart (tolerance %.0e; most in %s)" % (
        "ok" if d <= tolerance else "FAIL", d, tolerance, where))
    sys.exit(0 if d <= tolerance else 1)
