"""Graph passes on import: written-out LayerNorm, GELU and attention are found in exported models
and become the fused nodes, and the outputs still match onnxruntime."""
import collections
import math

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
from onnx import TensorProto as TP, helper as h, numpy_helper as nh  # noqa: E402

import express.onnx as eo  # noqa: E402

import models  # noqa: E402
from conftest import close, ort_run  # noqa: E402


def fused(m):
    """Counts of the fused forms in an imported graph (GELU also when folded into a Linear)."""
    c = collections.Counter()
    for n in m.ir.graph.nodes:
        c[f"{n.domain}:{n.op_type}" if n.domain else n.op_type] += 1
        if n.op_type == "Linear" and n.attrs.get("activation") in ("Gelu", "GeluTanh"):
            c["Gelu"] += 1
    return c


def check(data, feeds_list, tol=1e-4):
    m = eo.load(data)
    for feeds in feeds_list:
        want, got = ort_run(data, feeds), m.run(feeds)
        for k in want:
            close(got[k], want[k], tol)
    return m


@pytest.mark.parametrize("name, layers", [("bert_like", 2), ("gpt2_like", 2)])
def test_patterns_found_in_exported_models(name, layers):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    data, feeds = getattr(models, name)(opset=14)   # opset 14: LayerNorm is exported written out
    raw = fused(eo.load(data, optimize=False))
    assert raw["LayerNormalization"] == raw["Gelu"] == raw["express:Attention"] == 0
    assert raw["ReduceMean"] == 2 * (2 * layers + 1) and raw["Softmax"] == layers
    c = fused(check(data, feeds))
    assert c["LayerNormalization"] == 2 * layers + 1
    assert c["Gelu"] == layers and c["express:Attention"] == layers
    assert c["ReduceMean"] == c["Softmax"] == c["Erf"] == c["Tanh"] == c["Pow"] == 0


def test_patterns_found_in_real_minilm(minilm):
    data, feeds, ref = minilm
    c = fused(check(data, [feeds]))
    assert (c["LayerNormalization"], c["Gelu"], c["express:Attention"]) == (13, 6, 6)
    assert c["ReduceMean"] == c["Softmax"] == c["Erf"] == 0
    close(eo.load(data).run(feeds)["last_hidden_state"], ref, 1e-4)


def test_native_layernorm_and_sdpa_export_forms():
    """Opset 17 keeps LayerNormalization; the attention of transformers' SDPA export (Q and K^T each
    scaled by sqrt(scale), IsNaN guard after Softmax) is fused too."""
    pytest.importorskip("transformers")
    data, feeds = models.bert_like(opset=17)
    c = fused(check(data, feeds))
    assert c["express:Attention"] == 2 and c["Softmax"] == 0 and c["IsNaN"] == 0


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info(n, TP.FLOAT, s) for n, s in inputs],
                     [h.make_tensor_value_info(n, TP.FLOAT, None) for n in outputs],
                     [nh.from_array(np.asarray(a, np.float32), k) for k, a in inits])
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)]).SerializeToString()


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("variant", ["div", "mul_half_first", "half_last"])
def test_gelu_erf_variants(variant):
    c = [("sqrt2", math.sqrt(2)), ("isqrt2", math.sqrt(0.5)), ("one", 1.0), ("half", 0.5)]
    pre = [h.make_node("Div", ["x", "sqrt2"], ["a"])] if variant == "div" else \
        [h.make_node("Mul", ["isqrt2", "x"], ["a"])]
    core = [h.make_node("Erf", ["a"], ["e"]), h.make_node("Add", ["one", "e"], ["p"])]
    tail = {"div": [h.make_node("Mul", ["x", "p"], ["m"]), h.make_node("Mul", ["m", "half"], ["y"])],
            "mul_half_first": [h.make_node("Mul", ["x", "half"], ["m"]), h.make_node("Mul", ["m", "p"], ["y"])],
            "half_last": [h.make_node("Mul", ["p", "half"], ["m"]), h.make_node("Mul", ["x", "m"], ["y"])]}[variant]
    data = _model(pre + core + tail, [("x", ["n", 8])], ["y"], c)
    m = check(data, [{"x": _rand(3, 8) * 3}], 1e-5)
    assert [(n.op_type, n.attrs) for n in m.ir.graph.nodes] == [("Gelu", {"approximate": "none"})]


def test_gelu_tanh_with_pow():
    c = [("three", 3.0), ("k", 0.044715), ("s", math.sqrt(2 / math.pi)), ("one", 1.0), ("half", 0.5)]
    nodes = [h.make_node("Pow", ["x", "three"], ["c"]), h.make_node("Mul", ["c", "k"], ["ck"]),
             h.make_node("Add", ["x", "ck"], ["u"]), h.make_node("Mul", ["u", "s"], ["us"]),
             h.make_node("Tanh", ["us"], ["t"]), h.make_node("Add", ["t", "one"], ["p"]),
             h.make_node("Mul", ["x", "p"], ["m"]), h.make_node("Mul", ["m", "half"], ["y"])]
    m = check(_model(nodes, [("x", ["n", 8])], ["y"], c), [{"x": _rand(3, 8) * 3}], 1e-5)
    assert [(n.op_type, n.attrs) for n in m.ir.graph.nodes] == [("Gelu", {"approximate": "tanh"})]


def _layernorm_nodes(x, out, square="Pow"):
    sq = h.make_node("Pow", ["d", "two"], ["sq"]) if square == "Pow" else h.make_node("Mul", ["d", "d"], ["sq"])
    return [h.make_node("ReduceMean", [x], ["mu"], axes=[-1]), h.make_node("Sub", [x, "mu"], ["d"]), sq,
            h.make_node("ReduceMean", ["sq"], ["var"], axes=[-1]), h.make_node("Add", ["var", "eps"], ["ve"]),
            h.make_node("Sqrt", ["ve"], ["sd"]), h.make_node("Div", ["d", "sd"], ["nrm"]),
            h.make_node("Mul", ["nrm", "gamma"], ["sc"]), h.make_node("Add", ["sc", "beta"], [out])]


@pytest.mark.parametrize("square", ["Pow", "Mul"])
def test_layernorm_written_out(square):
    inits = [("two", 2.0), ("eps", 1e-5), ("gamma", _rand(16, seed=1)), ("beta", _rand(16, seed=2))]
    m = check(_model(_layernorm_nodes("x", "y", square), [("x", ["n", 5, 16])], ["y"], inits, opset=13),
              [{"x": _rand(2, 5, 16) * 4 + 1}], 1e-5)
    assert [n.op_type for n in m.ir.graph.nodes] == ["LayerNormalization"]


def test_layernorm_not_fused_when_an_inner_value_is_an_output():
    inits = [("two", 2.0), ("eps", 1e-5), ("gamma", _rand(16, seed=1)), ("beta", _rand(16, seed=2))]
    data = _model(_layernorm_nodes("x", "y"), [("x", ["n", 16])], ["y", "var"], inits, opset=13)
    m = check(data, [{"x": _rand(3, 16)}], 1e-5)
    assert "LayerNormalization" not in [n.op_type for n in m.ir.graph.nodes]


def _attention(mask="add", scale_on="scores", rank=4, softmax_axis=-1):
    """Q @ K^T, scaled, masked, softmax, @ V, with the K transpose written as a Transpose node."""
    perm = [0, 1, 3, 2] if rank == 4 else [0, 2, 1]
    nodes = [h.make_node("Transpose", ["k"], ["kt"], perm=perm)]
    if scale_on == "scores":
        nodes += [h.make_node("MatMul", ["q", "kt"], ["s0"]), h.make_node("Div", ["s0", "sqrt_d"], ["s"])]
    else:
        nodes += [h.make_node("Mul", ["q", "r"], ["qs"]), h.make_node("Mul", ["kt", "r"], ["kts"]),
                  h.make_node("MatMul", ["qs", "kts"], ["s"])]
    if mask == "add":
        nodes.append(h.make_node("Add", ["s", "mask"], ["sm"]))
    elif mask == "where":
        nodes += [h.make_node("Less", ["mask", "zero"], ["cond"]),
                  h.make_node("Where", ["cond", "ninf", "s"], ["sm"])]
    nodes += [h.make_node("Softmax", ["sm" if mask else "s"], ["p"], axis=softmax_axis),
              h.make_node("MatMul", ["p", "v"], ["y"])]
    lead = ["b", 2] if rank == 4 else ["bh"]
    inputs = [("q", lead + ["L", 8]), ("k", lead + ["S", 8]), ("v", lead + ["S", 6])]
    if mask:
        inputs.append(("mask", ["L", "S"]))
    inits = [("sqrt_d", math.sqrt(8)), ("r", 8 ** -0.25), ("zero", 0.0), ("ninf", -np.inf)]
    return _model(nodes, inputs, ["y"], inits)


@pytest.mark.parametrize("mask, scale_on, rank", [("add", "scores", 4), ("where", "scores", 4),
                                                  (None, "qk", 4), ("add", "qk", 3)])
def test_attention_forms(mask, scale_on, rank):
    lead = (2, 2) if rank == 4 else (4,)
    feeds = {"q": _rand(*lead, 5, 8, seed=1), "k": _rand(*lead, 7, 8, seed=2), "v": _rand(*lead, 7, 6, seed=3)}
    if mask:
        mk = _rand(5, 7, seed=4)
        mk[:, 0] = 1.0    # every row keeps one key
        feeds["mask"] = mk
    c = fused(check(_attention(mask, scale_on, rank), [feeds], 1e-5))
    assert c["express:Attention"] == 1 and c["Softmax"] == c["MatMul"] == c["Where"] == c["Add"] == 0


def test_attention_softmax_not_over_keys_falls_back():
    """The fused node checks its shapes when it runs: softmax over the query axis is written out."""
    feeds = {"q": _rand(2, 2, 5, 8, seed=1), "k": _rand(2, 2, 5, 8, seed=2), "v": _rand(2, 2, 5, 6, seed=3),
             "mask": _rand(5, 5, seed=4)}
    m = check(_attention("add", softmax_axis=2), [feeds], 1e-5)
    assert fused(m)["express:Attention"] == 1


@pytest.mark.parametrize("trans_b, c_shape", [(1, (1, 6)), (0, (6,)), (0, None)])
def test_gemm_with_constant_weight_becomes_linear(trans_b, c_shape):
    w = _rand(6, 8, seed=1) if trans_b else _rand(8, 6, seed=1)
    inits = [("w", w)] + ([("c", _rand(*c_shape, seed=2))] if c_shape else [])
    node = h.make_node("Gemm", ["x", "w"] + (["c"] if c_shape else []), ["g"], alpha=0.5, beta=2.0, transB=trans_b)
    data = _model([node, h.make_node("Relu", ["g"], ["y"])], [("x", ["n", 8])], ["y"], inits)
    m = check(data, [{"x": _rand(3, 8)}], 1e-5)
    assert [(n.op_type, n.attrs) for n in m.ir.graph.nodes] == [("Linear", {"activation": "Relu", "wt": 1})]


def test_matmul_bias_gelu_tanh_becomes_one_linear():
    nodes = [h.make_node("MatMul", ["x", "w"], ["a"]), h.make_node("Add", ["b", "a"], ["ab"]),
             h.make_node("Gelu", ["ab"], ["y"], approximate="tanh")]
    data = _model(nodes, [("x", ["n", 4, 8])], ["y"], [("w", _rand(8, 6, seed=1)), ("b", _rand(6, seed=2))], opset=20)
    m = check(data, [{"x": _rand(2, 4, 8)}], 1e-5)
    assert [(n.op_type, n.attrs) for n in m.ir.graph.nodes] == [("Linear", {"activation": "GeluTanh", "wt": 1})]
