#!/usr/bin/env python3
"""other_count.py PROGRAMS DDPRUN: a run resumed with another worker count at the same
global batch goes on as the run never stopped, to rounding: 4 workers x equivalence_16
(no batch normalisation, a learning rate without `replicas`) stopped by SIGUSR1 after
step 9 of 20, resumed by one worker x equivalence_64, against one worker x
equivalence_64 never stopped: per tensor ||a - b|| / ||b|| <= 1e-5. The resume needs no
--resume-changed (only the per-replica batch differs) and the banner says what changes."""
import math
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from datafiles import check, read_safetensors, run, with_port  # noqa: E402
import datafiles  # noqa: E402

programs, ddprun = sys.argv[1], sys.argv[2]
root = datafiles.scratch_folder()
many, one = os.path.join(programs, "equivalence_16"), os.path.join(programs, "equivalence_64")
os.chdir(root)

run([one, "--run-dir", "whole", "--save", "whole.safetensors"])
p = subprocess.run(with_port([ddprun, "-n"], 4) + ["4", many, "--run-dir", "moved", "--threads", "1"],
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                   env=dict(os.environ, DDP_TEST_SIGNAL="USR1@10:2"))
check(p.returncode == 4 and "stopped after step 10" in p.stdout,
      "4 workers x 16 stop after step 10 on a SIGUSR1 to worker 2 (status %d)" % p.returncode)
out = run([one, "--run-dir", "moved", "--resume", "--save", "moved.safetensors"])
said = [line for line in out.splitlines() if line.startswith("  resumed")]
check(said and "written by 4 workers, resumed by 1: per-replica batch 16 -> 64" in said[0],
      "the banner says what changes: %s" % (said[0][:200] if said else out[-400:]))
a, _ = read_safetensors("moved.safetensors")
b, _ = read_safetensors("whole.safetensors")
worst = max(math.sqrt(sum((x - y) ** 2 for x, y in zip(a[k], b[k]))) /
            max(math.sqrt(sum(y * y for y in b[k])), 1e-30) for k in b)
check(sorted(a) == sorted(b) and worst <= 1e-5,
      "resumed by one worker x 64 against one never stopped: worst tensor %.2e (<= 1e-5)" % worst)
sys.exit(1 if datafiles.failures else 0)
