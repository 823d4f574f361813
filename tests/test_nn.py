"""express.nn: Module parameter trees, weight loading, layers vs NumPy formulas."""
import numpy as np
import pytest

import express as ex
import express.nn as nn
import express.nn.functional as F

rng = np.random.default_rng(0)


def test_linear_embedding_norms():
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    lin = nn.Linear(16, 8)
    w, b = lin.weight.numpy(), lin.bias.numpy()
    np.testing.assert_allclose(lin(x).numpy(), x @ w.T + b, rtol=1e-5, atol=1e-5)
    ln = nn.LayerNorm(16)
    ln.update({"weight": rng.standard_normal(16).astype(np.float32), "bias": rng.standard_normal(16).astype(np.float32)})
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    np.testing.assert_allclose(ln(x).numpy(), (x - mu) / np.sqrt(var + 1e-5) * ln.weight.numpy() + ln.bias.numpy(), rtol=1e-4, atol=1e-5)
    rms = nn.RMSNorm(16)
    np.testing.assert_allclose(rms(x).numpy(), x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6), rtol=1e-5, atol=1e-6)
    xc = rng.standard_normal((2, 6, 4, 4)).astype(np.float32)
    gn = nn.GroupNorm(3, 6)
    g = xc.reshape(2, 3, -1)
    want = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-5)).reshape(xc.shape)
    np.testing.assert_allclose(gn(xc).numpy(), want, rtol=1e-4, atol=1e-5)
    emb = nn.Embedding(10, 4)
    ids = np.array([[1, 9], [0, 1]])
    np.testing.assert_array_equal(emb(ids).numpy(), emb.weight.numpy()[ids])


def test_module_tree_and_loading(tmp_path):
    class Block(nn.Module):
        def __init__(self):
            self.norm = nn.RMSNorm(4)
            self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4, bias=False)])

        def forward(self, x):
            for l in self.layers:
                x = l(self.norm(x))
            return x

    m = Block()
    names = set(m.named_parameters())
    assert names == {"norm.weight", "layers.0.weight", "layers.0.bias", "layers.1.weight"}
    assert m.num_parameters() == 4 + 16 + 4 + 16
    weights = {k: rng.standard_normal(v.shape).astype(np.float32) for k, v in m.named_parameters().items()}
    ex.save(tmp_path / "m.safetensors", weights)
    m2 = Block().load_weights(str(tmp_path / "m.safetensors"))
    for k, v in m2.named_parameters().items():
        np.testing.assert_array_equal(v.numpy(), weights[k])
    with pytest.raises(ex.ModelError, match="lack"):
        Block().load_weights({"norm.weight": weights["norm.weight"]})
    with pytest.raises(ex.ModelError, match="unexpected"):
        Block().load_weights({**weights, "extra": np.zeros(1)})
    with pytest.raises(ex.ShapeError, match="norm.weight"):
        Block().load_weights({**weights, "norm.weight": np.zeros(5, np.float32)})
    m2.astype(ex.float16)
    assert all(v.dtype is ex.float16 for v in m2.named_parameters().values())
    x = rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(m2(x.astype(np.float16)).numpy().astype(np.float32), Block().load_weights(weights)(x).numpy(), rtol=2e-2, atol=2e-2)


def test_functional_errors():
    with pytest.raises(ex.ShapeError, match="linear"):
        F.linear(ex.ones((2, 3)), ex.ones((4, 5)))
    with pytest.raises(ex.ShapeError, match="group_norm"):
        F.group_norm(ex.ones((1, 5, 2)), 2)
    with pytest.raises(ex.ShapeError, match="layer_norm"):
        F.layer_norm(ex.ones((2, 3)), (4,))


@pytest.mark.parametrize("traditional", [False, True])
def test_rope_matches_numpy(traditional):
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    d, off = 6, 3
    inv = 1.0 / 10000.0 ** (np.arange(0, d, 2) / d)
    ang = np.outer(np.arange(off, off + 5), inv)
    c, s = np.cos(ang), np.sin(ang)
    want = x.astype(np.float64).copy()
    if traditional:
        a, b = x[..., 0:d:2], x[..., 1:d:2]
        want[..., 0:d:2], want[..., 1:d:2] = a * c - b * s, b * c + a * s
    else:
        a, b = x[..., :d // 2], x[..., d // 2:d]
        want[..., :d // 2], want[..., d // 2:d] = a * c - b * s, b * c + a * s
    got = F.rope(x, offset=off, dims=d, traditional=traditional).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    lazy = F.rope(x, offset=ex.asarray(np.array(off)), dims=d, traditional=traditional).numpy()
    np.testing.assert_allclose(lazy, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ex.ShapeError, match="rope"):
        F.rope(x, dims=5)


@pytest.mark.parametrize("traditional", [False, True])
@pytest.mark.parametrize("d", [8, 4])
def test_apply_rotary_matches_numpy(traditional, d):
    # x (T, heads, 8) as the column view of a wider projection output (rows 40 floats apart), cos/sin
    # (T, 1, d/2) broadcast over the heads; eager and through a compiled plan (the swapped halves
    # are a flipped view: negative strides reach the elementwise kernel)
    wide = rng.standard_normal((3, 40)).astype(np.float32)
    ang = rng.uniform(-3, 3, (3, 1, d // 2))
    c, s = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    x = wide[:, 4:36].reshape(3, 4, 8)
    want = x.astype(np.float64).copy()
    i, j = (np.arange(0, d, 2), np.arange(1, d, 2)) if traditional else (np.arange(d // 2), np.arange(d // 2, d))
    a, b = x[..., i], x[..., j]
    want[..., i], want[..., j] = a * c - b * s, b * c + a * s
    rot = lambda w: F.apply_rotary(ex.asarray(w)[:, 4:36].reshape(3, 4, 8), c, s, traditional)  # noqa: E731
    np.testing.assert_allclose(rot(wide).numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ex.compile(rot)(wide).numpy(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ex.ShapeError, match="apply_rotary"):
        F.apply_rotary(x, np.ones((3, 1, 5), np.float32), np.ones((3, 1, 5), np.float32))
