#!/usr/bin/env python3
"""input_seeds.py DIR: one well-formed input of each kind fuzz_inputs.c reads (and a
gzip-compressed IDX pair), as seeds for its fuzzing run: each file is the kind byte,
then what fuzz_inputs.c's header says that kind holds."""
import gzip
import json
import os
import struct
import sys


def npy(descr, shape, payload):
    header = "{'descr': '%s', 'fortran_order': False, 'shape': %s, }" % (descr, shape)
    header += " " * (63 - (10 + len(header)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header.encode() + payload


def two_files(kind, first, second):
    return bytes([kind]) + struct.pack("<H", len(first)) + first + second


def npy_parts(files):
    """kind 9: x-1, y-1, x-2 after their lengths, y-2 the rest"""
    return bytes([9]) + b"".join(struct.pack("<H", len(f)) for f in files[:3]) + b"".join(files)


def safetensors(tensors, metadata):
    header, data = {"__metadata__": metadata}, b""
    for name, dtype, shape, payload in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(payload)]}
        data += payload
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


text = json.dumps({"model.w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
images = struct.pack(">I3I", 0x803, 2, 2, 2) + bytes(range(8))
labels = struct.pack(">II", 0x801, 2) + bytes([0, 1])
seeds = {
    "idx": two_files(0, images, labels),
    "idx_gzip": two_files(0, gzip.compress(images), gzip.compress(labels)),
    "npy": two_files(1, npy("<f4", "(2, 3)", struct.pack("<6f", *range(6))), npy("<i8", "(2,)", struct.pack("<2q", 0, 1))),
    "csv_header": bytes([2, 0b011]) + b"x0,x1,y\n1.5,2,0\n3,-4e2,1\n",
    "csv_numbered": bytes([2, 0b100]) + b"1,2,3,0\n4,5,6,1\n\n",
    "cifar10": bytes([3, 7]) + bytes(i % 256 for i in range(3072)),
    "safetensors": bytes([4]) + safetensors(
        [("model.w", "F32", [2, 2], struct.pack("<4f", 1, 2, 3, 4)), ("model.b", "BF16", [2], b"\x80\x3f\x00\x40"),
         ("optimizer.m", "F16", [1], b"\x00\x3c"), ("worker.step", "F64", [], struct.pack("<d", 3))],
        {"format": "ddp-checkpoint", "step": "12"}),
    "safetensors_sized": bytes([7]) + struct.pack("<H", len(text)) + text + b"\x00\x00\x80\x3f",
    "hostlist": bytes([5]) + b"node[01-03,7],gpu-a[1-2]x,login",
    "tasks": bytes([6]) + b"2(x3),1",
    "cluster_slurm": bytes([8, 0]) + b"4242\n3\n4\n3\n0\n1\nn[9-10]\n3,1\n",
    "cluster_env": bytes([8, 2]) + b"~\n~\n~\n~\n~\n~\n~\n~\n1\n4\n1\n2\nhost-0:29500\n",
    "npy_parts": npy_parts([npy("|u1", "(2, 3)", bytes(range(6))), npy("<i8", "(2,)", struct.pack("<2q", 0, 1)),
                            npy("|u1", "(1, 3)", bytes([7, 8, 9])), npy("|u1", "(1,)", bytes([1]))]),
    "tokens": bytes([10, 1, 3]) + struct.pack("<9H", 1, 2, 250, 4, 5, 6, 7, 8, 299),
}
os.makedirs(sys.argv[1], exist_ok=True)
for name, data in seeds.items():
    with open(os.path.join(sys.argv[1], name), "wb") as f:
        f.write(data)
