import numpy as np
import pytest

import express as ex

ISAS = ["generic"] + (["avx2"] if ex._lib.lib.ex_cpu_has_avx2() else []) + \
    (["avx512"] if ex._lib.lib.ex_cpu_has_avx512() else [])


@pytest.fixture(params=ISAS)
def isa(request):
    """Run a test once per kernel variant the CPU supports (AVX-512, AVX2, the portable fallback)."""
    before = ex.isa()
    ex.set_isa(request.param)
    yield request.param
    ex.set_isa(before)


@pytest.fixture(params=[1, 2])
def threads(request):
    before = ex.get_num_threads()
    ex.set_num_threads(request.param)
    yield request.param
    ex.set_num_threads(before)


def to_np(a):
    return np.asarray(a)
