#!/usr/bin/env python3
"""roundtrip.py DIR: training details on the small model of tests/train/files.ddp
(batch normalisation and dropout), with files written here, through built programs:

- files_npy: trains on the IDX files, validates on the NumPy ones, saves; the saved
  file holds every parameter and the running statistics, and --load with --evaluate
  repeats the final validation figures exactly (so the statistics round-trip);
- files_npy_steps (validate_every = 2 steps): a validation line after steps 2 and 4;
- files_npy_keep (drop_remainder = false, batch 3 over 8 samples): 3 steps an epoch,
  none dropped, every sample trained on."""
import json
import os
import sys

import datafiles
from datafiles import SAMPLES, check, good_files, read_safetensors, run


def main():
    programs = sys.argv[1]
    root = datafiles.scratch_folder()
    good_files(root)
    program = os.path.join(programs, "files_npy")
    saved, metrics, again = (os.path.join(root, n) for n in ("p.safetensors", "m.json", "e.json"))

    run([program, "--data-root", root, "--epochs", "3", "--save", saved, "--metrics", metrics])
    tensors, meta = read_safetensors(saved)
    names = sorted(tensors)
    check(names == ["m.hidden.weight", "m.logits.bias", "m.logits.weight", "m.norm.bias", "m.norm.running_mean",
                    "m.norm.running_var", "m.norm.weight"], "the saved names: %s" % ", ".join(names))
    check(any(v != 0 for v in tensors["m.norm.running_mean"]) and any(v != 1 for v in tensors["m.norm.running_var"]),
          "the running statistics moved from their initial values")
    check("m.hidden.weight:IO" in meta.get("layouts", ""), "the metadata gives the layouts")
    epochs = [json.loads(line) for line in open(metrics)]
    check([e["epoch"] for e in epochs] == [1, 2, 3] and [e["step"] for e in epochs] == [4, 8, 12],
          "three epochs of four steps in the metrics file")
    run([program, "--data-root", root, "--load", saved, "--evaluate", "--metrics", again])
    evaluated = json.loads(open(again).read())
    check((evaluated["val_loss"], evaluated["val_accuracy"]) == (epochs[-1]["val_loss"], epochs[-1]["val_accuracy"]),
          "--evaluate repeats the last validation: %s %s" % (evaluated["val_loss"], evaluated["val_accuracy"]))

    out = run([os.path.join(programs, "files_npy_steps"), "--data-root", root])
    lines = [line for line in out.splitlines() if ": validation" in line]
    check([line.split(":")[0] for line in lines] == ["step 2", "step 4"],
          "validate_every = 2 steps: %s" % "; ".join(lines))

    out = run([os.path.join(programs, "files_npy_keep"), "--data-root", root, "--metrics", metrics])
    check("3 steps per epoch, 0 samples dropped per epoch" in out, "drop_remainder = false: 3 steps, none dropped")
    check("done: 1 epoch, 3 steps, %d samples" % SAMPLES in out, "every sample trained on")
    sys.exit(1 if datafiles.failures else 0)


if __name__ == "__main__":
    main()
