#!/usr/bin/env python3
"""devices.py DDPC PROGRAMS: the GPU path, run on the emulated device, against the CPU.

Every sample, the small test model and every gradient-check model are built here and
trained a few steps from the same seed with --device cpu and --device emulated; the
final parameters must agree within the tolerance of their precision, as distances
relative to the parameters' norm: f32 with SGD 1e-5 after 20 steps, the CNN with Adam
1e-4 (Adam divides small gradients by their own size), f64 1e-12; the MLP with
precision = tf32 between 1e-5 and 1e-2 (the emulated tensor cores round factors, the
CPU does not); lars and lamb (each parameter's norms one block's sums on the device) in
f64 and, clipped, in f32 (lamb, as Adam, 1e-4). ResNet-50 is
compared in f64, one step: at the small batches a test can afford it amplifies
rounding some 10^4 times a step (batch normalisation of a few values): in f32 one step
differs from the same step in f64 by 2e-3 of the norm on the CPU alone, and in f64 a
second step already takes the two devices' different summation orders past 1e-12.

The emulated device takes the convolutions' library path (ddp_path: the filters
turned KRSC, its reference convolution standing in for cuDNN, the gradients turned
back); the CPU its own convolution (conv_cpu.c) on the library path where the filters
are small beside the columns (the CNN at batch 8), else the generated path (im2col
and products), so every comparison holds the reference against one of the CPU's two.
The CNN also runs the emulated device on the generated path and the CPU on both
(--convolutions), each against the emulated device's reference. The emulated runs take the CUDA-graph path (a lone worker's whole training step
captured at its second step and replayed after), which their logs must say; with --no-cuda-graphs
the CNN's saved parameters are the same bytes.

Then, on tests/train/files.ddp's programs (batch normalisation, dropout, files,
validation): validation figures, --save, --load with --evaluate, and --trace on the
emulated device agree with the CPU's."""
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
import datafiles  # noqa: E402
from datafiles import check, good_files  # noqa: E402
from compare import distance  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.normpath(os.path.join(HERE, "..", ".."))
SAMPLES = os.path.join(SOURCE, "samples")
GRADCHECK = os.path.join(SOURCE, "tests", "gradcheck")
RESNET = ["-Dbatch_per_replica=2", "-Dcluster=auto", "-Dcheckpoint=none", "-w"]

# name, source, dtype, build flags, run flags, steps, tolerance. The samples train
# `steps` steps of one epoch on --synthetic data; the gradient-check models, whose
# datasets are small and synthetic already, `steps` epochs of theirs.
SYNTHETIC = ["--synthetic"]
# Models whose labels are not classes: a synthetic dataset cannot train them as
# programs (gradcheck.c gives them their own data); gpu/kernels_emulated checks them.
TARGETS_NOT_CLASSES = {"binary_logits.ddp", "binary_probabilities.ddp", "regression.ddp"}
CASES = [
    ("tiny", os.path.join(SOURCE, "tests", "train", "tiny.ddp"), "f32", [], SYNTHETIC, 20, 1e-5),
    ("fashion_mlp", os.path.join(SAMPLES, "fashion_mlp.ddp"), "f32", ["-Dbatch_per_replica=16"], SYNTHETIC, 20,
     1e-5),
    ("fashion_cnn_adam", os.path.join(SAMPLES, "fashion.ddp"), "f32", ["-Dbatch_per_replica=8"], SYNTHETIC, 20,
     1e-4),
    # precision = tf32: the emulated tensor cores round each product's factors to 10 bits
    # of mantissa, the CPU does not: apart by more than f32's rounding, less than 1e-2
    ("fashion_mlp_tf32", os.path.join(SAMPLES, "fashion_mlp.ddp"), "f32",
     ["-Dbatch_per_replica=16", "-Dprecision=tf32"], SYNTHETIC, 20, (1e-5, 1e-2)),
    ("tiny_f64", os.path.join(SOURCE, "tests", "train", "tiny.ddp"), "f64", [], SYNTHETIC, 20, 1e-12),
    ("fashion_mlp_f64", os.path.join(SAMPLES, "fashion_mlp.ddp"), "f64", ["-Dbatch_per_replica=16"], SYNTHETIC,
     20, 1e-12),
    ("fashion_cnn_f64", os.path.join(SAMPLES, "fashion.ddp"), "f64", ["-Dbatch_per_replica=4"], SYNTHETIC, 10,
     1e-12),
    ("resnet50_f64", os.path.join(SAMPLES, "cifar10_resnet50.ddp"), "f64", RESNET, SYNTHETIC, 1, 1e-12),
    # each parameter's decay group, which the device holds from its start (a device left
    # with none would decay the normalisations as the kernels)
    ("decay_groups_f64", os.path.join(GRADCHECK, "batchnorm_residual.ddp"), "f64",
     ["-Doptimizer=sgd(learning_rate = 0.1, momentum = 0.9, weight_decay = 0.05, bias_weight_decay = 0.01, "
      "norm_weight_decay = 0)"], [], 3, 1e-12),
    # lars: each parameter's trust ratio, one block per parameter on the device, its
    # norms summed in another order than the CPU's; with clip_norm in f32
    ("lars_f64", os.path.join(GRADCHECK, "batchnorm_residual.ddp"), "f64",
     ["-Doptimizer=lars(learning_rate = 2, momentum = 0.9, weight_decay = 0.01, bias_weight_decay = 0, "
      "norm_weight_decay = 0)"], [], 3, 1e-12),
    ("fashion_mlp_lars", os.path.join(SAMPLES, "fashion_mlp.ddp"), "f32",
     ["-Dbatch_per_replica=16", "-Doptimizer=lars(learning_rate = 3, weight_decay = 1e-4, clip_norm = 1)"], SYNTHETIC,
     20, 1e-5),
    # lamb: each parameter's Adam steps summed on the device before the update makes them;
    # Adam divides each gradient by its own size, so the devices' other orders of
    # summation in backward come out some 1e-13 apart after 3 steps (6e-13 here): far
    # below a wrong ratio's effect (reference/optimizer_lamb: 1% off is 2e-2 of an element)
    ("lamb_f64", os.path.join(GRADCHECK, "batchnorm_residual.ddp"), "f64",
     ["-Doptimizer=lamb(learning_rate = 0.01, weight_decay = 0.01, norm_weight_decay = 0)"], [], 3, 1e-10),
    ("fashion_mlp_lamb", os.path.join(SAMPLES, "fashion_mlp.ddp"), "f32",
     ["-Dbatch_per_replica=16", "-Doptimizer=lamb(learning_rate = 0.005, clip_norm = 1)"], SYNTHETIC, 20, 1e-4),
] + [("gradcheck_" + f[:-4], os.path.join(GRADCHECK, f), "f64", [], [], 3, 1e-12)
     for f in sorted(os.listdir(GRADCHECK)) if f.endswith(".ddp") and f not in TARGETS_NOT_CLASSES]


def run(command):
    return datafiles.run(command, timeout=600)


def compare_training(ddpc, tmp):
    for name, source, dtype, defines, flags, steps, tolerance in CASES:
        program = os.path.join(tmp, name)
        run([ddpc, "build", source, "-o", program, "--dtype", dtype] + defines)
        saved = {}
        for device in ("cpu", "emulated"):
            saved[device] = os.path.join(tmp, "%s_%s.safetensors" % (name, device))
            count = ["--epochs", "1", "--steps-per-epoch", str(steps)] if flags else ["--epochs", str(steps)]
            folder = os.path.join(tmp, "%s_%s_run" % (name, device))
            run([program, "--device", device, "--threads", "1", "--save", saved[device], "--run-dir", folder] +
                count + flags)
        if flags and steps > 1:  # full batches from the second step on: the whole step one CUDA graph
            log = open(os.path.join(tmp, "%s_emulated_run" % name, "log.txt")).read()
            check("the whole training step runs as a CUDA graph from its step 2 on" in log,
                  "%s: the emulated device ran the training step as one CUDA graph from step 2" % name)
        if name == "resnet50_f64":  # 23.5M filter elements, more than its columns at batch 2
            check("convolution generated: im2col and products" in
                  open(os.path.join(tmp, "%s_cpu_run" % name, "log.txt")).read(),
                  "%s: the CPU takes the generated path for filters large beside the columns" % name)
        if name == "fashion_cnn_adam":  # every path of both devices against the reference convolution
            check("convolution the CPU's: tiles of columns and products" in
                  open(os.path.join(tmp, "%s_cpu_run" % name, "log.txt")).read(),
                  "%s: the CPU runs its own convolution by default (small filters)" % name)
            for device, path in (("emulated", "generated"), ("cpu", "generated"), ("cpu", "library")):
                other = os.path.join(tmp, "%s_%s_%s.safetensors" % (name, device, path))
                run([program, "--device", device, "--threads", "1", "--save", other, "--convolutions", path,
                           "--run-dir", os.path.join(tmp, "%s_%s_%s_run" % (name, device, path))] + count + flags)
                d, _ = distance(saved["emulated"], other)
                check(d <= tolerance, "%s: %s with --convolutions %s against the emulated device's reference: "
                      "%.2e of the norm" % (name, device, path, d))
            check("convolution the emulated device's reference convolution" in
                  open(os.path.join(tmp, "%s_emulated_run" % name, "log.txt")).read(),
                  "%s: the emulated device runs the library's convolutions by default" % name)
        if name == "fashion_cnn_adam":  # the graphs replay exactly what the calls one by one do
            plain = os.path.join(tmp, "%s_no_graphs.safetensors" % name)
            run([program, "--device", "emulated", "--threads", "1", "--save", plain, "--no-cuda-graphs",
                 "--run-dir", os.path.join(tmp, "%s_no_graphs_run" % name)] + count + flags)
            check(open(plain, "rb").read() == open(saved["emulated"], "rb").read(),
                  "%s: with --no-cuda-graphs the emulated device saves the very same bytes" % name)
        d, where = distance(saved["cpu"], saved["emulated"])
        floor, ceiling = tolerance if isinstance(tolerance, tuple) else (0, tolerance)
        check(floor <= d <= ceiling, "%s (%s, %d %s): emulated against CPU %.2e of the norm (%s%.0e; most in %s)"
              % (name, dtype, steps, "steps" if flags else "epochs", d,
                 "at least %.0e, at most " % floor if floor else "tolerance ", ceiling, where))


def figures(path):
    return [json.loads(line) for line in open(path)]


def close(a, b, tolerance):
    if a is None or b is None:
        return a is b
    return abs(a - b) <= tolerance * max(1.0, abs(a))


def compare_files_program(programs, tmp):
    root = os.path.join(tmp, "data")
    os.makedirs(root)
    good_files(root)
    program = os.path.join(programs, "files_npy_steps")
    out = {}
    for device in ("cpu", "emulated"):
        saved, metrics, again, trace = (os.path.join(tmp, "files_%s.%s" % (device, ext))
                                        for ext in ("safetensors", "json", "evaluate.json", "trace.json"))
        out[device] = run([program, "--device", device, "--data-root", root, "--epochs", "2", "--save", saved,
                           "--metrics", metrics, "--trace", trace])
        run([program, "--device", device, "--data-root", root, "--load", saved, "--evaluate", "--metrics", again])
        out[device] = (saved, figures(metrics), figures(again), trace)
    cpu, emulated = out["cpu"], out["emulated"]
    d, _ = distance(cpu[0], emulated[0])
    check(d <= 1e-5, "files_npy_steps (batch normalisation, dropout): saved parameters %.2e of the norm apart" % d)
    keys = ("loss", "accuracy", "val_loss", "val_accuracy")
    same = len(cpu[1]) == len(emulated[1]) == 2 and all(
        close(a.get(k), b.get(k), 1e-5) for a, b in zip(cpu[1], emulated[1]) for k in keys)
    check(same, "validation figures of both epochs agree: %s" % [(e["val_loss"], e["val_accuracy"])
                                                                  for e in emulated[1]])
    same = len(cpu[2]) == len(emulated[2]) == 1 and all(
        close(cpu[2][0].get(k), emulated[2][0].get(k), 1e-5) for k in ("val_loss", "val_accuracy"))
    check(same, "--load with --evaluate on the emulated device repeats the CPU's figures: %s" % emulated[2])
    spans = json.load(open(emulated[3]))
    events = spans["traceEvents"] if isinstance(spans, dict) else spans
    names = {e.get("name") for e in events}
    check({"forward", "backward", "optimizer"} <= names,
          "--trace on the emulated device: %d events, phases %s" % (len(events), sorted(
              n for n in names if n in ("forward", "backward", "optimizer", "validation"))))


def main():
    ddpc, programs = sys.argv[1], sys.argv[2]
    tmp = datafiles.scratch_folder()
    compare_training(ddpc, tmp)
    compare_files_program(programs, tmp)
    failed = datafiles.failures
    print("devices: %s" % ("FAIL" if failed else "the emulated device trains as the CPU does"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
