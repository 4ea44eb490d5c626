#!/usr/bin/env python3
"""gpu_throughput.py: PyTorch's training throughput for the models that
bench/gpu_throughput.sh measures ddp on, set up as a PyTorch user would set them up.

Models (layer for layer, optimizer and batch as the .ddp files say):
  resnet50  samples/cifar10_resnet50.ddp with std/resnet: torchvision's ResNet-50 with
            the CIFAR stem (3x3 stride-1 convolution, no max-pool), 10 classes, batch
            normalisation (momentum 0.1 in PyTorch's convention, epsilon 1e-5), SGD with
            Nesterov momentum 0.9 and weight decay 5e-4, a cosine schedule with warm-up;
            batch 128 of [3, 32, 32]; metrics accuracy and top-5
  fashion   samples/fashion.ddp: two 5x5 convolutions (same padding, relu) each with a
            2x2 max-pool, dense 1024 (relu), dropout 0.4, dense 10; Adam 0.001 with
            epsilon 1e-7; batch 64 of [1, 28, 28]; metric accuracy
Each in eager mode and with torch.compile (its compile time reported, not counted).
Set-up: cudnn.benchmark on, channels_last, random data already on the device, and
--precision:
  tf32  ddp's `precision = tf32`: PyTorch's TF32 for matrix products and convolutions
  f32   IEEE f32 for both
  bf16  ddp's `precision = bf16`, as PyTorch users write mixed precision (AMP): the
        forward and the loss under torch.autocast(dtype=torch.bfloat16), the
        parameters, their gradients and the optimizer f32, no GradScaler (bf16 has
        f32's range); TF32 off for what autocast leaves f32. torch.compile compiles the
        module and autocast wraps the call. On --device cpu, autocast's cpu bf16.
A step is what ddp's step does: forward, the mean cross-entropy, backward, the
optimizer's update and the learning-rate schedule, and the loss and metric sums kept
on the device. Initialisation differs from ddp's; the work does not.

Timing: warm-up steps first (cuDNN's algorithm search, compilation), then chunks of
steps timed with CUDA events (on the CPU: the wall clock) until --seconds have passed;
a case's figure is the median chunk's samples/s.

Output, one line per case, flushed as each ends (bench/gpu_throughput.sh reads them):
  reference MODEL MODE PRECISION SAMPLES_PER_S key=value...
SAMPLES_PER_S is "-" when the case gave no figure, followed by "skipped: why" or
"failed: why". Lines starting with "#" describe the set-up.

--list prints the cases without importing PyTorch (a dry run of the arguments).
"""
import argparse
import contextlib
import math
import os
import signal
import statistics
import sys
import time

BATCH = {"resnet50": 128, "fashion": 64}
WARMUP = {"eager": 8, "compile": 4}
# A chunk of timed steps lasts about this share of --seconds, so the median is taken
# over about five chunks.
CHUNK_SHARE = 0.2


def parse_args():
    p = argparse.ArgumentParser(description="PyTorch's samples/s for ddp's GPU benchmark models.")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--precision", choices=["tf32", "f32", "bf16"], default="tf32")
    p.add_argument("--models", default="resnet50,fashion",
                   help="comma-separated, in the order to run (default: resnet50,fashion)")
    p.add_argument("--modes", default="eager,compile",
                   help="eager, compile or both; every model's eager case runs before any compile case")
    p.add_argument("--compile-mode", default="default", help="torch.compile's mode (default: default)")
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per case, after warm-up")
    p.add_argument("--budget", type=float, default=0.0,
                   help="wall seconds for the whole run; a case that would pass it is skipped or stopped (0: none)")
    p.add_argument("--list", action="store_true", help="print the cases and exit, without PyTorch")
    args = p.parse_args()
    args.models = [m for m in args.models.split(",") if m]
    args.modes = [m for m in args.modes.split(",") if m]
    for m in args.models:
        if m not in BATCH:
            p.error(f"unknown model `{m}` (known: {', '.join(BATCH)})")
    for m in args.modes:
        if m not in WARMUP:
            p.error(f"unknown mode `{m}` (known: eager, compile)")
    return args


def cases(args):
    # Eager first: the cheap cases give their figures before a long compilation starts.
    return [(model, mode) for mode in ("eager", "compile") if mode in args.modes for model in args.models]


def say(line):
    print(line, flush=True)


# ----------------------------------------------------------------- the models

def build(torch, model):
    """The network, its optimizer and schedule, and the metrics ddp's program keeps."""
    nn = torch.nn
    if model == "fashion":
        net = nn.Sequential(
            nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear(7 * 7 * 64, 1024), nn.ReLU(), nn.Dropout(0.4), nn.Linear(1024, 10))
        optimizer = torch.optim.Adam(net.parameters(), lr=0.001, betas=(0.9, 0.999), eps=1e-7)
        return net, optimizer, None, 1

    net = resnet50_cifar(nn, classes=10)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9, nesterov=True, weight_decay=5e-4)
    # cosine(0.05, warmup = 2 epochs) over the sample's 30 epochs of 50,000 / 128 steps
    per_epoch = 50000 // BATCH[model]
    warmup, total = 2 * per_epoch, 30 * per_epoch

    def factor(step):
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / (total - warmup))))
    return net, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor), 5


def resnet50_cifar(nn, classes):
    """std/resnet's resnet50(stem = cifar): torchvision's layout, stride on the 3x3."""
    def bn(channels):
        return nn.BatchNorm2d(channels, eps=1e-5, momentum=0.1)

    class Bottleneck(nn.Module):
        def __init__(self, cin, filters, stride, project):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(cin, filters, 1, bias=False), bn(filters)
            self.conv2 = nn.Conv2d(filters, filters, 3, stride=stride, padding=1, bias=False)
            self.bn2 = bn(filters)
            self.conv3, self.bn3 = nn.Conv2d(filters, 4 * filters, 1, bias=False), bn(4 * filters)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = None
            if project or stride != 1:
                self.downsample = nn.Sequential(nn.Conv2d(cin, 4 * filters, 1, stride=stride, bias=False),
                                                bn(4 * filters))

        def forward(self, x):
            shortcut = x if self.downsample is None else self.downsample(x)
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            return self.relu(self.bn3(self.conv3(y)) + shortcut)

    layers = [nn.Conv2d(3, 64, 3, padding=1, bias=False), bn(64), nn.ReLU(inplace=True)]
    cin = 64
    for filters, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            layers.append(Bottleneck(cin, filters, stride if b == 0 else 1, project=b == 0))
            cin = 4 * filters
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


# ----------------------------------------------------------------- one case

class OutOfTime(Exception):
    pass


def on_alarm(signum, frame):
    raise OutOfTime()


def run_case(torch, args, model, mode, device, deadline):
    """samples/s of the median chunk, with the figures behind it; raises on failure."""
    batch = BATCH[model]
    torch.manual_seed(0)
    net, optimizer, scheduler, top_k = build(torch, model)
    net = net.to(device, memory_format=torch.channels_last).train()
    shape = (batch, 1, 28, 28) if model == "fashion" else (batch, 3, 32, 32)
    # a few batches of random inputs in [-1, 1) and classes, on the device, as ddp's --synthetic
    pool = [(torch.rand(shape, device=device).mul_(2).sub_(1).contiguous(memory_format=torch.channels_last),
             torch.randint(0, 10, (batch,), device=device)) for _ in range(4)]
    sums = torch.zeros(3, device=device)  # loss, accuracy, top-k: ddp's accumulators
    forward = torch.compile(net, mode=args.compile_mode) if mode == "compile" else net
    cross_entropy = torch.nn.functional.cross_entropy
    if args.precision == "bf16":
        def autocast():
            return torch.autocast(device_type=device, dtype=torch.bfloat16)
    else:
        autocast = contextlib.nullcontext

    def steps(first, n):
        for i in range(first, first + n):
            x, y = pool[i % len(pool)]
            optimizer.zero_grad(set_to_none=True)
            with autocast():
                logits = forward(x)
                loss = cross_entropy(logits, y)
            loss.backward()
            optimizer.step()
            if scheduler is not None:
                scheduler.step()
            with torch.no_grad():
                sums[0] += loss.detach() * batch
                sums[1] += (logits.argmax(1) == y).sum()
                if top_k > 1:
                    sums[2] += (logits.topk(top_k, 1).indices == y[:, None]).any(1).sum()

    cuda = device == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def timed(first, n):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            steps(first, n)
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1000
        t = time.perf_counter()
        steps(first, n)
        return time.perf_counter() - t

    if deadline:
        signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(max(1, int(deadline - time.monotonic())))
    try:
        t = time.perf_counter()
        steps(0, 1)  # compilation (or cuDNN's first search) happens here
        sync()
        first_s = time.perf_counter() - t
        warmup = WARMUP[mode]
        steps(1, warmup - 1)
        sync()
        # calibrate the chunk: steps in about CHUNK_SHARE of --seconds
        probe = timed(warmup, 3) / 3
        chunk = max(1, round(CHUNK_SHARE * args.seconds / max(probe, 1e-6)))
        done, measured, rates = warmup + 3, 0.0, []
        while measured < args.seconds or len(rates) < 3:
            s = timed(done, chunk)
            done += chunk
            measured += s
            rates.append(chunk * batch / s)
        float(sums[0])  # the sums really were computed
    finally:
        if deadline:
            signal.alarm(0)
    extra = f" compile_s={first_s:.1f}" if mode == "compile" else ""
    return statistics.median(rates), f"steps={done - warmup - 3} seconds={measured:.2f} chunks={len(rates)}{extra}"


# ----------------------------------------------------------------- the run

def set_precision(torch, tf32):
    """TF32 for matrix products and convolutions, or IEEE f32 for both."""
    if hasattr(torch.backends, "fp32_precision"):
        # PyTorch 2.9 and later: the allow_tf32 flags are the old spelling of these,
        # and the two spellings may not be mixed.
        mode = "tf32" if tf32 else "ieee"
        torch.backends.cuda.matmul.fp32_precision = mode
        torch.backends.cudnn.conv.fp32_precision = mode
        return f"fp32_precision {mode} (matmul, cudnn.conv)"
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    return f"allow_tf32 {tf32} (matmul, cudnn)"


def main():
    args = parse_args()
    start = time.monotonic()
    deadline = start + args.budget if args.budget > 0 else 0
    if args.list:
        for model, mode in cases(args):
            say(f"case {model} {mode} {args.precision} batch={BATCH[model]} device={args.device}")
        return 0
    try:
        import torch
    except ImportError as e:
        say(f"# PyTorch is not importable by {sys.executable}: {e}")
        return 77
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        say(f"# PyTorch {torch.__version__} ({sys.executable}) sees no CUDA device")
        return 77
    torch.backends.cudnn.benchmark = True
    products = set_precision(torch, args.precision == "tf32")
    if args.precision == "bf16":
        products = (f"autocast bf16 (forward and loss; f32 parameters and optimizer, no GradScaler), "
                    f"{products} for what stays f32")
    where = torch.cuda.get_device_name() if device == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    say(f"# PyTorch {torch.__version__} (CUDA {torch.version.cuda}) on {where}; cudnn.benchmark, {products}, "
        f"channels_last; {args.seconds:g} s per case; {time.monotonic() - start:.1f} s to import")

    status = 0
    for model, mode in cases(args):
        head = f"reference {model} {mode} {args.precision}"
        left = deadline - time.monotonic() if deadline else math.inf
        # a case needs its measurement and some seconds of set-up; a compile more
        need = args.seconds + (20 if mode == "compile" else 3)
        if left < need:
            say(f"{head} - skipped: {left:.0f} s left of the {args.budget:g} s budget, about {need:.0f} s needed")
            continue
        t = time.monotonic()
        try:
            rate, figures = run_case(torch, args, model, mode, device, deadline)
            say(f"{head} {rate:.1f} {figures} wall_s={time.monotonic() - t:.1f}")
        except Exception as e:  # torch.compile's failures are many kinds; each is reported, the rest go on
            # the alarm may come back wrapped in the compiler's own exception
            if isinstance(e, OutOfTime) or (deadline and time.monotonic() >= deadline - 1):
                say(f"{head} - skipped: stopped at the {args.budget:g} s budget after {time.monotonic() - t:.0f} s"
                    f"{' (compiling)' if mode == 'compile' else ''}")
                continue
            why = " ".join(f"{type(e).__name__}: {e}".split())[:300]
            say(f"{head} - failed: {why}")
            if mode == "eager":
                status = 1
        finally:
            if device == "cuda":
                torch.cuda.empty_cache()
    return status


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    # Skip the interpreter's teardown: after torch.compile it waits on compiler worker
    # processes, which the caller's time limit would count.
    os._exit(code)
