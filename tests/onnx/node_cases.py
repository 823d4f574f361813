"""The ONNX backend node test cases (from the `onnx` package's own test generators) and a small
adapter that runs one case through express.onnx; shared by the tests and tools/onnx_coverage.py."""
from __future__ import annotations

import os
import warnings

import numpy as np

SUPPORTED = {np.dtype(t) for t in (np.float32, np.float16, np.int8, np.uint8, np.int32, np.int64, np.bool_)}
GAPS_FILE = os.path.join(os.path.dirname(__file__), "node_gaps.txt")


def cases():
    """All node test cases: name -> TestCase (the same cases the onnx package ships as data)."""
    from onnx.backend.test.case.node import collect_testcases
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {c.name: c for c in collect_testcases() if c.kind == "node"}


def _arrays(v):
    if isinstance(v, np.ndarray):
        return [v]
    if isinstance(v, (list, tuple)):
        return [a for x in v for a in _arrays(x)]
    return []


def dtypes_supported(case) -> bool:
    for inputs, outputs in case.data_sets:
        for a in _arrays(list(inputs)) + _arrays(list(outputs)):
            if a.dtype not in SUPPORTED:
                return False
    for inputs, outputs in case.data_sets:
        if any(x is None or not isinstance(x, (np.ndarray, list)) for x in list(inputs) + list(outputs)):
            return False
    return True


def op_type(case) -> str:
    return case.model.graph.node[0].op_type


def gaps() -> dict:
    """The checked-in list of node cases known to fail: name -> reason."""
    out = {}
    with open(GAPS_FILE) as f:
        for line in f:
            line = line.split("#", 1)
            name = line[0].strip()
            if name:
                out[name] = line[1].strip() if len(line) > 1 else ""
    return out


def run_case(case) -> None:
    """Run every data set of `case` through express.onnx; raise AssertionError on a mismatch."""
    import express.onnx as eo
    model = eo.load(case.model.SerializeToString())
    names = [v.name for v in model.inputs]
    out_names = [o.name for o in case.model.graph.output]
    for inputs, expected in case.data_sets:
        feeds = dict(zip(names, inputs))
        got = model.run(feeds)
        for name, want in zip(out_names, expected):
            _compare(name, got[name], want, case.rtol, case.atol)


def _compare(name, got, want, rtol, atol):
    if isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), f"{name}: sequence length differs"
        for g, w in zip(got, want):
            _compare(name, g, w, rtol, atol)
        return
    want = np.asarray(want)
    got = np.asarray(got)
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype}, expected {want.dtype}"
    assert got.shape == want.shape, f"{name}: shape {got.shape}, expected {want.shape}"
    if want.dtype.kind in "f":
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                                   atol=builtin_max(atol, 1e-6 if want.dtype == np.float32 else 1e-3),
                                   err_msg=name)
    else:
        np.testing.assert_array_equal(got, want, err_msg=name)


builtin_max = max
