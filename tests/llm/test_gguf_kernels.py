"""ggml_linear: GGUF blocks multiplied in place, for every block type and kernel variant, against
gguf.quants' dequantizer and NumPy with the activations quantized as llama.cpp does (Q8_0 for the
32-blocks, Q8_K for the K types: the integer dot products are exact, so only float rounding
differs), and against the plain float product; plus bad input."""
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q, quants

import express as ex
from express.ops.quant import ggml_linear, ggml_linear_many

rng = np.random.default_rng(0)
BLOCK = {"Q4_0": (32, 18, [0]), "Q5_0": (32, 22, [0]), "Q8_0": (32, 34, [0]),
         "Q4_K": (256, 144, [0, 2]), "Q5_K": (256, 176, [0, 2]), "Q6_K": (256, 210, [208])}


def random_blocks(kind, rows, cols):
    """Random bytes are valid blocks once their f16 scales are finite."""
    size, nbytes, f16_at = BLOCK[kind]
    raw = rng.integers(0, 256, (rows, cols // size, nbytes), dtype=np.uint8)
    for off in f16_at:
        raw[..., off:off + 2] = rng.uniform(0.001, 0.01, (rows, cols // size)).astype(np.float16).view(np.uint8).reshape(
            rows, cols // size, 2)
    return raw.reshape(rows, -1)


def q8_0(x):
    """llama.cpp's Q8_0 activations (dequantized): per 32, scale fp16(max|x| / 127), codes
    round-half-even(x * 127 / max|x|)."""
    b = x.reshape(-1, 32)
    amax = np.abs(b).max(1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float16).astype(np.float32)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    return (np.rint(b * inv) * d).reshape(x.shape)


def q8_k(x):
    """llama.cpp's Q8_K activations (dequantized): per 256, iscale = -127 / (the value of largest
    magnitude), codes round-half-even(iscale * x) (at most 127), scale 1 / iscale."""
    b = x.reshape(-1, 256)
    mx = b[np.arange(len(b)), np.abs(b).argmax(1)][:, None]
    iscale = np.where(mx != 0, np.float32(-127) / np.where(mx != 0, mx, 1), 0).astype(np.float32)
    q = np.minimum(127, np.rint(iscale * b))
    return (q * np.where(iscale != 0, np.float32(1) / np.where(iscale != 0, iscale, 1), 0)).reshape(x.shape)


@pytest.mark.parametrize("kind", list(BLOCK))
@pytest.mark.parametrize("m", [1, 5, 21])  # one row (decode), a few, and several rows per vector (prefill)
def test_ggml_linear_matches_llama_cpp_numerics(isa, kind, m):
    n, k = 37, 512 if kind.endswith("_K") else 544  # an odd number of 32-blocks
    w = random_blocks(kind, n, k)
    wd = quants.dequantize(w, Q[kind]).reshape(n, k).astype(np.float64)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[0, :7] = 0.0  # a run of zeros, and (m > 1) a row of zeros: scale 0
    if m > 1:
        x[1] = 0.0
    bias = rng.standard_normal(n).astype(np.float32)
    y = ggml_linear(ex.asarray(x), w, kind, bias).numpy()
    xa = (q8_k(x) if kind.endswith("_K") else q8_0(x)).astype(np.float64)
    want = xa @ wd.T + bias
    scale = np.abs(want).max()
    np.testing.assert_allclose(y, want, rtol=0, atol=2e-6 * scale)
    # and the product with unquantized activations, within the activation rounding
    np.testing.assert_allclose(y, x.astype(np.float64) @ wd.T + bias, rtol=0, atol=3e-2 * scale)


@pytest.mark.parametrize("kind", ["Q5_0", "Q6_K"])
def test_ggml_linear_threads_and_batch_dims(threads, kind):
    n, k = 300, 768  # several tasks
    w = random_blocks(kind, n, k)
    x = rng.standard_normal((2, 9, k)).astype(np.float32)
    y = ggml_linear(ex.asarray(x), w, kind).numpy()
    xa = q8_k(x) if kind.endswith("_K") else q8_0(x)
    want = xa.astype(np.float64) @ quants.dequantize(w, Q[kind]).reshape(n, k).T.astype(np.float64)
    assert y.shape == (2, 9, n)
    np.testing.assert_allclose(y, want, rtol=0, atol=2e-6 * np.abs(want).max())


@pytest.mark.parametrize("kind", ["Q5_0", "Q8_0", "Q4_K"])
@pytest.mark.parametrize("m", [1, 5, 21])
def test_ggml_linear_many_matches_separate_layers(isa, threads, kind, m):
    """Several weights of one type over one x in one call (q/k/v, gate/up): each output equals
    the layer on its own, and llama.cpp's numerics."""
    k = 512
    ws = [(random_blocks(kind, n, k), rng.standard_normal(n).astype(np.float32) if n != 64 else None)
          for n in (37, 64, 5)]
    x = rng.standard_normal((m, k)).astype(np.float32)
    xa = (q8_k(x) if kind.endswith("_K") else q8_0(x)).astype(np.float64)
    ys = ggml_linear_many(ex.asarray(x), ws, kind)
    for y, (w, b) in zip(ys, ws):
        y = y.numpy()
        want = xa @ quants.dequantize(w, Q[kind]).reshape(len(w), k).astype(np.float64).T + (0 if b is None else b)
        np.testing.assert_allclose(y, want, rtol=0, atol=2e-5 * np.abs(want).max())
        np.testing.assert_allclose(y, ggml_linear(ex.asarray(x), w, kind, b).numpy(), rtol=1e-6, atol=1e-6)
    with pytest.raises(ex.ShapeError, match="ggml_linear"):
        ggml_linear_many(ex.asarray(x), [ws[0], (random_blocks(kind, 3, 2 * k), None)], kind)  # other k
    with pytest.raises(ex.ShapeError, match="1 to 8"):
        ggml_linear_many(ex.asarray(x), ws * 3, kind)
    # the node checks x against k itself (the kernel reads k values a row)
    from express.ops.quant import _GGML_LINEAR
    from express.tensor import node
    with pytest.raises(ex.ShapeError, match="ggml_linear"):
        node(_GGML_LINEAR, [ex.asarray(x[:, :32]), ex.asarray(ws[0][0])], kind=kind, k=k, count=1, biased=(False,))


def test_ggml_linear_reference_matches_kernel():
    w = random_blocks("Q4_K", 8, 256)
    x = rng.standard_normal((3, 256)).astype(np.float32)
    from express.ops.quant import _ggml_ref
    np.testing.assert_allclose(ggml_linear(ex.asarray(x), w, "Q4_K").numpy(), _ggml_ref(x, w, kind="Q4_K", k=256, count=1, biased=(False,)),
                               rtol=0, atol=3e-2 * np.abs(_ggml_ref(x, w, kind="Q4_K", k=256, count=1, biased=(False,))).max())


def test_ggml_linear_bad_input():
    w = random_blocks("Q8_0", 4, 64)
    x = ex.ones((2, 64))
    with pytest.raises(ex.DTypeError, match="Q2_K"):
        ggml_linear(x, w, "Q2_K")
    with pytest.raises(ex.ShapeError, match="bytes"):
        ggml_linear(x, w[:, :-1], "Q8_0")  # rows one byte short
    with pytest.raises(ex.ShapeError):
        ggml_linear(ex.ones((2, 64)), random_blocks("Q8_0", 4, 64), "Q4_K")  # 64 is not a multiple of 256
    with pytest.raises(ex.ShapeError):
        ggml_linear(ex.ones((2, 32)), w, "Q8_0")  # k does not match the blocks
    with pytest.raises(ex.DTypeError):
        ggml_linear(x, w.view(np.int8), "Q8_0")
    with pytest.raises(ex.ShapeError, match="bias"):
        ggml_linear(x, w, "Q8_0", np.zeros(3, np.float32))


def operands(x, w, kind):
    """llama.cpp's quantized activations and the dequantized weights [n, k], in float64."""
    xa = q8_k(x) if kind.endswith("_K") else q8_0(x)
    return xa.astype(np.float64), quants.dequantize(w, Q[kind]).reshape(w.shape[0], -1).astype(np.float64)


def reference(x, w, kind, bias=None):
    """The dot of llama.cpp's quantized activations with the dequantized blocks, in float64."""
    xa, wd = operands(x, w, kind)
    want = xa @ wd.T
    return want if bias is None else want + bias


def magnitude(x, w, kind):
    """The sum of |products| per output: the scale of a float32 dot's rounding error, which |want|
    is not when a few outputs cancel to near zero."""
    xa, wd = operands(x, w, kind)
    return np.abs(xa) @ np.abs(wd).T


@pytest.mark.parametrize("kind", list(BLOCK))
@pytest.mark.parametrize("n", [1, 7, 17, 65])  # output rows: tails of the 4-row weight tiles
def test_ggml_linear_row_and_tile_tails(isa, kind, n):
    """m = 1..9 (decode, the few-row kernels, the first rows-in-lanes sizes) and sizes around one
    and two vectors of rows (8 or 16 lanes, tiles of two groups): 15, 17, 33, 47."""
    k = 512 if kind.endswith("_K") else 96
    w = random_blocks(kind, n, k)
    bias = rng.standard_normal(n).astype(np.float32)
    for m in list(range(1, 10)) + [15, 17, 33, 47]:
        x = rng.standard_normal((m, k)).astype(np.float32)
        want = reference(x, w, kind, bias)
        y = ggml_linear(ex.asarray(x), w, kind, bias).numpy()
        np.testing.assert_allclose(y, want, rtol=0, atol=2e-6 * magnitude(x, w, kind).max(), err_msg=f"m={m}")


@pytest.mark.parametrize("kind", list(BLOCK))
@pytest.mark.parametrize("m, n, k", [(1, 1027, 256), (40, 1027, 256), (130, 9, 2048)])
def test_ggml_linear_chunks_over_threads(isa, threads, kind, m, n, k):
    """Enough rows for many chunks of rows claimed by the threads, a partial last chunk; and rows
    of x whose weights per chunk exceed the chunk size (one tile per chunk)."""
    w = random_blocks(kind, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    want = reference(x, w, kind)
    y = ggml_linear(ex.asarray(x), w, kind).numpy()
    np.testing.assert_allclose(y, want, rtol=0, atol=2e-6 * np.abs(want).max())


@pytest.mark.parametrize("kind", list(BLOCK))
def test_ggml_linear_variants_agree(kind):
    """The portable, AVX2 and AVX-512 kernels give the same products up to float summation order."""
    from tests.conftest import ISAS
    n, k, m = 33, 768, 19
    w = random_blocks(kind, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    before, out = ex.isa(), {}
    try:
        for name in ISAS:
            ex.set_isa(name)
            out[name] = ggml_linear(ex.asarray(x), w, kind).numpy()
    finally:
        ex.set_isa(before)
    for name in ISAS:
        np.testing.assert_allclose(out[name], out["generic"], rtol=0, atol=2e-6 * np.abs(out["generic"]).max(),
                                   err_msg=name)
