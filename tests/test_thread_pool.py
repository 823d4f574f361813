"""Worker placement of the thread pool: one thread per allowed CPU pins each worker to its own
CPU, never the one the caller runs on (the workers move when the caller does); fewer threads, or
EXPRESS_PIN_THREADS=0, pins none."""
import os
import subprocess
import sys

import pytest

CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []

PROBE = r"""
import os, sys, threading, numpy as np, express as ex
ex.set_num_threads(int(sys.argv[1]))
a = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
me = threading.get_native_id()
for cpu in [int(c) for c in sys.argv[2:]] or [None]:
    if cpu is not None:   # the caller (this thread only) moves to that CPU first
        os.sched_setaffinity(0, {cpu})
    got = (ex.matmul(ex.array(a), ex.array(a)) + 1).numpy()   # runs jobs on the pool
    assert np.allclose(got, a @ a + 1, rtol=1e-4, atol=1e-3)
    print([sorted(os.sched_getaffinity(int(t))) for t in sorted(os.listdir("/proc/self/task")) if int(t) != me])
"""


def workers_affinity(threads, pin=None, callers=()):
    """The CPU sets of the threads other than the caller's, in a fresh process, after a job run
    from each CPU of `callers` in turn (none: one job, wherever the OS put the caller)."""
    env = {k: v for k, v in os.environ.items() if k != "EXPRESS_PIN_THREADS"}
    if pin is not None:
        env["EXPRESS_PIN_THREADS"] = pin
    moves = [str(c) for c in callers]
    out = subprocess.run([sys.executable, "-c", PROBE, str(threads)] + moves, check=True, capture_output=True,
                         text=True, env=env).stdout
    return [sorted(eval(line)) for line in out.splitlines()]


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(CPUS) < 2, reason="needs Linux and 2+ CPUs")
def test_pool_pins_one_worker_per_cpu_but_the_callers():
    # the caller runs on the last CPU, then the first: the workers take the others each time
    # (other threads of the interpreter, none expected but tolerated, keep the full set)
    for caller, sets in zip((CPUS[-1], CPUS[0]), workers_affinity(len(CPUS), callers=(CPUS[-1], CPUS[0]))):
        assert sorted(a for a in sets if a != CPUS) == [[c] for c in CPUS if c != caller]


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(CPUS) < 2, reason="needs Linux and 2+ CPUs")
def test_pool_pins_nothing_when_asked_or_undersized():
    for threads, pin in ((len(CPUS), "0"), (len(CPUS) + 1, None)):
        assert all(a == CPUS for sets in workers_affinity(threads, pin=pin) for a in sets)
