"""The expression layer: laziness, eval, compile, planning and memory, errors, interop."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import express as ex
from express.plan import Plan


def test_lazy_until_needed():
    before = ex.memory_stats()["current"]
    y = ex.ones((4096, 4096)) * 3 + 1  # 64 MB if it ran
    assert not y.is_evaluated and "lazy" in repr(y)
    assert ex.memory_stats()["current"] == before
    assert float(y[1, 2]) == 4.0 and y.is_evaluated is False  # indexing evaluates only the view's base
    s = ex.sum(ex.ones((3, 3)))
    assert "lazy: sum" in repr(s)
    assert float(s) == 9.0 and "9" in repr(s) and float(str(s)) == 9.0


def test_eval_shares_subgraphs():
    a = ex.arange(5).astype(ex.float32)
    b = ex.exp(a)
    c, d = b + 1, b * 2
    plan = Plan([c, d])
    assert plan.n_steps == 3  # exp once, then the two consumers
    ex.eval(c, d)
    np.testing.assert_allclose(c.numpy(), np.exp(np.arange(5, dtype=np.float32)) + 1, rtol=1e-6)
    np.testing.assert_allclose(d.numpy(), np.exp(np.arange(5, dtype=np.float32)) * 2, rtol=1e-6)


def test_cse_merges_equal_nodes():
    x = ex.asarray(np.ones(3, np.float32))
    y = ex.sum(x * 2) + ex.sum(x * 2)  # the two halves are the same computation
    assert Plan([y]).n_steps == 3
    assert float(y) == 12.0


def test_fusion_makes_one_step():
    x = ex.asarray(np.linspace(0, 1, 1000, dtype=np.float32))
    y = x
    for _ in range(50):
        y = ex.tanh(y) * 1.01 + 0.001
    assert Plan([y]).n_steps == 1
    want = np.linspace(0, 1, 1000, dtype=np.float32)
    for _ in range(50):
        want = np.tanh(want) * np.float32(1.01) + np.float32(0.001)
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-5)


def test_buffers_reused_in_unfusable_chain():
    x = ex.asarray(np.ones((256, 256), np.float32) / 256)
    y = x
    for _ in range(20):
        y = ex.exp(y @ x)  # matmul breaks fusion: 40 steps, 39 intermediates of 256 KB
    plan = Plan([y])
    assert plan.n_steps == 40
    assert plan.arena_bytes <= 3 * 256 * 256 * 4  # not 39 buffers: freed ones are reused
    ref = np.ones((256, 256), np.float32) / 256
    want = ref
    for _ in range(20):
        want = np.exp(want @ ref)
    np.testing.assert_allclose(plan.run()[0], want, rtol=1e-4)


def test_peak_memory_of_long_chain():
    """100 elementwise ops over a 64 MB tensor: peak memory stays under 3x the tensor."""
    code = textwrap.dedent("""
        import resource, numpy as np, express as ex
        x = np.ones((4096, 4096), np.float32)          # 64 MB
        ex.zeros((4,)).numpy()                        # warm up the library
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - x.nbytes
        ex.reset_peak_memory()
        y = ex.asarray(x)
        for i in range(100):
            y = (y * 1.0001 + 0.5) if i % 2 else ex.sqrt(ex.abs(y))
        out = y.numpy()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
        print(peak / x.nbytes, ex.memory_stats()["peak"] / x.nbytes, float(out[0, 0]))
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    rss_ratio, engine_ratio, v = map(float, r.stdout.split())
    assert rss_ratio < 3.0, r.stdout
    assert engine_ratio <= 1.01  # the engine held only the output
    want = np.float32(1.0)
    for i in range(100):
        want = (want * np.float32(1.0001) + np.float32(0.5)) if i % 2 else np.sqrt(np.abs(want))
    assert abs(v - want) < 1e-3 * abs(want)


def test_compile_replays_and_folds_constants():
    w = ex.random.normal((8, 8), seed=0)
    calls = []

    def f(x, scale):
        calls.append(1)
        return ex.tanh(x @ (w @ w.T)) * scale + ex.ones((8,)).sum()

    g = ex.compile(f)
    for i in range(3):
        xn = np.random.default_rng(i).standard_normal((4, 8)).astype(np.float32)
        got = g(xn, 2.0)
        wn = w.numpy()
        np.testing.assert_allclose(got.numpy(), np.tanh(xn @ (wn @ wn.T)) * 2 + 8, rtol=1e-4, atol=1e-5)
    assert len(calls) == 1  # traced once
    (c,) = g.cache.values()
    assert c.plan.n_steps == 2  # w @ w.T and the sum were folded: matmul + one fused group
    g(np.zeros((5, 8), np.float32), 2.0)
    assert len(calls) == 2 and len(g.cache) == 2  # a new shape traces again
    out = g(np.zeros((4, 8), np.float32), 2.0)
    assert out.numpy().shape == (4, 8) and got.numpy()[0, 0] != out.numpy()[0, 0]  # results are not shared


def test_compile_prepare_runs_in_place():
    """prepare() gives the traced plan of a signature: a loop writes its input buffers and reads
    its output buffers, which the next run overwrites."""
    calls = []

    def f(x, k):
        calls.append(1)
        return ex.exp(x) * k, ex.sum(x)

    g = ex.compile(f)
    step = g.prepare(np.zeros((2, 3), np.float32), 3.0)
    assert step is g.prepare(np.ones((2, 3), np.float32), 3.0) and len(calls) == 1  # one trace a signature
    assert g.prepare(np.zeros((2, 3), np.float32), 4.0) is not step  # a static value is part of it
    (x,) = step.input_arrays
    outs = []
    for i in range(2):
        xn = np.random.default_rng(i).standard_normal((2, 3)).astype(np.float32)
        x[...] = xn
        a, s = step.run()
        np.testing.assert_allclose(a, np.exp(xn) * 3, rtol=1e-6)
        np.testing.assert_allclose(s, xn.sum(), rtol=1e-5)
        outs.append(a)
    assert outs[0] is outs[1]  # the plan's own buffer
    np.testing.assert_allclose(g(xn, 3.0)[0].numpy(), np.exp(xn) * 3, rtol=1e-6)  # a call still copies
    assert len(calls) == 2

def test_compile_outputs_and_errors():
    h = ex.compile(lambda x: {"a": x + 1, "b": (x.T, ex.sum(x))})
    with pytest.raises(ex.ExpressError, match="Tensor"):
        h(np.ones((2, 2), np.float32))
    k = ex.compile(lambda x: (x * 2, x.T))
    a, b = k(np.arange(4, dtype=np.float32).reshape(2, 2))
    np.testing.assert_array_equal(b.numpy(), np.arange(4).reshape(2, 2).T)
    bad = ex.compile(lambda x: x * 2 if float(x.sum()) > 0 else x)
    with pytest.raises(ex.ExpressError, match="traced input"):
        bad(np.ones(3, np.float32))


def test_errors_name_op_and_shapes():
    a, b = ex.ones((2, 3)), ex.ones((4, 3))
    with pytest.raises(ex.ShapeError, match=r"add: shapes \(2, 3\), \(4, 3\) do not broadcast"):
        a + b
    with pytest.raises(ex.ShapeError, match=r"matmul: shapes \(2, 3\) and \(4, 3\)"):
        a @ b
    with pytest.raises(ex.ShapeError, match="reshape"):
        a.reshape(4, 2)
    with pytest.raises(ex.AxisError, match="sum: axis 2 is out of range"):
        ex.sum(a, axis=2)
    with pytest.raises(ex.OutOfRangeError, match="index 5 is out of range for axis 1 of size 3"):
        a[0, 5]
    with pytest.raises(ex.OutOfRangeError, match="take"):
        ex.take(a, [7], axis=0)
    with pytest.raises(ex.OutOfRangeError, match="take: index 9"):  # lazy indices: checked by the kernel
        ex.take(a, ex.asarray(np.array([9])) + 0, axis=1).numpy()
    with pytest.raises(ex.DTypeError, match="not supported"):
        ex.asarray(np.ones(2, np.complex64))
    with pytest.raises(ex.DTypeError, match="subtract: not defined for bool"):
        ex.asarray(np.ones(2, bool)) - ex.asarray(np.ones(2, bool))
    with pytest.raises(ex.ShapeError, match="max: zero-size"):
        ex.max(ex.zeros((0, 3)), axis=0)
    with pytest.raises(ex.ShapeError, match="concat"):
        ex.concat([a, ex.ones((2, 2))], axis=0)
    with pytest.raises(ex.ExpressError):
        ex.set_num_threads(0)
    assert issubclass(ex.ShapeError, ValueError) and issubclass(ex.OutOfRangeError, IndexError)


def test_numpy_interop():
    x = ex.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert isinstance(np.asarray(x), np.ndarray)
    assert np.asarray(x, dtype=np.float64).dtype == np.float64
    assert isinstance(np.arange(3) + ex.ones((3,)), ex.Tensor)
    assert x.ndim == 2 and x.size == 6 and len(x) == 2 and x.T.shape == (3, 2)
    assert [r.tolist() for r in x] == [[0, 1, 2], [3, 4, 5]]
    assert int(x[1, 1]) == 4 and bool(x[0, 1]) and x[1].tolist() == [3, 4, 5]
    assert x._repr_html_().startswith("<div>")


def test_threads_and_isa(isa):
    ex.set_num_threads(2)
    assert ex.get_num_threads() == 2
    a = np.random.default_rng(0).standard_normal((300, 200)).astype(np.float32)
    np.testing.assert_allclose((ex.asarray(a) @ a.T).numpy(), a @ a.T, rtol=1e-4, atol=1e-4)
    ex.set_num_threads(1)
    np.testing.assert_allclose((ex.asarray(a) @ a.T).numpy(), a @ a.T, rtol=1e-4, atol=1e-4)
    ex.set_num_threads(os.cpu_count() or 1)
    with pytest.raises(ex.ExpressError, match="set_isa"):
        ex.set_isa("sse9")


def test_fallback_forced_by_env():
    r = subprocess.run([sys.executable, "-c", "import express as ex; print(ex.isa())"],
                       env={**os.environ, "EXPRESS_ISA": "generic"}, capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "generic"


def test_save_load(tmp_path):
    t = {"w": ex.random.normal((3, 4), seed=1), "i": ex.arange(5), "h": ex.ones((2,), ex.float16)}
    ex.save(tmp_path / "w.safetensors", t)
    back = ex.load(tmp_path / "w.safetensors")
    for k in t:
        np.testing.assert_array_equal(back[k].numpy(), t[k].numpy())
    (tmp_path / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(ex.ModelError, match="bad.safetensors"):
        ex.load(tmp_path / "bad.safetensors")
    with pytest.raises(ex.ModelError, match="no such file"):
        ex.load(tmp_path / "missing.safetensors")


def test_read_safetensors_resident_tensors_match_the_mapped_ones(tmp_path):
    """Tensors read into huge pages (the decode weights) equal the mapped ones, byte for byte, in
    buffers of their own; a file cut short is an error naming it, not a short read."""
    from safetensors.numpy import save_file

    from express.io import hugepage_buffer, read_safetensors
    rng = np.random.default_rng(0)
    arrays = {"a.qweight": rng.integers(0, 255, (700, 3001), dtype=np.uint8),  # over 2 MB
              "a.scales": rng.standard_normal((7, 3)).astype(np.float16),
              "b": rng.standard_normal(5).astype(np.float32), "c.qweight": np.zeros((0, 4), np.uint8)}
    save_file(arrays, str(tmp_path / "m.safetensors"))
    mapped = read_safetensors(tmp_path / "m.safetensors")
    read = read_safetensors(tmp_path / "m.safetensors", resident=lambda k: k.endswith((".qweight", ".scales")))
    for k, a in arrays.items():
        assert read[k].dtype == a.dtype and read[k].shape == a.shape
        np.testing.assert_array_equal(read[k], a)
        np.testing.assert_array_equal(mapped[k], a)
    assert not np.shares_memory(read["a.qweight"], mapped["a.qweight"]) and not read["a.qweight"].flags.writeable
    assert read["a.qweight"].ctypes.data % 64 == 0 and read["a.scales"].ctypes.data % 64 == 0
    data = (tmp_path / "m.safetensors").read_bytes()
    (tmp_path / "cut.safetensors").write_bytes(data[:len(data) - 100])
    with pytest.raises(ex.ModelError, match="cut.safetensors"):
        read_safetensors(tmp_path / "cut.safetensors", resident=lambda k: True)
    for n in (0, 5, 3 << 20):
        b = hugepage_buffer(n)
        assert b.dtype == np.uint8 and b.nbytes == n and b.ctypes.data % 64 == 0 and not b.any()


def test_packed_buffers_share_huge_page_chunks():
    """Small packed-weight buffers are carved side by side from shared chunks, zeroed, aligned and
    apart; a buffer of 2 MB or more has pages of its own."""
    from express.io import packed_buffer
    bufs = [packed_buffer(n) for n in (1, 100, 64, 1 << 20, 5)]
    for b, n in zip(bufs, (1, 100, 64, 1 << 20, 5)):
        assert b.dtype == np.uint8 and b.nbytes == n and b.ctypes.data % 64 == 0 and not b.any()
    spans = sorted((b.ctypes.data, b.ctypes.data + b.nbytes) for b in bufs)
    assert all(e <= s for (_, e), (s, _) in zip(spans, spans[1:]))  # no overlap
    chunks = [b.base for b in bufs[:3]]  # shared: at most one chunk ends among these three
    assert any(a is not None and a is b for a, b in zip(chunks, chunks[1:]))
    for i, b in enumerate(bufs):
        b[:] = i + 1
    assert [int(b[0]) for b in bufs] == [1, 2, 3, 4, 5]
    big = packed_buffer(3 << 20)
    assert big.nbytes == 3 << 20 and big.base is not bufs[0].base and big.ctypes.data % (2 << 20) == 0


def test_slice_update_in_place_and_compiled():
    cache = ex.zeros((2, 6, 3))
    ex.eval(cache)
    ref = np.zeros((2, 6, 3), np.float32)
    step = ex.compile(lambda new, pos: ex.sum(ex.slice_update(cache, new, pos, axis=1), axis=(0, 2)))
    for pos in range(6):
        new = np.full((2, 1, 3), pos + 1, np.float32)
        ref[:, pos:pos + 1] = new
        np.testing.assert_array_equal(step(new, np.array(pos)).numpy(), ref.sum(axis=(0, 2)))
    np.testing.assert_array_equal(cache.numpy(), ref)  # written in place, no copy per step
    assert len(step.cache) == 1
    with pytest.raises(ex.OutOfRangeError, match="start 6"):
        step(np.ones((2, 1, 3), np.float32), np.array(6))
    with pytest.raises(ex.OutOfRangeError):
        ex.slice_update(cache, ex.ones((2, 2, 3)), 5, axis=1)
    with pytest.raises(ex.ExpressError, match="evaluated"):
        ex.slice_update(ex.zeros((3,)) + 1, ex.ones((1,)), 0)


def test_kernels_run_back_to_back_in_c():
    """A plan's consecutive kernels run as one ex_run_calls; a kernel that fails inside the run
    raises its own op's error, and the compiled step still works afterwards."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((48, 48)).astype(np.float32)
    from express.nn.functional import softmax
    step = ex.compile(lambda x, i: ex.sum(ex.take(softmax(x @ x, axis=-1), i + 1, axis=0), axis=1))
    i = np.array([0, 5, 2])
    e = np.exp((a @ a) - (a @ a).max(-1, keepdims=True))
    np.testing.assert_allclose(step(a, i).numpy(), (e / e.sum(-1, keepdims=True))[i + 1].sum(1), rtol=1e-5)
    (c,) = step.cache.values()
    assert [type(s).__name__ for s in c.plan.steps] == ["Calls"] and len(c.plan.steps[0].calls) == len(c.plan.thunks)
    with pytest.raises(ex.OutOfRangeError, match="take: index 48 is out of range"):
        step(a, np.array([0, 47]))
    np.testing.assert_allclose(step(a, i).numpy(), (e / e.sum(-1, keepdims=True))[i + 1].sum(1), rtol=1e-5)


def test_call_table_matches_the_kernels():
    """ex_run_calls' argument structs (written by cext/build.py from express.h) have each
    kernel's parameter types in order, and the kinds number them all."""
    from express._lib import ffi, lib
    kinds = {n[8:].lower(): getattr(lib, n) for n in dir(lib) if n.startswith("EX_CALL_") and n != "EX_CALL_COUNT"}
    assert sorted(kinds.values()) == list(range(lib.EX_CALL_COUNT)) and {"conv2d", "qgemm_multi"} <= set(kinds)
    for name in kinds:
        assert [f.type for _, f in ffi.typeof(f"ex_args_{name}").fields] == list(ffi.typeof(getattr(lib, "ex_" + name)).args)
    failed = ffi.new("int64_t *")
    calls = ffi.new("ex_call[]", [(lib.EX_CALL_COUNT, ffi.NULL)])
    assert lib.ex_run_calls(calls, 1, failed) == lib.EX_EINVAL and failed[0] == 0


def test_compile_edge_cases():
    np.testing.assert_array_equal(ex.compile(lambda x, y: x * 2)(ex.ones((3,)), ex.ones((2,))).numpy(), [2, 2, 2])
    np.testing.assert_array_equal(ex.compile(lambda x: x)(np.arange(3, dtype=np.float32)).numpy(), [0, 1, 2])
    a, b = ex.compile(lambda x: (x, x.T))(np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(b.numpy(), np.arange(6).reshape(2, 3).T)


def test_compile_folds_duplicate_constants():
    def f(x):
        return x * ex.exp(ex.ones((4,))) + ex.exp(ex.ones((4,)))  # two equal constant subgraphs

    g = ex.compile(f)
    np.testing.assert_allclose(g(np.ones(4, np.float32)).numpy(), 2 * np.e, rtol=1e-6)
    assert next(iter(g.cache.values())).plan.n_steps == 1


def test_equal_roots_get_their_own_buffers():
    k, v = ex.zeros((4, 2)), ex.zeros((4, 2))  # the same expression: merged, but not shared
    ex.eval(k, v)
    ex.slice_update(k, ex.ones((1, 2)), 0).numpy()
    assert k.numpy()[0, 0] == 1 and v.numpy()[0, 0] == 0


def test_import_leaves_ml_dtypes_until_bfloat16_is_used():
    """ml_dtypes takes most of a second to import: `import express` must not pull it in, and
    bfloat16 still works (NumPy type, arrays in and out) once it is used."""
    code = textwrap.dedent("""
        import sys
        import numpy as np
        import express as ex
        print("ml_dtypes" in sys.modules)
        t = ex.asarray(np.arange(4, dtype=np.float32)).astype(ex.bfloat16)
        a = t.numpy()
        print(a.dtype, ex.asarray(a).dtype.name, a.astype(np.float32).tolist())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split("\n")
    assert out[0] == "False"
    assert out[1] == "bfloat16 bfloat16 [0.0, 1.0, 2.0, 3.0]"
