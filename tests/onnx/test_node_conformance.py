"""The ONNX package's own backend node tests, run through express.onnx.

Every case whose tensors use dtypes Express supports is a test: it must pass, unless it is listed
in node_gaps.txt, in which case it must fail (so the list stays exact). Cases with other dtypes
(float64, int16, strings, float8, ...) are counted in docs/onnx_coverage.rst."""
import os
import sys

import pytest

pytest.importorskip("onnx")
sys.path.insert(0, os.path.dirname(__file__))
import node_cases as nc  # noqa: E402

CASES = nc.cases()
GAPS = nc.gaps()
SUPPORTED = sorted(n for n, c in CASES.items() if nc.dtypes_supported(c))


def test_gap_list_names_real_cases():
    unknown = sorted(set(GAPS) - set(SUPPORTED))
    assert not unknown, f"node_gaps.txt lists cases that are not supported-dtype node cases: {unknown}"


def test_pass_rate_target():
    assert len(SUPPORTED) > 1000
    assert 1 - len(GAPS) / len(SUPPORTED) >= 0.85


@pytest.mark.parametrize("name", SUPPORTED)
def test_node(name):
    case = CASES[name]
    if name in GAPS:
        with pytest.raises(Exception):
            nc.run_case(case)
        return
    nc.run_case(case)
