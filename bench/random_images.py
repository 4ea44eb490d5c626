"""random_images.py DIR SAMPLES SIDE: writes DIR/x.npy, SAMPLES random uint8 images
[SIDE, SIDE, 3], and DIR/y.npy, their labels 0..9, as np.save writes them (without
NumPy, a sample at a time): the data of the loader's benchmarks (augment.sh,
prefetch.sh)."""
import os
import struct
import sys

work, n, side = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])


def npy(path, descr, shape, chunks):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, "".join("%d, " % d for d in shape))
    header += " " * (63 - (len(header) + 10) % 64) + "\n"
    with open(path, "wb") as f:
        f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode())
        for chunk in chunks:
            f.write(chunk)


npy(os.path.join(work, "x.npy"), "|u1", (n, side, side, 3), (os.urandom(side * side * 3) for _ in range(n)))
npy(os.path.join(work, "y.npy"), "|u1", (n,), [bytes(b % 10 for b in os.urandom(n))])
