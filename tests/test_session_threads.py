"""The trainer's session has the inter-op threads it asks for, whatever session the process made first.

Unstaging blocks an inter-op thread until its batch arrives; with only as many
threads as cores (2 on a small machine), two towers' blocked Stage/Unstage ops
can hold every thread and the step never ends. TensorFlow sizes its
process-wide pool from the first session, so the trainer's session asks for a
pool of its own. Counted here as the threads TensorFlow starts, in a fresh
process whose first session is a default one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = """
import os
from frameworks.tf_env import import_tf
from harness.tf import devices

tf = import_tf()
v1 = tf.compat.v1

def compute_threads():
    return sum(open(f"/proc/self/task/{t}/comm").read().startswith("tf_Compute") for t in os.listdir("/proc/self/task"))

x = tf.constant(1) + 1
before = compute_threads()
with v1.Session(config=v1.ConfigProto(inter_op_parallelism_threads=1)) as s:  # the process-wide pool: 1 thread
    s.run(x)
first = compute_threads() - before
with v1.Session(config=devices.session_config(2, has_gpu=False)) as s:
    s.run(x)
print(first, compute_threads() - before - first)
"""


def test_the_trainers_session_gets_its_own_inter_op_threads_after_a_default_session():
    p = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stderr[-2000:]
    first, ours = (int(x) for x in p.stdout.split())
    assert first == 1
    assert ours >= 8, f"the trainer's session ran on {ours} new inter-op thread(s), not its own pool of 8"
