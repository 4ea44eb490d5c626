#!/usr/bin/env python3
"""predict.py PROGRAMS LAUNCHER...: --predict on tests/train/tiny.ddp, whose outputs
this test computes by hand (float64, the standard library only) from the weights it
gives. LAUNCHER starts N workers given N (`ddprun -n`, or `srun -n` in a Slurm job).

- one worker: the .npy file (NumPy's format 1.0, float32, [samples, 3]) and the .csv
  file hold every validation sample's logits in the file's order, over several batches
  and a last short one; the CSV's values are the .npy's exactly;
- three workers under the launcher (shards of 8, 8, 8, then 2, 2, 1 samples), the
  emulated GPU (separate memory: the outputs must be copied back) and two emulated
  GPUs of one worker (gpus_per_worker = 2) write the same rows;
- a bf16 program (on the emulated GPU) writes its bf16 logits widened to float32;
- --predict-inputs: the same rows from a .npy file of inputs alone, or a pattern of
  several, relative to the working folder whatever --data-root says, with no figures;
  inputs of another shape are refused naming the file;
- bad usage (a file of another kind, --predict with --resume) exits 2; a target that
  cannot be written exits 1 naming it, before any sample is evaluated; a crash before
  the rename leaves an older file as it was."""
import ast
import os
import signal
import struct
import subprocess
import sys

import datafiles
from datafiles import check, npy, reserve_ports, run, scratch_folder, with_port
from tiny_check import f32, logits, write_tiny_files

CHECK = [tuple((((7 * s + 3 * i) % 11) - 5) / 4 for i in range(4)) + (s % 3,) for s in range(29)]


def read_npy(path):
    blob = open(path, "rb").read()
    n = struct.unpack("<H", blob[8:10])[0]
    header = ast.literal_eval(blob[10:10 + n].decode())
    values = struct.unpack("<%df" % ((len(blob) - 10 - n) // 4), blob[10 + n:])
    return blob[:8], (10 + n) % 64, header, values


def read_csv(path):
    lines = open(path).read().splitlines()
    return lines[0], [f32(float(v)) for line in lines[1:] for v in line.split(",")]


def by_hand(w, b):
    return [v for *x, _ in CHECK for v in logits(w, b, x)]


def close(got, want, tol):
    return len(got) == len(want) and all(abs(g - h) <= tol * max(1.0, abs(h)) for g, h in zip(got, want))


def default_signals():
    """A child's signals as a terminal gives them, whatever this test inherited (a
    background job's SIGINT is ignored)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, signal.SIG_DFL)


def status_of(command, env=None, cwd=None):
    p = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
                       env=env, cwd=cwd, preexec_fn=default_signals)
    return p.returncode, p.stdout


def run_in(folder, command):
    status, said = status_of(command, cwd=folder)
    if status:
        sys.exit("FAIL: %s exited %d\n%s" % (" ".join(command), status, said))
    return said


def main():
    programs, launcher = sys.argv[1], sys.argv[2:]
    tiny = os.path.join(programs, "tiny")
    root = scratch_folder()
    w, b = write_tiny_files(root, CHECK[:8], CHECK, "w.safetensors")
    weights = os.path.join(root, "w.safetensors")
    want = by_hand(w, b)
    path = lambda name: os.path.join(root, name)
    given = ["--data-root", root, "--load", weights]

    out = run([tiny, *given, "--predict", path("one.npy")])
    check("predict     %s: one row of [3] per validation sample, float32" % path("one.npy") in out,
          "the banner names the file, the row's shape and the type")
    check("predictions written to %s" % path("one.npy") in out, "the run says where the predictions went")
    magic, alignment, header, one = read_npy(path("one.npy"))
    check(magic == b"\x93NUMPY\x01\x00" and alignment == 0, "NumPy format 1.0, the data 64-byte aligned")
    check(header == {"descr": "<f4", "fortran_order": False, "shape": (29, 3)},
          "the header: little-endian float32, C order, 29 samples of 3 (%s)" % header)
    check(close(one, want, 1e-6), "every sample's logits, in the file's order, as computed by hand")
    check(not [n for n in os.listdir(root) if ".tmp-" in n], "no temporary file left beside it")

    run([tiny, *given, "--predict", path("one.csv"), "--threads", "1"])
    names, table = read_csv(path("one.csv"))
    check(names == "output_0,output_1,output_2", "the CSV's header names the outputs")
    check(table == list(one), "the CSV's values are the .npy's exactly")

    run(with_port(launcher, 3) + ["3", tiny, *given, "--predict", path("three.npy"), "--threads", "1"])
    check(close(read_npy(path("three.npy"))[3], want, 1e-6),
          "three workers (%s) gather the same rows, in order" % os.path.basename(launcher[0]))
    run([tiny, *given, "--predict", path("emulated.npy"), "--device", "emulated"])
    check(close(read_npy(path("emulated.npy"))[3], want, 1e-6), "the emulated GPU's outputs, copied back")
    port = str(reserve_ports(2))
    run([os.path.join(programs, "tiny_g2"), *given, "--predict", path("g2.npy"), "--device", "emulated",
         "--port-base", port])
    check(close(read_npy(path("g2.npy"))[3], want, 1e-6), "two emulated GPUs of one worker (a thread each) gather "
          "the same rows")
    run([os.path.join(programs, "tiny_bf16"), *given, "--predict", path("bf16.npy"), "--device", "emulated"])
    bf16 = read_npy(path("bf16.npy"))
    check(bf16[2]["descr"] == "<f4" and close(bf16[3], want, 2e-2),
          "bf16 logits widened to float32, within bf16's precision of the by-hand values")

    rows = lambda first, end: b"".join(struct.pack("<4f", *x) for *x, _ in CHECK[first:end])
    open(path("x.npy"), "wb").write(npy("<f4", [29, 4], rows(0, 29)))
    open(path("x-0.npy"), "wb").write(npy("<f4", [10, 4], rows(0, 10)))
    open(path("x-1.npy"), "wb").write(npy("<f4", [19, 4], rows(10, 29)))
    elsewhere = ["--data-root", path("no-such-folder"), "--load", weights]
    out = run_in(root, [tiny, *elsewhere, "--predict", "alone.npy", "--predict-inputs", "x.npy"])
    check("inputs      --predict-inputs: 29 samples of [4] from %s" % path("x.npy") in out and
          "predictions for 29 samples written to alone.npy" in out and "val_loss" not in out,
          "inputs alone: the banner's inputs line, no figures")
    check(close(read_npy(path("alone.npy"))[3], want, 1e-6), "inputs alone (relative to the working folder): "
          "the same rows")
    run_in(root, [tiny, *elsewhere, "--predict", "parts.npy", "--predict-inputs", "x-*.npy"])
    check(close(read_npy(path("parts.npy"))[3], want, 1e-6), "inputs alone from a pattern of two files: the same rows")
    open(path("wide.npy"), "wb").write(npy("<f4", [2, 5], bytes(40)))
    status, said = status_of([tiny, *given, "--predict", path("w.npy"), "--predict-inputs", path("wide.npy")])
    check(status == 1 and "%s: its samples are [5]" % path("wide.npy") in said,
          "inputs of another shape: status 1, the file named (status %d)" % status)
    status, said = status_of([tiny, *given, "--predict", path("m.npy"), "--predict-inputs", path("missing.npy")])
    check(status == 1 and said.rstrip().endswith("%s: no such file (the dataset `--predict-inputs`, inputs); check "
                                                 "the path" % path("missing.npy")),
          "missing inputs: status 1, the file named, no advice about --data-root (status %d)" % status)
    status, said = status_of([tiny, *given, "--predict-inputs", path("x.npy")])
    check(status == 2 and "--predict-inputs goes with --predict" in said, "--predict-inputs alone is bad usage")

    status, said = status_of([tiny, *given, "--predict", path("p.txt")])
    check(status == 2 and "--predict %s: the file's name ends in .npy" % path("p.txt") in said,
          "a file of another kind is bad usage (status %d)" % status)
    status, said = status_of([tiny, *given, "--predict", path("r.npy"), "--resume"])
    check(status == 2 and "--predict does not go with --resume" in said, "--predict refuses --resume")
    missing = path("no/such/folder/p.npy")
    status, said = status_of([tiny, *given, "--predict", missing])
    check(status == 1 and "%s: cannot write" % missing in said and "evaluation on" not in said,
          "a target that cannot be written: status 1, named, before evaluating (status %d)" % status)
    os.mkdir(path("folder.npy"))
    status, said = status_of([tiny, *given, "--predict", path("folder.npy")])
    check(status == 1 and "%s: cannot write: it is a folder" % path("folder.npy") in said and
          "evaluation on" not in said, "a target that is a folder: status 1, before evaluating (status %d)" % status)
    open(path("kept.npy"), "w").write("older\n")
    env = dict(os.environ, DDP_CRASH_AT="before-rename")
    status, said = status_of([tiny, *given, "--predict", path("kept.npy")], env)
    check(status == 9 and open(path("kept.npy")).read() == "older\n",
          "a crash before the rename leaves the older file as it was (status %d)" % status)
    for sig in ("INT", "TERM"):  # a signal that ends the process removes the temporary file first
        for f in os.listdir(root):  # the crash's
            if f.startswith("kept.npy."):
                os.remove(path(f))
        env = dict(os.environ, DDP_CRASH_AT="before-rename:" + sig)
        status, said = status_of([tiny, *given, "--predict", path("kept.npy")], env)
        left = [f for f in os.listdir(root) if f.startswith("kept.npy.")]
        check(status == -getattr(signal, "SIG" + sig) and open(path("kept.npy")).read() == "older\n" and not left,
              "SIG%s before the rename: the older file as it was, no temporary file (status %d, left %s)" %
              (sig, status, left))
    status, said = status_of([tiny, "--data-root", root, "--predict", path("initial.npy")])
    check(status == 0 and "warning: --predict without --load" in said, "without --load: a warning naming --predict")
    sys.exit(1 if datafiles.failures else 0)


if __name__ == "__main__":
    main()
