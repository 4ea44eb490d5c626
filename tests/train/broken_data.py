#!/usr/bin/env python3
"""broken_data.py DIR DDPRUN: built programs (in DIR) on data files written here, good
and broken. Good files train (status 0); each kind of broken file ends the run before
training with status 1 and a one-line message naming the file and what is wrong.
Under DDPRUN, three workers check a part of the inputs each: the one whose part holds
a NaN names it, the others never read it, and the job ends with status 1.

The programs (tests/train/files.ddp, cifar.ddp): files_idx trains on images.idx.gz
and labels.idx.gz; files_npy and files_csv evaluate inputs.npy/labels.npy and
table.csv; cifar trains on cifar/data_batch_1..5.bin. The model takes 16 values and
has 3 outputs."""
import gzip
import os
import shutil
import struct
import subprocess
import sys

from datafiles import SAMPLES, cifar_batch, good_files, idx, npy, remove, write, scratch_folder, with_port

def nan_in_sample(root, sample):
    values = [float(v) for v in range(SAMPLES * 16)]
    values[sample * 16 + 5] = float("nan")
    write(root, "inputs.npy", npy("<f4", [SAMPLES, 16], struct.pack("<%df" % (SAMPLES * 16), *values)))


CASES = [  # (what, program, breakage, words every message must hold)
    ("good IDX files", "files_idx", None, None),
    ("good NumPy files", "files_npy", None, None),
    ("good CSV file", "files_csv", None, None),
    ("good CIFAR-10 batches", "cifar", None, None),
    ("a missing images file", "files_idx", lambda r: remove(r, "images.idx.gz"),
     ["images.idx.gz: no such file", "--data-root"]),
    ("an empty labels file", "files_idx", lambda r: write(r, "labels.idx.gz", b""),
     ["labels.idx.gz: the file is empty"]),
    ("a gzip stream cut short", "files_idx",
     lambda r: write(r, "images.idx.gz", gzip.compress(idx(0x08, [SAMPLES, 4, 4], os.urandom(128)))[:100]),
     ["images.idx.gz:", "cut short"]),
    ("images cut short", "files_idx",
     lambda r: write(r, "images.idx.gz", gzip.compress(idx(0x08, [SAMPLES, 4, 4], bytes(100)))),
     ["images.idx.gz: truncated", "144 bytes", "116 bytes"]),
    ("bytes after the data", "files_idx",
     lambda r: write(r, "labels.idx.gz", gzip.compress(idx(0x08, [SAMPLES], bytes(SAMPLES + 3)))),
     ["labels.idx.gz:", "3"]),
    ("a wrong magic number", "files_idx", lambda r: write(r, "images.idx.gz", b"PK\x03\x04" + bytes(200)),
     ["images.idx.gz:", "IDX"]),
    ("an unknown element type", "files_idx", lambda r: write(r, "images.idx.gz", idx(0x07, [SAMPLES, 4, 4], bytes(128))),
     ["images.idx.gz: unknown IDX element type 0x07"]),
    ("counts that differ", "files_idx", lambda r: write(r, "labels.idx.gz", idx(0x08, [SAMPLES - 1], bytes(SAMPLES - 1))),
     ["labels.idx.gz: holds 7 labels but", "images.idx.gz holds 8 images"]),
    ("a label out of range", "files_idx", lambda r: write(r, "labels.idx.gz", idx(0x08, [SAMPLES], bytes([0, 1, 2, 5, 0, 1, 2, 0]))),
     ["labels.idx.gz: sample 3 has the label 5", "3 outputs"]),
    ("samples of the wrong shape", "files_idx",
     lambda r: write(r, "images.idx.gz", idx(0x08, [SAMPLES, 5, 5], bytes(SAMPLES * 25))),
     ["images.idx.gz: its samples are [5, 5] (25 values), but the model `m` takes [16]"]),
    ("a NaN in NumPy inputs", "files_npy",
     lambda r: nan_in_sample(r, 2),
     ["inputs.npy: sample 2 holds NaN (element 5)"]),
    ("not a NumPy file", "files_npy", lambda r: write(r, "inputs.npy", npy("<f4", [SAMPLES, 16], bytes(512), b"\x93NUMPX")),
     ["inputs.npy:", "NumPy"]),
    ("complex numbers", "files_npy", lambda r: write(r, "inputs.npy", npy("<c8", [SAMPLES, 16], bytes(1024))),
     ["inputs.npy:", "<c8"]),
    ("NumPy data cut short", "files_npy", lambda r: write(r, "inputs.npy", npy("<f4", [SAMPLES, 16], bytes(100))),
     ["inputs.npy:", "truncated"]),
    ("NumPy labels of another count", "files_npy",
     lambda r: write(r, "labels.npy", npy("<i8", [SAMPLES + 1], bytes(8 * (SAMPLES + 1)))),
     ["labels.npy:", "9"]),
    ("a CSV cell that is no number", "files_csv",
     lambda r: write(r, "table.csv", "a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,y\n" + "0," * 16 + "1\n" + "0,0,zero," + "0," * 13 + "1\n"),
     ["table.csv:3:5: the cell of column `c` is \"zero\", not a number"]),
    ("a CSV column that is missing", "files_csv",
     lambda r: write(r, "table.csv", "a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,pp,y\n" + "0," * 16 + "1\n"),
     ["table.csv: the header has no column `p`", "its columns are a, b,"]),
    ("a CSV row too short", "files_csv",
     lambda r: write(r, "table.csv", "a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,y\n" + "0," * 16 + "1\n" + "0,1\n"),
     ["table.csv:3: the row has 2 fields, but the header has 17"]),
    ("a missing CIFAR-10 batch", "cifar", lambda r: remove(r, "cifar/data_batch_3.bin"),
     ["cifar/data_batch_3.bin: no such file"]),
    ("a CIFAR-10 batch of the wrong size", "cifar", lambda r: write(r, "cifar/data_batch_2.bin", cifar_batch(2)[:5000]),
     ["cifar/data_batch_2.bin:", "3073"]),
    ("a CIFAR-10 label of 10", "cifar", lambda r: write(r, "cifar/data_batch_1.bin", cifar_batch(2, lambda i: 10)),
     ["cifar/data_batch_1.bin: record 0 has the label 10"]),
]


def parts_checked(programs, ddprun):
    """Sample 6 of 8 lies in the part of rank 2 of 3 ([0, 3), [3, 6), [6, 8))."""
    root = scratch_folder()
    good_files(root)
    nan_in_sample(root, 6)
    command = with_port([ddprun, "-n", "3"], 3) + [os.path.join(programs, "files_npy"), "--data-root", root,
                                                   "--evaluate", "--threads", "1"]
    p = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    said = "inputs.npy: sample 6 holds NaN (element 5)"
    found = [line.split("]")[0] + "]" for line in p.stderr.splitlines() if said in line and "lost rank" not in line]
    ok = p.returncode == 1 and found == ["[rank 2]"]  # 1: rank 2's, not the 3 of those it ended
    print("%s three workers, a NaN in the last one's part: status %d, found by %s" %
          ("ok  " if ok else "FAIL", p.returncode, found))
    if not ok:
        print("     stderr: %s" % p.stderr.strip())
    return 0 if ok else 1


def main():
    programs, ddprun = sys.argv[1], sys.argv[2]
    failures = parts_checked(programs, ddprun)
    for what, program, breakage, words in CASES:
        root = scratch_folder()
        good_files(root)
        if breakage:
            breakage(root)
        command = [os.path.join(programs, program), "--data-root", root]
        if program in ("files_npy", "files_csv"):
            command.append("--evaluate")
        p = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
        shutil.rmtree(root)
        want = 0 if words is None else 1
        lines = p.stderr.strip().splitlines()
        ok = p.returncode == want
        if words is not None:
            ok = ok and len(lines) == 1 and all(w in lines[0] for w in words) and "Traceback" not in p.stderr
        print("%s %-36s status %d  %s" % ("ok  " if ok else "FAIL", what, p.returncode,
                                         lines[0] if lines else p.stdout.strip().splitlines()[-1]))
        if not ok:
            failures += 1
            print("     wanted status %d and %s\n     stderr: %s" % (want, words, p.stderr.strip()))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
