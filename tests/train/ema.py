#!/usr/bin/env python3
"""ema.py PROGRAMS LAUNCHER...: the optimizer's ema (the parameters' moving average,
Keras's use_ema) on tests/train/tiny.ddp, against the run computed here by hand
(float64, the standard library only).

programs/tiny_ema trains with sgd(learning_rate = 0.5, ema = 0.75), save_best = loss
and a checkpoint every epoch, one full-batch step an epoch, for 40 epochs (the
validation loss falls, then rises); programs/tiny_ema_half the same with batches of
4, for two workers of half the batch; tiny_ema_momentum and tiny_ema_adam keep the
average after a velocity or Adam's two moments, beside tiny_momentum and tiny_adam
without it. The test checks:

- each epoch's training loss is the parameters' (p_k, plain SGD steps) and its
  validation figures the average's: a_0 = p_0 (the --load file), then
  a_k = 0.75 a_(k-1) + 0.25 p_k after each step;
- each checkpoint holds p_k as the parameters and a_k as `optimizer.average`; with
  momentum or Adam too, whose parameters are those of the same run without ema, bit
  for bit; --evaluate of a checkpoint gives its epoch's validation figures (its
  average is loaded with it);
- --save writes the average, and --evaluate of that file gives the last validation's
  figures bit for bit; best.safetensors holds the average of the best validation;
- a run stopped by a signal and resumed saves the same bits as one never stopped;
- the emulated GPU (the average traded into its memory for each validation) and two
  workers of half the batch give the same figures and files;
- programs/tiny_ema_warmup (ema_warmup = true): update n's decay is min(0.75, (1 + n) /
  (10 + n)), TensorFlow's num_updates warm-up, through a resume too."""
import json
import os
import subprocess
import sys

import datafiles
from datafiles import check, read_safetensors, run, scratch_folder, with_port
from tiny_check import CHECK, TRAIN, figures, write_tiny_files

RATE, DECAY, EPOCHS = 0.5, 0.75, 40


def by_hand(w0, b0, warmup=False):
    """per epoch: (training loss, validation loss, validation accuracy, p_k, a_k), the
    vectors flat (weights, then biases); with warmup, update n's decay is at most
    (1 + n) / (10 + n)"""
    w, b = [row[:] for row in w0], b0[:]
    average = [v for row in w for v in row] + b
    epochs = []
    for n in range(1, EPOCHS + 1):
        decay = min(DECAY, (1 + n) / (10 + n)) if warmup else DECAY
        loss, _, gw, gb = figures(w, b, TRAIN)
        w = [[w[i][j] - RATE * gw[i][j] for j in range(3)] for i in range(4)]
        b = [b[j] - RATE * gb[j] for j in range(3)]
        params = [v for row in w for v in row] + b
        average = [decay * a + (1 - decay) * p for a, p in zip(average, params)]
        aw = [average[i * 3:i * 3 + 3] for i in range(4)]
        val_loss, val_acc, _, _ = figures(aw, average[12:], CHECK)
        epochs.append((loss, val_loss, val_acc, params, average))
    return epochs


def flat(path):
    t, meta = read_safetensors(path)
    return list(t["tiny.logits.weight"]) + list(t["tiny.logits.bias"]), t, meta


def near(a, b, tol=1e-5):
    return max(abs(x - y) for x, y in zip(a, b)) <= tol


def metrics(run_dir):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


def main():
    programs, launcher = sys.argv[1], sys.argv[2:]
    root = scratch_folder()
    w0, b0 = write_tiny_files(root, TRAIN, CHECK, "w0.safetensors")
    want = by_hand(w0, b0)
    given = ["--data-root", root, "--load", os.path.join(root, "w0.safetensors"), "--epochs", str(EPOCHS),
             "--threads", "1"]
    ema = os.path.join(programs, "tiny_ema")

    first = os.path.join(root, "first")
    saved = os.path.join(root, "first.safetensors")
    out = run([ema, *given, "--run-dir", first, "--save", saved])
    check("sgd, learning rate 0.5, parameters' moving average 0.75 (validated and saved)" in out,
          "the banner says the average is validated and saved")
    got = metrics(first)
    check(len(got) == EPOCHS and all(abs(g["loss"] - w[0]) <= 1e-6 for g, w in zip(got, want)),
          "each epoch's training loss is the parameters' (plain SGD)")
    check(all(abs(g["val_loss"] - w[1]) <= 1e-6 and g["val_accuracy"] == w[2] for g, w in zip(got, want)),
          "each validation's figures are the average's, a_k = 0.75 a_(k-1) + 0.25 p_k from a_0 = p_0")
    plain = [figures([w[3][i * 3:i * 3 + 3] for i in range(4)], w[3][12:], CHECK)[0] for w in want]
    check(all(abs(p - w[1]) > 1e-3 for p, w in zip(plain[:10], want)),
          "(the parameters' own validation losses differ from the average's by more than 1e-3 in the first 10 "
          "epochs)")

    in_checkpoints = True
    for k, w in enumerate(want):
        params, tensors, _ = flat(os.path.join(first, "ck", "step-%010d.safetensors" % (k + 1)))
        state = tensors["optimizer.average"]  # the flat vector: the bias, then the weights
        in_checkpoints = in_checkpoints and near(params, w[3]) and near(list(state[3:]) + list(state[:3]), w[4])
    check(in_checkpoints, "each checkpoint holds p_k as the parameters and a_k as optimizer.average")
    again = os.path.join(root, "checkpoint.json")
    run([ema, "--data-root", root, "--load", os.path.join(first, "ck", "step-%010d.safetensors" % 3), "--evaluate",
         "--metrics", again])
    e = json.loads(open(again).read())
    check(e["val_loss"] == got[2]["val_loss"], "--evaluate of the checkpoint of epoch 3 gives that epoch's "
          "validation figures bit for bit: its average is loaded with it")

    for name, states in (("momentum", 1), ("adam", 2)):
        with_average, without = os.path.join(root, name), os.path.join(root, "plain-" + name)
        run([os.path.join(programs, "tiny_ema_" + name), *given, "--epochs", "5", "--run-dir", with_average])
        run([os.path.join(programs, "tiny_" + name), *given, "--epochs", "5", "--run-dir", without])
        same, recurrence = True, True
        previous = list(w0[0] + w0[1] + w0[2] + w0[3])
        previous = b0 + previous  # the flat vector: the bias, then the weights
        for k in range(1, 6):
            step = "step-%010d.safetensors" % k
            _, a, _ = flat(os.path.join(with_average, "ck", step))
            _, b, _ = flat(os.path.join(without, "ck", step))
            same = same and all(a[n] == b[n] for n in b)
            params = list(a["tiny.logits.bias"]) + list(a["tiny.logits.weight"])
            average = list(a["optimizer.average"])
            same = same and all("optimizer.state.%d" % s in a for s in range(states))
            recurrence = recurrence and near(average, [DECAY * x + (1 - DECAY) * p for x, p in zip(previous, params)],
                                             1e-6)
            previous = average
        check(same and recurrence, "with %s, the average follows its %d state vector(s), the parameters those of "
              "the run without it, bit for bit" % (name, states))

    average, _, _ = flat(saved)
    check(near(average, want[-1][4]) and not near(average, want[-1][3], 1e-3), "--save writes the average a_40")
    again = os.path.join(root, "again.json")
    run([ema, "--data-root", root, "--load", saved, "--evaluate", "--metrics", again])
    e = json.loads(open(again).read())
    check(e["val_loss"] == got[-1]["val_loss"] and e["val_accuracy"] == got[-1]["val_accuracy"],
          "--evaluate of the saved average gives the last validation's figures bit for bit")
    best = min(range(EPOCHS), key=lambda k: (got[k]["val_loss"], k))
    best_params, _, meta = flat(os.path.join(first, "best.safetensors"))
    check(best < EPOCHS - 1 and meta.get("step") == str(best + 1) and near(best_params, want[best][4]),
          "best.safetensors holds the average of the best validation (epoch %d of %d)" % (best + 1, EPOCHS))

    stopped = os.path.join(root, "stopped")
    p = subprocess.run([ema, *given, "--run-dir", stopped, "--save", os.path.join(root, "stopped.safetensors")],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
                       env=dict(os.environ, DDP_TEST_SIGNAL="USR1@3"))
    run([ema, *given, "--run-dir", stopped, "--resume", "--save", os.path.join(root, "stopped.safetensors")])
    _, resumed, _ = flat(os.path.join(root, "stopped.safetensors"))
    _, whole, _ = flat(saved)
    check(p.returncode == 4 and resumed == whole and metrics(stopped) == [
        {**g, "samples_per_sec": s["samples_per_sec"], "seconds": s["seconds"]} for g, s in zip(got, metrics(stopped))],
        "stopped by a signal after step 3 and resumed, the run saves the same bits and figures")

    gpu = os.path.join(root, "gpu")
    run([ema, *given, "--run-dir", gpu, "--device", "emulated", "--save", os.path.join(root, "gpu.safetensors")])
    on_gpu, _, _ = flat(os.path.join(root, "gpu.safetensors"))
    check(near(on_gpu, average) and all(abs(g["val_loss"] - w["val_loss"]) <= 1e-6 and
                                        abs(g["loss"] - w["loss"]) <= 1e-6 for g, w in zip(metrics(gpu), got)),
          "on the emulated GPU the same figures and average, traded into and out of device memory")

    warm = os.path.join(root, "warm")
    warmed = os.path.join(programs, "tiny_ema_warmup")
    out = run([warmed, *given, "--run-dir", warm, "--save", os.path.join(root, "warm.safetensors")])
    want_warm = by_hand(w0, b0, warmup=True)
    got_warm = metrics(warm)
    check("parameters' moving average 0.75 warmed up (validated and saved)" in out and
          all(abs(g["val_loss"] - w[1]) <= 1e-6 and g["loss"] == p["loss"] for g, w, p in zip(got_warm, want_warm, got))
          and abs(got_warm[0]["val_loss"] - got[0]["val_loss"]) > 1e-3,
          "with ema_warmup, update n's decay is min(0.75, (1 + n) / (10 + n)): the validations follow it, the "
          "training the same parameters")
    stopped = os.path.join(root, "warm-stopped")
    p = subprocess.run([warmed, *given, "--run-dir", stopped], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=120, env=dict(os.environ, DDP_TEST_SIGNAL="USR1@5"))
    run([warmed, *given, "--run-dir", stopped, "--resume", "--save", os.path.join(root, "warm-stopped.safetensors")])
    _, resumed, _ = flat(os.path.join(root, "warm-stopped.safetensors"))
    _, whole, _ = flat(os.path.join(root, "warm.safetensors"))
    check(p.returncode == 4 and resumed == whole, "stopped after step 5 and resumed, the warmed-up average the same "
          "bits (the warm-up follows the step, not the resume)")

    two = os.path.join(root, "two.safetensors")
    run(with_port(launcher, 2) + ["2", os.path.join(programs, "tiny_ema_half"), *given,
                                  "--run-dir", os.path.join(root, "two"), "--save", two])
    by_two, _, _ = flat(two)
    check(near(by_two, average), "two workers of half the batch save the same average")
    sys.exit(1 if datafiles.failures else 0)


if __name__ == "__main__":
    main()
