"""The importer's API, its errors on bad input, a fuzz test, the .exm format and the CLI."""
import os
import subprocess
import sys

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
from onnx import TensorProto as TP, helper as h, numpy_helper as nh  # noqa: E402

import express as ex  # noqa: E402
import express.onnx as eo  # noqa: E402

from conftest import close, ort_run  # noqa: E402


def mlp_model(opset=17):
    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((16, 64)).astype(np.float32) * 0.2
    w2 = rng.standard_normal((64, 8)).astype(np.float32) * 0.2
    b1 = rng.standard_normal(64).astype(np.float32)
    nodes = [h.make_node("MatMul", ["x", "w1"], ["h"]), h.make_node("Add", ["h", "b1"], ["hb"]),
             h.make_node("Relu", ["hb"], ["r"]), h.make_node("MatMul", ["r", "w2"], ["y"]),
             h.make_node("Shape", ["x"], ["s"])]
    g = h.make_graph(nodes, "mlp", [h.make_tensor_value_info("x", TP.FLOAT, ["batch", 16])],
                     [h.make_tensor_value_info("y", TP.FLOAT, ["batch", 8]),
                      h.make_tensor_value_info("s", TP.INT64, [2])],
                     [nh.from_array(w1, "w1"), nh.from_array(w2, "w2"), nh.from_array(b1, "b1")])
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)])


def test_inputs_outputs_run_and_lazy_call():
    m = eo.load(mlp_model().SerializeToString())
    assert [(v.name, v.shape, v.dtype) for v in m.inputs] == [("x", ("batch", 16), ex.float32)]
    assert [v.name for v in m.outputs] == ["y", "s"]
    data = mlp_model().SerializeToString()
    for b in (1, 5):   # a dynamic batch runs at any size
        x = np.random.default_rng(b).standard_normal((b, 16)).astype(np.float32)
        got = m.run({"x": x})
        want = ort_run(data, {"x": x})
        close(got["y"], want["y"], 1e-5)
        np.testing.assert_array_equal(got["s"], [b, 16])
    y, s = m(ex.asarray(x))
    assert isinstance(y, ex.Tensor) and not y.is_evaluated
    close(y.numpy(), want["y"], 1e-5)
    assert list(m.run({"x": x}, output_names=["s"])) == ["s"]


def test_load_from_path_and_external_data(tmp_path):
    model = mlp_model()
    path = str(tmp_path / "m.onnx")
    onnx.save_model(model, path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="weights.bin", size_threshold=0)
    assert os.path.exists(tmp_path / "weights.bin")
    x = np.ones((2, 16), np.float32)
    close(eo.load(path).run({"x": x})["y"], ort_run(mlp_model().SerializeToString(), {"x": x})["y"], 1e-5)
    with pytest.raises(ex.ModelError, match="from its path"):
        eo.load(open(path, "rb").read())


@pytest.mark.parametrize("loc", ["../evil.bin", "/etc/passwd", "sub/../../x.bin"])
def test_external_data_outside_folder_is_refused(tmp_path, loc):
    model = mlp_model()
    t = model.graph.initializer[0]
    t.ClearField("float_data")
    t.raw_data = b""
    t.data_location = TP.EXTERNAL
    e = t.external_data.add()
    e.key, e.value = "location", loc
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ex.ModelError, match="model's folder"):
        eo.load(str(path))


def test_bad_files(tmp_path):
    data = mlp_model().SerializeToString()
    with pytest.raises(ex.ModelError, match="not a valid ONNX model"):
        eo.load(data[: len(data) // 2])          # truncated
    with pytest.raises(ex.ModelError):
        eo.load(b"\x08\x07hello, this is not a protobuf \xff\xff\xff")
    with pytest.raises(ex.ModelError, match="no such file"):
        eo.load(str(tmp_path / "missing.onnx"))
    with pytest.raises(ex.ModelError, match="no graph"):
        eo.load(onnx.ModelProto(ir_version=8).SerializeToString())


def test_unsupported_op_is_named():
    g = h.make_graph([h.make_node("Relu", ["x"], ["a"]), h.make_node("FancyOp", ["a"], ["y"], name="fancy_1")],
                     "g", [h.make_tensor_value_info("x", TP.FLOAT, [2])], [h.make_tensor_value_info("y", TP.FLOAT, [2])])
    with pytest.raises(ex.ModelError, match=r"unsupported ONNX op FancyOp in node 'fancy_1'"):
        eo.load(h.make_model(g).SerializeToString())


def test_bad_feeds():
    m = eo.load(mlp_model().SerializeToString())
    x = np.ones((2, 16), np.float32)
    with pytest.raises(ex.ExpressError, match="unknown input name"):
        m.run({"x": x, "z": x})
    with pytest.raises(ex.ExpressError, match="missing input"):
        m.run({})
    with pytest.raises(ex.ShapeError, match="expects shape"):
        m.run({"x": np.ones((2, 15), np.float32)})
    with pytest.raises(ex.ShapeError, match="rank"):
        m.run({"x": np.ones((16,), np.float32)})
    with pytest.raises(ex.DTypeError, match="expects float32"):
        m.run({"x": np.ones((2, 16), np.int64)})
    with pytest.raises(ex.ExpressError, match="unknown output"):
        m.run({"x": x}, output_names=["nope"])


def test_shape_mismatch_inside_graph_names_the_node():
    g = h.make_graph([h.make_node("Add", ["x", "y"], ["z"], name="adder")], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, ["a"]), h.make_tensor_value_info("y", TP.FLOAT, ["b"])],
                     [h.make_tensor_value_info("z", TP.FLOAT, None)])
    m = eo.load(h.make_model(g).SerializeToString())
    with pytest.raises(ex.ShapeError, match="adder"):
        m.run({"x": np.ones(3, np.float32), "y": np.ones(4, np.float32)})


def test_if_and_loop():
    then_g = h.make_graph([h.make_node("Neg", ["x"], ["t"])], "then", [], [h.make_tensor_value_info("t", TP.FLOAT, None)])
    else_g = h.make_graph([h.make_node("Exp", ["x"], ["e"])], "else", [], [h.make_tensor_value_info("e", TP.FLOAT, None)])
    body = h.make_graph([h.make_node("Add", ["acc_in", "x"], ["acc_out"]), h.make_node("Identity", ["c_in"], ["c_out"])],
                        "body", [h.make_tensor_value_info("i", TP.INT64, []), h.make_tensor_value_info("c_in", TP.BOOL, []),
                                 h.make_tensor_value_info("acc_in", TP.FLOAT, None)],
                        [h.make_tensor_value_info("c_out", TP.BOOL, []), h.make_tensor_value_info("acc_out", TP.FLOAT, None)])
    nodes = [h.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
             h.make_node("Loop", ["n", "", "x"], ["s"], body=body)]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, [3]), h.make_tensor_value_info("c", TP.BOOL, []),
                                  h.make_tensor_value_info("n", TP.INT64, [])],
                     [h.make_tensor_value_info("y", TP.FLOAT, [3]), h.make_tensor_value_info("s", TP.FLOAT, [3])])
    data = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()
    m = eo.load(data)
    x = np.array([0.5, -1.0, 2.0], np.float32)
    for c in (True, False):
        feeds = {"x": x, "c": np.array(c), "n": np.array(4, np.int64)}
        want, got = ort_run(data, feeds), m.run(feeds)
        close(got["y"], want["y"], 1e-6)
        close(got["s"], want["s"], 1e-6)


def test_fuzz_mutated_model_bytes():
    """Mutated model bytes never crash: each either runs or raises an ExpressError."""
    hyp = pytest.importorskip("hypothesis")
    from hypothesis import HealthCheck, given, settings, strategies as st
    data = mlp_model().SerializeToString()
    x = np.ones((1, 16), np.float32)

    @settings(max_examples=int(os.environ.get("EXPRESS_FUZZ_EXAMPLES", 400)), deadline=None, suppress_health_check=list(HealthCheck), database=None)
    @given(st.lists(st.tuples(st.integers(0, len(data) - 1), st.integers(0, 255)), min_size=1, max_size=8),
           st.integers(0, len(data)))
    def fuzz(edits, cut):
        b = bytearray(data[:max(cut, 1)] if cut % 3 == 0 else data)
        for i, v in edits:
            if i < len(b):
                b[i] = v
        try:
            m = eo.load(bytes(b))
            m.run({v.name: np.ones([d if isinstance(d, int) and d > 0 else 1 for d in (v.shape or [])],
                                   v.dtype.np if v.dtype else np.float32) for v in m.inputs})
        except ex.ExpressError:
            pass
    assert hyp
    fuzz()


# ---- .exm ----
@pytest.mark.parametrize("bits", [None, 8, 4])
def test_exm_roundtrip_and_quantization(tmp_path, bits):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((256, 128)).astype(np.float32) * 0.1
    b = rng.standard_normal(128).astype(np.float32)
    g = h.make_graph([h.make_node("Gemm", ["x", "w", "b"], ["y"])], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, ["n", 256])],
                     [h.make_tensor_value_info("y", TP.FLOAT, ["n", 128])], [nh.from_array(w, "w"), nh.from_array(b, "b")])
    data = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()
    m = eo.load(data)
    path = str(tmp_path / "m.exm")
    rep = m.save(path, quant_bits=bits)
    full = w.nbytes + b.nbytes
    size = os.path.getsize(path)
    if bits is None:
        assert size < full + 4096
    else:
        assert rep["quantized"] == 1
        assert size <= full * (0.5 if bits == 8 else 0.25)       # 50% / 75% smaller
    m2 = ex.load(path)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    want = x @ w + b
    got = m2.run({"x": x})["y"]
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < {None: 1e-6, 8: 0.02, 4: 0.15}[bits], err
    assert [v.name for v in m2.inputs] == ["x"]


def test_exm_loads_without_onnx_and_mmaps(tmp_path):
    path = str(tmp_path / "m.exm")
    eo.load(mlp_model().SerializeToString()).save(path)
    code = ("import sys; sys.modules['onnx'] = None\n"
            "import numpy as np, express as ex\n"
            f"m = ex.load({path!r})\n"
            "w = m.ir.graph.initializers['w1']\n"
            "assert isinstance(w, np.memmap), type(w)\n"
            "print(m.run({'x': np.ones((2, 16), np.float32)})['y'].shape)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "(2, 8)" in out.stdout


def test_exm_bad_files(tmp_path):
    path = tmp_path / "m.exm"
    eo.load(mlp_model().SerializeToString()).save(str(path))
    data = path.read_bytes()
    for bad in (data[:4], data[: len(data) - 100], b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ", data[:8] + b"x" * 50):
        p = tmp_path / "bad.exm"
        p.write_bytes(bad)
        with pytest.raises(ex.ModelError):
            ex.load(str(p))
    with pytest.raises(ex.ModelError):
        eo.load(mlp_model().SerializeToString()).save(str(tmp_path / "q.exm"), quant_bits=3)


def test_cli_convert_run_bench(tmp_path):
    src, dst = str(tmp_path / "m.onnx"), str(tmp_path / "m.exm")
    onnx.save_model(mlp_model(), src)
    x = np.random.default_rng(0).standard_normal((2, 16)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    env = dict(os.environ)

    def cli(*a):
        r = subprocess.run([sys.executable, "-m", "express", *a], capture_output=True, text=True, env=env)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout
    assert "m.exm" in cli("convert", src, dst, "--quant-bits", "8")
    out_dir = str(tmp_path / "out")
    assert "y: shape (2, 8)" in cli("run", dst, "--input", f"x={tmp_path / 'x.npy'}", "--output-dir", out_dir)
    y = np.load(os.path.join(out_dir, "y.npy"))
    close(y, ort_run(mlp_model().SerializeToString(), {"x": x})["y"], 0.02)
    assert "median" in cli("bench", dst, "--iters", "2", "--warmup", "0")


def test_batchnorm_folds_into_conv():
    rng = np.random.default_rng(0)
    inits = {"w": rng.standard_normal((8, 3, 3, 3)).astype(np.float32), "cb": rng.standard_normal(8).astype(np.float32),
             "s": rng.uniform(0.5, 1.5, 8).astype(np.float32), "bb": rng.standard_normal(8).astype(np.float32),
             "m": rng.standard_normal(8).astype(np.float32) * 0.3, "v": rng.uniform(0.5, 2, 8).astype(np.float32)}
    nodes = [h.make_node("Conv", ["x", "w", "cb"], ["c"], pads=[1, 1, 1, 1]),
             h.make_node("BatchNormalization", ["c", "s", "bb", "m", "v"], ["n"], epsilon=1e-3),
             h.make_node("Relu", ["n"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, ["b", 3, 6, 6])],
                     [h.make_tensor_value_info("y", TP.FLOAT, None)], [nh.from_array(a, k) for k, a in inits.items()])
    data = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()
    opt = eo.load(data)
    assert [n.op_type for n in opt.ir.graph.nodes] == ["Conv", "Relu"]
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    close(opt.run({"x": x})["y"], ort_run(data, {"x": x})["y"], 1e-5)


def test_linear_fusion_and_constant_folding():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    nodes = [h.make_node("Constant", [], ["b"], value=nh.from_array(np.arange(4, dtype=np.float32))),
             h.make_node("Mul", ["b", "b"], ["b2"]),
             h.make_node("MatMul", ["x", "w"], ["h"]), h.make_node("Add", ["h", "b2"], ["a"]),
             h.make_node("Relu", ["a"], ["y"])]
    g = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", TP.FLOAT, ["n", 8])],
                     [h.make_tensor_value_info("y", TP.FLOAT, ["n", 4])], [nh.from_array(w, "w")])
    data = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()
    m = eo.load(data)
    assert [(n.domain, n.op_type, n.attrs) for n in m.ir.graph.nodes] == [("express", "Linear", {"activation": "Relu", "wt": 1})]
    x = rng.standard_normal((3, 8)).astype(np.float32)
    close(m.run({"x": x})["y"], np.maximum(x @ w + np.arange(4) ** 2, 0), 1e-5)


def test_run_reuses_the_compiled_plan_per_input_signature(monkeypatch):
    data = mlp_model().SerializeToString()
    m = eo.load(data)
    builds = []
    build = m._build
    monkeypatch.setattr(m, "_build", lambda *a, **k: builds.append(1) or build(*a, **k))
    rng = np.random.default_rng(0)
    for b in (2, 2, 2, 5, 5, 2):
        x = rng.standard_normal((b, 16)).astype(np.float32)
        got = m.run({"x": x})
        close(got["y"], ort_run(data, {"x": x})["y"], 1e-5)
        np.testing.assert_array_equal(got["s"], [b, 16])
    assert len(builds) == 2 and len(m._plans) == 2      # traced once per batch size, replayed after
    m.run({"x": x}, output_names=["y"])                 # other outputs asked for: another signature
    assert len(builds) == 3 and len(m._plans) == 3


def test_run_of_a_value_dependent_graph_is_rebuilt_each_time():
    """TopK's k comes from an input: the graph cannot be traced once, and each run builds it."""
    g = h.make_graph([h.make_node("TopK", ["x", "k"], ["v", "i"])], "g",
                     [h.make_tensor_value_info("x", TP.FLOAT, [6]), h.make_tensor_value_info("k", TP.INT64, [1])],
                     [h.make_tensor_value_info("v", TP.FLOAT, None), h.make_tensor_value_info("i", TP.INT64, None)])
    data = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString()
    m = eo.load(data)
    x = np.array([3, 1, 4, 1, 5, 9], np.float32)
    for k in (2, 3, 2):
        feeds = {"x": x, "k": np.array([k], np.int64)}
        close(m.run(feeds)["v"], ort_run(data, feeds)["v"], 0)
    assert list(m._plans.values()) == [None]
