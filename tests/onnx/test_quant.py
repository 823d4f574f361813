"""Quantized .exm files: MatMul/Gemm weights and embedding tables stored int8/int4 stay packed in
memory after loading (run through qlinear); sizes and accuracy against fp32 on real layouts."""
import collections
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("torch")

import express as ex  # noqa: E402
import express.onnx as eo  # noqa: E402

import models  # noqa: E402
from conftest import ort_run  # noqa: E402

# (model, bits) -> lowest cosine similarity to the fp32 outputs
COS = {("resnet18", 8): 0.999, ("resnet18", 4): 0.97, ("bert_like", 8): 0.999, ("bert_like", 4): 0.99,
       ("minilm", 8): 0.999, ("minilm", 4): 0.99}
RESULTS = {}


def _cos(a, b):
    a, b = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def _source(name, request):
    if name == "minilm":
        data, feeds, _ = request.getfixturevalue("minilm")
        return data, feeds
    if name == "bert_like":
        pytest.importorskip("transformers")
    data, feeds = getattr(models, name)()
    return data, feeds[0]


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("name", ["resnet18", "bert_like", "minilm"])
def test_quantized_exm_size_and_accuracy(tmp_path, request, name, bits):
    data, feeds = _source(name, request)
    fp32 = ort_run(data, feeds)
    m = eo.load(data)
    m.save(tmp_path / "f.exm")
    rep = m.save(tmp_path / "q.exm", quant_bits=bits)
    q = ex.load(str(tmp_path / "q.exm"))
    ops = collections.Counter(n.op_type for n in q.ir.graph.nodes if n.domain == "express")
    assert ops["QLinear"] >= 1 and ops["Linear"] == 0   # every Linear weight stays packed
    got = q.run(feeds)
    ratio = os.path.getsize(tmp_path / "q.exm") / os.path.getsize(tmp_path / "f.exm")
    worst = min(_cos(got[k], fp32[k]) for k in fp32)
    err = max(float(np.abs(got[k] - fp32[k]).max()) for k in fp32)
    RESULTS[name, bits] = (ratio, err, worst, rep["packed"], rep["quantized"] - rep["packed"])
    print(f"\n{name} int{bits}: size {ratio:.3f} of fp32 .exm, max abs diff {err:.4f}, cosine {worst:.6f}, "
          f"{rep['packed']} tensors packed, {rep['quantized'] - rep['packed']} expanded on load")
    assert worst > COS[name, bits], worst
    assert ratio < {8: 0.3, 4: 0.2}[bits] if name != "resnet18" else ratio < {8: 0.3, 4: 0.2}[bits]


def test_packed_weights_are_not_expanded_on_load(tmp_path, minilm):
    """Loading and running an int8 MiniLM keeps its weights packed: the loaded graph holds them as
    memory-mapped int8, and the process grows by far less than the fp32 weights would take."""
    data, feeds, _ = minilm
    m = eo.load(data)
    fp32_bytes = sum(a.nbytes for a in m.ir.graph.initializers.values() if a.dtype == np.float32)
    path = str(tmp_path / "q.exm")
    m.save(path, quant_bits=8)
    np.savez(tmp_path / "feeds.npz", **feeds)
    code = f"""
import sys; sys.modules["onnx"] = None
import numpy as np, psutil, express as ex
feeds = dict(np.load({str(tmp_path / 'feeds.npz')!r}))
proc = psutil.Process()
before = proc.memory_info().rss
m = ex.load({path!r})
m.run(feeds)
grown = proc.memory_info().rss - before
inits = m.ir.graph.initializers
packed = [a for k, a in inits.items() if k.endswith(".q")]
floats = sum(a.nbytes for a in inits.values() if a.dtype == np.float32)
assert packed and all(isinstance(a, np.memmap) and a.dtype == np.int8 for a in packed)
print(grown, floats, sum(a.nbytes for a in packed))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    grown, floats, packed = (int(v) for v in out.stdout.split())
    print(f"\nMiniLM int8: fp32 weights {fp32_bytes / 1e6:.1f} MB, packed {packed / 1e6:.1f} MB, float tensors "
          f"left {floats / 1e6:.2f} MB; load + run grew the process by {grown / 1e6:.1f} MB")
    assert floats < 0.05 * fp32_bytes
    assert grown < 0.5 * fp32_bytes
