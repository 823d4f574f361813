"""Worker placement of the thread pool: one thread per allowed CPU pins each worker to its own
CPU (never the first, which the caller keeps); fewer threads, or EXPRESS_PIN_THREADS=0, pins none."""
import os
import subprocess
import sys

import pytest

CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []

PROBE = r"""
import os, sys, threading, numpy as np, express as ex
ex.set_num_threads(int(sys.argv[1]))
a = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
got = (ex.matmul(ex.array(a), ex.array(a)) + 1).numpy()   # runs jobs on the pool
assert np.allclose(got, a @ a + 1, rtol=1e-4, atol=1e-3)
me = threading.get_native_id()
for t in sorted(os.listdir("/proc/self/task")):
    if int(t) != me:
        print(sorted(os.sched_getaffinity(int(t))))
"""


def workers_affinity(threads, pin=None):
    """The CPU sets of the threads other than the caller's, in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k != "EXPRESS_PIN_THREADS"}
    if pin is not None:
        env["EXPRESS_PIN_THREADS"] = pin
    out = subprocess.run([sys.executable, "-c", PROBE, str(threads)], check=True, capture_output=True, text=True,
                         env=env).stdout
    return sorted(eval(line) for line in out.splitlines())


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(CPUS) < 2, reason="needs Linux and 2+ CPUs")
def test_pool_pins_one_worker_per_cpu():
    # other threads of the interpreter (none expected, but tolerated) keep the full set
    pinned = [a for a in workers_affinity(len(CPUS)) if a != CPUS]
    assert pinned == [[c] for c in CPUS[1:]]


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(CPUS) < 2, reason="needs Linux and 2+ CPUs")
def test_pool_pins_nothing_when_asked_or_undersized():
    assert all(a == CPUS for a in workers_affinity(len(CPUS), pin="0"))
    assert all(a == CPUS for a in workers_affinity(len(CPUS) + 1))
