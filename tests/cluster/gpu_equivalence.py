#!/usr/bin/env python3
"""gpu_equivalence.py PROGRAMS STANDIN LAUNCHER...: GPU replicas on several processes
train exactly as one replica on the same global batch (S1), on the emulated device:

- 4 processes x 1 GPU summing with NCCL (the tests' stand-in NCCL in the folder STANDIN,
  found by the very search that finds NCCL itself: DDP_CUDA_LIBRARY_PATH), 20 SGD steps
  of equivalence_16_nccl against equivalence_64 alone;
- the same with communication = ring (each bucket staged through pinned memory);
- 2 processes x 2 GPUs (gpus_per_worker = 2: a thread and an emulated device for each
  replica), with NCCL and with the ring, against the same;
- 3 processes with NCCL where the last global batch leaves one of them no sample
  (remainder_16_nccl against remainder_48);
- one process asking for NCCL, a communicator of one rank: the very same parameters as
  without NCCL; and with DDP_TEST_NCCL_ABORT=3 its watchdog aborts the communicator in
  step 3 and the run ends with status 3 saying so (DDP_TEST_NCCL_ABORT=soon, no step:
  a warning, and no abort).
Parameters within 1e-5 of their norm, every step's loss within 1e-5. The banner says
how the gradients travel, NCCL's own variables reach it (NCCL_DEBUG=INFO: the
stand-in's line on every rank), and proxy variables pointing nowhere change nothing
(S15)."""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from datafiles import read_safetensors  # noqa: E402
from equivalence import compare, run  # noqa: E402

EMULATED = ["--device", "emulated"]


def expect(out, text, what):
    if text in out:
        print("ok   %s" % what)
        return True
    print("FAIL %s: no `%s` in the output:\n%s" % (what, text, out[-3000:]))
    return False


def main():
    programs, standin, launcher = sys.argv[1], sys.argv[2], sys.argv[3:]
    tmp = tempfile.mkdtemp()
    nowhere = "http://127.0.0.1:9"
    env = dict(os.environ, DDP_CUDA_LIBRARY_PATH=standin, NCCL_DEBUG="INFO", http_proxy=nowhere,
               https_proxy=nowhere, all_proxy=nowhere, HTTP_PROXY=nowhere, HTTPS_PROXY=nowhere, ALL_PROXY=nowhere)
    ok, out = compare("nccl", 4, launcher, programs, "equivalence_16_nccl", "equivalence_64", tmp, EMULATED, env,
                      traced=False)
    ok &= expect(out, "gradients   summed by the stand-in NCCL", "the banner names the stand-in NCCL")
    ok &= expect(out, "each bucket's all-reduce on the communication stream during backward",
                 "each bucket is summed during backward")
    ok &= all(expect(out, "stand-in NCCL INFO rank %d of 4" % r, "NCCL_DEBUG reaches rank %d's NCCL" % r)
              for r in range(4))
    ring_ok, out = compare("ring", 4, launcher, programs, "equivalence_16_ring", "equivalence_64", tmp, EMULATED,
                           env, traced=False)
    ok &= ring_ok
    ok &= expect(out, "gradients   summed by the TCP ring (communication = ring), each bucket staged through "
                 "pinned memory", "the ring's banner")
    for transport in ("nccl", "ring"):
        g2_ok, out = compare("g2_" + transport, 2, launcher, programs, "equivalence_16_%s_g2" % transport,
                             "equivalence_64", tmp, EMULATED, env, traced=False)
        ok &= g2_ok
        ok &= expect(out, "cluster     %s: 2 workers x 2 GPUs on 1 node" % (
            "slurm" if "srun" in launcher[0] else "env"), "2 x 2 GPUs (%s): the banner says so" % transport)
        ok &= expect(out, "batch       16 per replica x 4 replicas = 64 global", "2 x 2 GPUs: 4 replicas")
    ok &= compare("remainder", 3, launcher, programs, "remainder_16_nccl", "remainder_48", tmp, EMULATED, env,
                  traced=False)[0]
    ok &= alone(programs, tmp, env)
    sys.exit(0 if ok else 1)


def alone(programs, tmp, env):
    """A communicator of one rank changes nothing, and its abort ends the run."""
    saved = [os.path.join(tmp, "alone_%s.safetensors" % k) for k in ("nccl", "plain")]
    out = [run([os.path.join(programs, program), "--save", path, "--run-dir", path + ".run"] + EMULATED, env)
           for program, path in zip(("equivalence_16_nccl", "equivalence_16"), saved)]
    same = read_safetensors(saved[0])[0] == read_safetensors(saved[1])[0]
    print("%s one process with a one-rank NCCL communicator: %s parameters as without" % (
        "ok  " if same else "FAIL", "the same" if same else "other"))
    p = subprocess.run([os.path.join(programs, "equivalence_16_nccl"), "--run-dir", os.path.join(tmp, "aborted")] +
                       EMULATED, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120,
                       env=dict(env, DDP_TEST_NCCL_ABORT="3"))
    aborted = p.returncode == 3 and "in step 3: DDP_TEST_NCCL_ABORT=3 asked for this abort; the communicator was " \
        "aborted" in p.stdout
    print("%s DDP_TEST_NCCL_ABORT=3: status %d%s" % ("ok  " if aborted else "FAIL", p.returncode,
                                                     "" if aborted else "\n" + p.stdout[-2000:]))
    q = subprocess.run([os.path.join(programs, "equivalence_16_nccl"), "--epochs", "1", "--run-dir",
                        os.path.join(tmp, "not_a_step")] + EMULATED, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=120, env=dict(env, DDP_TEST_NCCL_ABORT="soon"))
    said = q.returncode == 0 and "DDP_TEST_NCCL_ABORT=soon is not a step (from 1); no abort" in q.stdout
    print("%s DDP_TEST_NCCL_ABORT=soon: status %d, a warning and no abort%s" % (
        "ok  " if said else "FAIL", q.returncode, "" if said else "\n" + q.stdout[-2000:]))
    return same and aborted and said and expect(out[0], "gradients   summed by the stand-in NCCL",
                                                "alone, the banner says NCCL")


if __name__ == "__main__":
    main()
