#!/bin/sh
# profile.sh PROGRAMS DDPRUN: --profile on fashion_mlp (synthetic data, a few steps).
#
# Alone: the table is printed and written to the run folder; its shares add up to 100%
# and to the step; every layer of the model (the saved parameters' names) has forward
# and backward time; the products sit in the right phase and layer with the live sizes;
# profile.json agrees with the table and with itself; the first step is left out. Two
# workers under ddprun: worker 0 prints its table, communication takes time, worker 1
# writes profile.rank1.json. Without --profile, or with one step, nothing is written.
# On the emulated device the calls are timed by the device's timing marks (the time
# the queued work took when it ran), every layer has its time, and the phases run step
# by step rather than as CUDA graphs (which a run without --profile uses). Of a
# convolution's two paths in the schedule, only the calls of the one taken are listed
# (the CPU's own convolution by default, its generated steps when asked for).
# The checks are Python, given to python3 on its standard input: kept as profile.py
# they would stand in for the standard library's `profile` module in every script of
# this folder.
exec python3 - "$@" <<'EOF'
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

programs, ddprun = sys.argv[1], sys.argv[2]
program = os.path.join(programs, "fashion_mlp")
STEPS = 8  # one of them warm-up
SHARES = ["forward", "backward", "optimizer", "communication", "data", "other"]
failures = []


def check(ok, what):
    print(("ok: " if ok else "FAIL: ") + what)
    if not ok:
        failures.append(what)
    return ok


def train(run_dir, *extra, workers=1, steps=STEPS):
    command = [program, "--synthetic", "--epochs", "1", "--steps-per-epoch", str(steps), "--run-dir", run_dir,
               "--threads", "1", *extra]
    if workers > 1:
        command = [ddprun, "-n", str(workers), *command]
    done = subprocess.run(command, capture_output=True, text=True, timeout=240)
    if done.returncode != 0:
        print(done.stdout, done.stderr)
    return done


def layers_saved(path):
    """The layers whose parameters the safetensors file holds: "mlp.hidden" for "mlp.hidden.weight"."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
    return sorted({name.rsplit(".", 1)[0] for name in header if name != "__metadata__"})


def parse_table(text):
    """The printed table: heading, shares, layers and calls, as numbers."""
    table = {"shares": {}, "layers": {}, "calls": []}
    heading = re.search(r"^profile of `mlp`.*$", text, re.M)
    table["heading"] = heading.group(0) if heading else ""
    step = re.search(r"^  a step\s+([\d.]+) ms\s+100\.0%$", text, re.M)
    table["step_ms"] = float(step.group(1)) if step else None
    for name in SHARES:
        m = re.search(r"^    %s\s+([\d.]+) ms\s+([\d.]+)%%$" % name, text, re.M)
        if m:
            table["shares"][name] = (float(m.group(1)), float(m.group(2)))
    section = text.split("\n  layer ", 1)[-1].split("\n\n", 1)[0].splitlines()[1:]
    for line in section:
        *name, forward, backward, optimizer, total, share = line.split()
        table["layers"][" ".join(name)] = [float(forward), float(backward), float(optimizer), float(total),
                                           float(share.rstrip("%"))]
    for m in re.finditer(r"^  (.+?)\s+(forward|backward|optimizer)\s+(.+?)\s+([\d.]+)\s+([\d.]+)%$", text, re.M):
        table["calls"].append((m.group(1), m.group(2), m.group(3), float(m.group(4))))
    return table


def near(a, b, tolerance):
    return a is not None and b is not None and abs(a - b) <= tolerance


def check_consistent(profile, table, who):
    """profile.json against itself and against the printed table (rounded to 0.001 ms)."""
    shares = profile["shares"]
    check(near(sum(shares[k]["ms"] for k in SHARES), profile["step_ms"], 1e-4),
          f"{who}: the JSON's shares add up to step_ms {profile['step_ms']:.4f} ms")
    check(near(sum(shares[k]["percent"] for k in SHARES), 100, 0.01), f"{who}: the JSON's shares add up to 100%")
    for phase in ["forward", "backward", "optimizer"]:
        calls = sum(c["ms"] for c in profile["calls"] if c["phase"] == phase)
        check(near(calls, shares[phase]["ms"], 1e-4), f"{who}: the {phase} calls add up to its share ({calls:.4f} ms)")
    layers = sum(l["total_ms"] for l in profile["layers"])
    rest = sum(shares[k]["ms"] for k in ["communication", "data", "other"])
    check(near(layers + rest, profile["step_ms"], 1e-4),
          f"{who}: layers, communication, data and other add up to the step")
    check(near(table["step_ms"], profile["step_ms"], 0.0006), f"{who}: the table's step is the JSON's")
    check(all(near(table["shares"].get(k, (None,))[0], shares[k]["ms"], 0.0006) for k in SHARES),
          f"{who}: the table's shares are the JSON's")
    check(all(near(table["layers"].get(l["layer"], [None])[0], l["forward_ms"], 0.0006) and
              near(table["layers"][l["layer"]][1], l["backward_ms"], 0.0006) for l in profile["layers"]) and
          len(table["layers"]) == len(profile["layers"]), f"{who}: the table's layers are the JSON's")
    top = [(c["name"], c["phase"], c["layer"]) for c in profile["calls"][:15]]
    check([c[:3] for c in table["calls"]] == top, f"{who}: the table's calls are the JSON's first 15")
    costs = [c["ms"] for c in profile["calls"]]
    check(costs == sorted(costs, reverse=True), f"{who}: the calls come most expensive first")


def alone(root):
    run_dir = os.path.join(root, "alone")
    saved = os.path.join(root, "params.safetensors")
    done = train(run_dir, "--profile", "--save", saved)
    if not check(done.returncode == 0, "one worker trains with --profile"):
        return
    table = parse_table(done.stdout)
    check(table["heading"].endswith(f"(cpu): {STEPS - 1} steps averaged after 1 warm-up step, 64 samples a step "
                                     "on this worker"), f"the heading: {table['heading']}")
    check(len(table["shares"]) == len(SHARES) and near(sum(p for _, p in table["shares"].values()), 100, 0.5),
          "the printed shares add up to 100% +- 0.5: " + ", ".join(f"{k} {v[1]}%" for k, v in table["shares"].items()))
    check(near(sum(ms for ms, _ in table["shares"].values()), table["step_ms"], 0.004),
          "the printed shares add up to the step's ms")
    with open(os.path.join(run_dir, "profile.txt")) as f:
        written = f.read()
    check(written.strip() and written.strip() in done.stdout, "profile.txt is the table printed")
    with open(os.path.join(run_dir, "profile.json")) as f:
        profile = json.load(f)
    check(profile["steps"] == STEPS - 1 and profile["warmup_steps"] == 1 and profile["workers"] == 1 and
          profile["local_batch"] == 64, "profile.json: 7 steps after 1 warm-up, one worker, 64 samples")
    check_consistent(profile, table, "alone")
    layers = {l["layer"]: l for l in profile["layers"]}
    for name in layers_saved(saved):
        check(name in layers and layers[name]["forward_ms"] > 0 and layers[name]["backward_ms"] > 0 and
              name in table["layers"], f"layer {name} has forward and backward time")
    check(list(layers)[:2] == ["mlp.hidden", "mlp.logits"], "the layers come in the schedule's order")
    calls = {(c["name"], c["phase"], c["layer"]) for c in profile["calls"]}
    for want in [("gemm 64x256x784", "forward", "mlp.hidden"), ("gemm 784x256x64", "backward", "mlp.hidden"),
                 ("gemm 64x10x256", "forward", "mlp.logits")]:
        check(want in calls, f"the call {want[0]} is {want[1]}'s, of layer {want[2]}")
    optimizer = [c for c in profile["calls"] if c["phase"] == "optimizer"]
    check(optimizer and all(c["layer"] == "(whole model)" for c in optimizer) and
          any("optimizer" in c["name"] for c in optimizer) and profile["shares"]["optimizer"]["ms"] > 0,
          "the optimizer's kernels are the optimizer's, of the whole model")
    check(profile["shares"]["data"]["ms"] > 0, "the batch takes time (data)")
    check(profile["shares"]["communication"]["percent"] < 10, "one worker spends next to nothing on communication")


def two_workers(root):
    run_dir = os.path.join(root, "two")
    done = train(run_dir, "--profile", workers=2)
    if not check(done.returncode == 0, "two workers train with --profile under ddprun"):
        return
    check(done.stdout.count("profile of `mlp`") == 1, "one table printed")
    table = parse_table(done.stdout)
    check("worker 0 of 2" in table["heading"], f"the table is worker 0's: {table['heading']}")
    check(near(sum(p for _, p in table["shares"].values()), 100, 0.5), "the shares add up to 100% +- 0.5")
    with open(os.path.join(run_dir, "profile.json")) as f:
        profile = json.load(f)
    check(profile["rank"] == 0 and profile["workers"] == 2, "profile.json is worker 0's")
    check_consistent(profile, table, "two workers")
    check(profile["shares"]["communication"]["ms"] > 0 and table["shares"]["communication"][0] > 0,
          f"communication takes time: {profile['shares']['communication']['ms']:.4f} ms a step")
    with open(os.path.join(run_dir, "profile.rank1.json")) as f:
        other = json.load(f)
    check(other["rank"] == 1 and other["steps"] == STEPS - 1 and other["shares"]["communication"]["ms"] > 0,
          "worker 1 wrote profile.rank1.json, with communication")


def emulated(root):
    run_dir = os.path.join(root, "emulated")
    saved = os.path.join(root, "emulated.safetensors")
    done = train(run_dir, "--profile", "--device", "emulated", "--save", saved, steps=4)
    if not check(done.returncode == 0, "the emulated device trains with --profile"):
        return
    table = parse_table(done.stdout)
    check("(emulated)" in table["heading"], f"the heading names the device: {table['heading']}")
    with open(os.path.join(run_dir, "profile.json")) as f:
        profile = json.load(f)
    check_consistent(profile, table, "emulated")
    layers = {l["layer"]: l for l in profile["layers"]}
    check(all(name in layers and layers[name]["forward_ms"] > 0 and layers[name]["backward_ms"] > 0
              for name in layers_saved(saved)), "emulated: every layer has forward and backward time")
    calls = {(c["name"], c["phase"], c["layer"]) for c in profile["calls"]}
    check(("gemm 64x256x784", "forward", "mlp.hidden") in calls and
          ("gemm 784x256x64", "backward", "mlp.hidden") in calls, "emulated: the products in their phase and layer")
    with open(os.path.join(run_dir, "log.txt")) as f:
        log = f.read()
    check("training step runs as a CUDA graph" not in log and "phase runs as a CUDA graph" not in log and
          "graphs      none for training (--profile" in log,
          "emulated with --profile: every training phase step by step, no CUDA graph")
    plain = os.path.join(root, "emulated_plain")
    done = train(plain, "--device", "emulated", steps=4)
    with open(os.path.join(plain, "log.txt")) as f:
        check(done.returncode == 0 and "the whole training step runs as a CUDA graph" in f.read(),
              "emulated without --profile: the training step runs as a CUDA graph")


def one_path(root):
    """A convolution's schedule holds both paths; only the one taken has calls."""
    program = os.path.join(programs, "convolution")
    for device, path, taken, other in (("cpu", None, "conv", "im2col"), ("cpu", "generated", "im2col", "conv"),
                                       ("emulated", None, "conv", "im2col")):
        run_dir = os.path.join(root, "paths_%s_%s" % (device, path))
        command = [program, "--synthetic", "--epochs", "1", "--steps-per-epoch", "4", "--run-dir", run_dir,
                   "--threads", "1", "--profile", "--device", device] + (["--convolutions", path] if path else [])
        done = subprocess.run(command, capture_output=True, text=True, timeout=240)
        if not check(done.returncode == 0, f"{device} ({path or 'default'} path): the convolution model trains with --profile"):
            print(done.stdout, done.stderr)
            continue
        with open(os.path.join(run_dir, "profile.json")) as f:
            names = [c["name"] for c in json.load(f)["calls"]]
        check(any(taken in n for n in names) and not any(other in n for n in names),
              f"{device} ({path or 'default'} path): the calls of the path taken ({taken}), none of the other ({other}): {names}")


def nothing_written(root):
    run_dir = os.path.join(root, "plain")
    done = train(run_dir)
    check(done.returncode == 0 and "profile of" not in done.stdout and
          not any(f.startswith("profile") for f in os.listdir(run_dir)), "without --profile: no profile")
    run_dir = os.path.join(root, "one_step")
    done = train(run_dir, "--profile", steps=1)
    check(done.returncode == 0 and "profile: nothing to report" in done.stdout and
          not os.path.exists(os.path.join(run_dir, "profile.json")), "a single step: nothing to report, no file")


with tempfile.TemporaryDirectory() as root:
    alone(root)
    two_workers(root)
    emulated(root)
    one_path(root)
    nothing_written(root)
if failures:
    print(f"{len(failures)} failed")
    sys.exit(1)
EOF
