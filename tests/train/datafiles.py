"""datafiles.py: what the whole-program tests share: data files of every format
(good ones for tests/train/files.ddp and cifar.ddp, and the pieces to break them),
and safetensors files read and written with the standard library alone; ports reserved
for workers started by hand."""
import atexit
import gzip
import json
import os
import struct
import shutil
import subprocess
import sys
import tempfile

failures = 0


def scratch_folder():
    """a fresh folder for a test's files, removed when the test ends (kept with
    DDP_KEEP_TEST_FILES=1, to look into a failure)"""
    folder = tempfile.mkdtemp(prefix="ddp-test-")
    if not os.environ.get("DDP_KEEP_TEST_FILES"):
        atexit.register(shutil.rmtree, folder, True)
    return folder


def check(ok, what):
    """an ok or FAIL line; failures counts the latter"""
    global failures
    print("%s %s" % ("ok  " if ok else "FAIL", what), flush=True)
    failures += not ok


def run(command, timeout=120):
    """command's output; a failure ends the test, saying what the command said"""
    p = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if p.returncode:
        sys.exit("FAIL: %s exited %d\n%s" % (" ".join(command), p.returncode, p.stdout))
    return p.stdout

SAMPLES = 8


def idx(type_code, dims, payload):
    return bytes([0, 0, type_code, len(dims)]) + b"".join(struct.pack(">I", d) for d in dims) + payload


def npy(descr, shape, payload, magic=b"\x93NUMPY"):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (
        descr, "".join("%d, " % d for d in shape))
    header += " " * (63 - (len(header) + 10) % 64) + "\n"
    return magic + b"\x01\x00" + struct.pack("<H", len(header)) + header.encode() + payload


def cifar_batch(records, label=lambda r: r % 10):
    return b"".join(bytes([label(r)]) + bytes((r + i) % 256 for i in range(3072)) for r in range(records))


def good_files(root):
    pixels = bytes((s * 16 + i) % 256 for s in range(SAMPLES) for i in range(16))
    labels = bytes(s % 3 for s in range(SAMPLES))
    files = {
        "images.idx.gz": gzip.compress(idx(0x08, [SAMPLES, 4, 4], pixels)),
        "labels.idx.gz": gzip.compress(idx(0x08, [SAMPLES], labels)),
        "inputs.npy": npy("<f4", [SAMPLES, 16], struct.pack("<%df" % (SAMPLES * 16), *range(SAMPLES * 16))),
        "labels.npy": npy("<i8", [SAMPLES], struct.pack("<%dq" % SAMPLES, *(s % 3 for s in range(SAMPLES)))),
        "table.csv": "a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,y\n" + "".join(
            ",".join(str(s + i) for i in range(16)) + ",%d\n" % (s % 3) for s in range(SAMPLES)),
    }
    for name, data in files.items():
        write(root, name, data)
    os.makedirs(os.path.join(root, "cifar"), exist_ok=True)
    for b in range(1, 6):
        write(root, "cifar/data_batch_%d.bin" % b, cifar_batch(2))


def write(root, name, data):
    with open(os.path.join(root, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


def remove(root, name):
    os.remove(os.path.join(root, name))


def write_safetensors(path, tensors):
    """tensors: (name, shape, float values) in order, written as F32"""
    header, data = {}, b""
    for name, shape, values in tensors:
        raw = struct.pack("<%df" % len(values), *values)
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def read_safetensors(path):
    """({name: float values}, metadata) of an F32 or F64 file"""
    with open(path, "rb") as f:
        blob = f.read()
    n = struct.unpack("<Q", blob[:8])[0]
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        code, width = {"F32": ("f", 4), "F64": ("d", 8)}[t["dtype"]]
        out[name] = struct.unpack("<%d%s" % ((b - a) // width, code), blob[8 + n + a:8 + n + b])
    return out, header.get("__metadata__", {})


FREE_PORTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "cluster", "free_ports.sh")


def reserve_ports(n):
    """The first of n free ports in a row, reserved for this test (cluster/free_ports.sh)
    until it ends."""
    p = subprocess.run(["sh", FREE_PORTS, str(n), str(os.getpid())], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
    if p.returncode:
        sys.exit("FAIL: no free ports for the workers: " + p.stderr.strip())
    atexit.register(lambda: subprocess.run(["sh", FREE_PORTS, "--release", str(os.getpid())]))
    return int(p.stdout)


def with_port(launcher, workers):
    """The launcher's command with a reserved coordinator port where it is ddprun (srun
    derives its own from the job)."""
    if os.path.basename(launcher[0]) == "ddprun":
        return [launcher[0], "--port", str(reserve_ports(workers))] + launcher[1:]
    return launcher
