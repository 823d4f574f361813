"""int8/int4 weights (qlinear kernel and quantized models), export, LoRA merged and dynamic."""
import copy
import json

import numpy as np
import pytest
import torch
from peft import LoraConfig, get_peft_model

import express as ex
import express.nn as nn
import llm
from express.nn.quantized import QuantizedLinear
from express.ops.quant import dequantize_weight, pack_weight, qlinear, qlinear_many, quantize_weight
from llm.__main__ import main

from conftest import FAMILIES
from test_llm import IDS, ref_logits

# ---- the op against its NumPy reference ----
# n: 16-row groups with a partial last one (AVX2 also an empty last half), and only full ones;
# m: one row, and partial and several full blocks of rows (the kernels take rows 4 or 8 at a time)
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("m, n", [(1, 70), (3, 70), (8, 70), (37, 70), (1, 128), (19, 128)])
def test_qlinear_matches_reference(isa, bits, group, m, n):
    rng = np.random.default_rng(m * bits + group + n)
    w = rng.standard_normal((n, 256)).astype(np.float32)
    x = rng.standard_normal((m, 256)).astype(np.float32)
    x[0, :32] = 0  # an all-zero block (scale 0)
    b = rng.standard_normal(n).astype(np.float32)
    q, s = quantize_weight(w, bits, group)
    ref = x @ dequantize_weight(q, s, bits, group, n).T + b
    y = qlinear(ex.asarray(x), q, s, b, bits=bits, group_size=group, out_features=n).numpy()
    # x is rounded to int8 per 32 values inside the kernel: exact against the same rounding in NumPy
    xq = x.reshape(m, -1, 32)
    xs = np.abs(xq).max(-1, keepdims=True) / 127
    xr = (np.rint(xq / np.where(xs > 0, xs, 1)) * xs).reshape(m, 256)
    np.testing.assert_allclose(y, xr @ dequantize_weight(q, s, bits, group, n).T + b, atol=2e-4, rtol=1e-5)
    assert np.abs(y - ref).max() <= 1.5e-2 * np.abs(ref).max()
    # without bias, and with the extremes of both codes (-8 / 7 for int4, +-127 for int8)
    lo, hi = (-127, 127) if bits == 8 else (-8, 7)
    q, s = pack_weight(rng.choice([lo, hi], (n, 256)), rng.uniform(0.5, 1, (n, 256 // group)), bits, group)
    y = qlinear(ex.asarray(x), q, s, bits=bits, group_size=group, out_features=n).numpy()
    np.testing.assert_allclose(y, xr @ dequantize_weight(q, s, bits, group, n).T, atol=2e-3, rtol=1e-5)


# several weights over one x in one call (a decode step's q/k/v, gate/up): row groups partial and
# full, a bias on some only; their rows split over the threads together
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("m", [1, 5, 19])
def test_qlinear_many_matches_separate_layers(isa, threads, bits, m):
    rng = np.random.default_rng(bits + m)
    k, ns = 128, (70, 16, 33)
    x = rng.standard_normal((m, k)).astype(np.float32)
    parts = []
    for j, n in enumerate(ns):
        q, s = quantize_weight(rng.standard_normal((n, k)).astype(np.float32), bits, 64)
        parts.append((q, s, rng.standard_normal(n).astype(np.float32) if j != 1 else None, n))
    ys = qlinear_many(ex.asarray(x), parts, bits=bits, group_size=64)
    xq = x.reshape(m, -1, 32)
    xs = np.abs(xq).max(-1, keepdims=True) / 127
    xr = (np.rint(xq / np.where(xs > 0, xs, 1)) * xs).reshape(m, k)
    for y, (q, s, b, n) in zip(ys, parts):
        y = y.numpy()
        assert y.shape == (m, n)
        want = xr @ dequantize_weight(q, s, bits, 64, n).T + (0 if b is None else b)
        np.testing.assert_allclose(y, want, atol=2e-4, rtol=1e-5)
        # the same kernel on the same rounded x: equal to the layer on its own
        np.testing.assert_array_equal(y, qlinear(ex.asarray(x), q, s, b, bits=bits, group_size=64, out_features=n).numpy())
    # a leading batch shape comes back on every output
    ys = qlinear_many(ex.asarray(x.reshape(1, m, k)), parts, bits=bits, group_size=64)
    assert [y.shape for y in ys] == [(1, m, n) for n in ns]



# a residual add after a one-weight qlinear of up to 16 rows (a decode step's o_proj / down_proj
# into h) becomes the kernel's residual input: the plan has no add step left, and the sum is
# NumPy's; a qlinear over several weights keeps its add
@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("m", [1, 5, 16])
def test_qlinear_takes_the_residual_add(isa, threads, bits, m):
    rng = np.random.default_rng(bits * m)
    k, n = 128, 70
    x, r = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((m, n)).astype(np.float32)
    q, s = quantize_weight(rng.standard_normal((n, k)).astype(np.float32), bits, 64)
    b = rng.standard_normal(n).astype(np.float32)
    f = ex.compile(lambda x, r: r + qlinear(x, q, s, b, bits=bits, group_size=64, out_features=n))
    y = f(x, r).numpy()
    plan = list(f.cache.values())[0].plan
    assert plan.n_steps == 1  # the qlinear alone, the add in its epilogue
    alone = qlinear(ex.asarray(x), q, s, b, bits=bits, group_size=64, out_features=n).numpy()
    np.testing.assert_allclose(y, alone.astype(np.float64) + r, rtol=1e-6, atol=1e-6)
    g = ex.compile(lambda x, r: r + qlinear_many(x, [(q, s, b, n), (q, s, None, 16)], bits=bits, group_size=64)[0])
    np.testing.assert_allclose(g(x, r).numpy(), y, rtol=1e-6, atol=1e-6)
    assert list(g.cache.values())[0].plan.n_steps == 2
    # more rows (a prompt): the add stays a step of its own
    x2 = np.concatenate([x] * 17)[:17]
    h = ex.compile(lambda x, r: r + qlinear(x, q, s, b, bits=bits, group_size=64, out_features=n))
    r2 = np.concatenate([r] * 17)[:17]
    want = qlinear(ex.asarray(x2), q, s, b, bits=bits, group_size=64, out_features=n).numpy().astype(np.float64) + r2
    np.testing.assert_allclose(h(x2, r2).numpy(), want, rtol=1e-6, atol=1e-6)
    assert list(h.cache.values())[0].plan.n_steps == 2
    # a residual of the wrong shape, built directly (the fusion only passes matching ones)
    from express.ops.quant import _QLINEAR
    from express.tensor import node
    with pytest.raises(ex.ShapeError, match="residual"):
        node(_QLINEAR, [ex.asarray(x), ex.asarray(q), ex.asarray(s), ex.asarray(r[:, :-1])], bits=bits,
             group_size=64, ns=(n,), biased=(False,), has_res=True)

def test_project_runs_layers_of_one_kind_as_one_call():
    from llm.model import project
    rng = np.random.default_rng(3)
    lins = [nn.Linear(64, n) for n in (48, 16, 32)]
    for lin in lins:
        lin.weight = ex.asarray(rng.standard_normal(lin.weight.shape).astype(np.float32))
    a, b, c = (QuantizedLinear.from_linear(lin, bits, 32) for lin, bits in zip(lins, (4, 8, 4)))
    x = ex.asarray(rng.standard_normal((3, 64)).astype(np.float32))
    ys = project(x, a, b, c)
    assert ys[0].inputs[0] is ys[2].inputs[0] and ys[1].op.name == "qlinear"  # int4 pair fused, int8 alone
    for y, layer in zip(ys, (a, b, c)):
        np.testing.assert_array_equal(y.numpy(), layer(x).numpy())


def test_qlinear_many_bad_input():
    q, s = quantize_weight(np.ones((4, 64), np.float32), 4, 32)
    q2, s2 = quantize_weight(np.ones((4, 128), np.float32), 4, 32)
    with pytest.raises(ex.ShapeError, match="qlinear"):
        qlinear_many(ex.ones((2, 64)), [(q, s, None, 4), (q2, s2, None, 4)], bits=4, group_size=32)
    with pytest.raises(ex.ShapeError, match="1 to 8"):
        qlinear_many(ex.ones((2, 64)), [(q, s, None, 4)] * 9, bits=4, group_size=32)
    with pytest.raises(ex.ShapeError, match="bias"):
        qlinear_many(ex.ones((2, 64)), [(q, s, None, 4), (q, s, np.ones(5, np.float32), 4)], bits=4, group_size=32)
    from express.ops.quant import _QLINEAR
    from express.tensor import node
    with pytest.raises(ex.ShapeError, match="qlinear"):  # x must be 2-d (rows, k)
        node(_QLINEAR, [ex.ones((1, 2, 64)), ex.asarray(q), ex.asarray(s)], bits=4, group_size=32, ns=(4,), biased=(False,))


def test_quantize_weight_roundtrip_and_error_bounds():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 128)).astype(np.float32)
    for bits, qmax in ((8, 127), (4, 7)):
        q, s = quantize_weight(w, bits, 32)
        d = dequantize_weight(q, s, bits, 32, 8)
        s2 = s.astype(np.float32).transpose(0, 2, 1).reshape(16, 4)[:8]  # 8 rows padded to 16
        step = np.repeat(s2, 32, axis=1)
        assert np.all(np.abs(d - w) <= step / 2 + 1e-6)  # round to nearest within the group's step
        np.testing.assert_allclose(s2, np.abs(w).reshape(8, 4, 32).max(-1) / qmax, rtol=1e-3)  # float16
    # odd row counts pad to a multiple of 16; embedding rows come back by index
    q, s = quantize_weight(w[:5], 4, 32)
    assert q.shape == (1, 4, 256) and s.shape == (1, 4, 16)
    from express.ops.quant import RowTable, dequantize_rows
    np.testing.assert_array_equal(dequantize_rows(q, s, 4, 32, [4, 0, 4]), dequantize_weight(q, s, 4, 32, 5)[[4, 0, 4]])
    # rows of several 16-row groups, both widths, a group size above 32
    big = np.random.default_rng(3).standard_normal((37, 128)).astype(np.float32)
    for bits in (4, 8):
        q, s = quantize_weight(big, bits, 64)
        rows = [36, 0, 17, 17, 15, 16]
        np.testing.assert_array_equal(dequantize_rows(q, s, bits, 64, rows), dequantize_weight(q, s, bits, 64, 37)[rows])
        assert dequantize_rows(q, s, bits, 64, []).shape == (0, 128)
        table, out = RowTable(q, s, bits, 64), np.full((len(rows), 128), np.nan, np.float32)
        assert table(rows, out=out) is out  # written in place (a decode step's lookup)
        np.testing.assert_array_equal(out, dequantize_weight(q, s, bits, 64, 37)[rows])
        for bad_out in (out[:1], out.astype(np.float64), np.zeros((128, len(rows)), np.float32).T):
            with pytest.raises(ex.ShapeError, match="out"):
                table(rows, out=bad_out)
        for bad in ([48], [-1], [3, 100]):  # past the table's 48 rows (3 groups of 16): an error, not a read
            with pytest.raises(ex.OutOfRangeError, match="dequantize_rows"):
                dequantize_rows(q, s, bits, 64, bad)
        # a table that is not one: checked before the C kernel reads it
        for args, err in (((q.astype(np.float32), s, bits, 64), ex.DTypeError), ((q, s, 12 - bits, 64), ex.DTypeError),
                          ((q, s.astype(np.float32), bits, 64), ex.DTypeError), ((q[:, :1], s, bits, 64), ex.ShapeError),
                          ((q, s, bits, 32), ex.ShapeError), ((q, s, bits, 48), ex.ShapeError)):
            with pytest.raises(err, match="dequantize_rows"):
                dequantize_rows(*args, [0])


def test_qlinear_bad_input():
    q, s = quantize_weight(np.ones((4, 64), np.float32), 4, 32)
    with pytest.raises(ex.ShapeError, match="qlinear"):
        qlinear(ex.ones((2, 32)), q, s, bits=4, group_size=32)
    with pytest.raises(ex.DTypeError, match="qlinear"):
        qlinear(ex.ones((2, 64)), q.view(np.int8), s, bits=4, group_size=32)
    with pytest.raises(ex.ShapeError, match="qlinear"):
        qlinear(ex.ones((2, 64)), q, s, bits=4, group_size=32, out_features=17)  # 4 rows pad to 16
    with pytest.raises(ex.ShapeError, match="group"):
        quantize_weight(np.ones((4, 48), np.float32), 4, 32)


def test_module_quantize_swaps_linears():
    m = nn.Sequential(nn.Linear(64, 32), nn.Linear(32, 8), nn.Linear(8, 3))
    x = ex.asarray(np.random.default_rng(1).standard_normal((9, 64)).astype(np.float32))
    ref = m(x).numpy()
    assert m.quantize(bits=8, group_size=32) is m  # Module.quantize delegates to nn.quantized.quantize
    assert [type(l).__name__ for l in m] == ["QuantizedLinear", "QuantizedLinear", "Linear"]
    assert np.abs(m(x).numpy() - ref).max() < 0.02 * np.abs(ref).max()


# ---- quantized models ----
def dequantized_reference(ref, bits, group):
    """transformers with every linear weight replaced by dequantize(quantize(W)), as we quantize."""
    r = copy.deepcopy(ref)
    with torch.no_grad():
        for name, mod in r.named_modules():
            if isinstance(mod, torch.nn.Linear) and mod.in_features % group == 0:
                q, s = quantize_weight(mod.weight.numpy(), bits, group)
                mod.weight.copy_(torch.from_numpy(dequantize_weight(q, s, bits, group)))
        if r.config.tie_word_embeddings:  # our tied head (and embedding) read the quantized table
            emb = r.get_input_embeddings()
            q, s = quantize_weight(emb.weight.numpy(), bits, group)
            emb.weight.copy_(torch.from_numpy(dequantize_weight(q, s, bits, group)))
    return r


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("bits", [8, 4])
def test_quantized_model(tiny, family, bits):
    folder, ref = tiny(family)
    m = llm.load(folder, quant_bits=bits, group_size=32)
    prefill = m.forward(IDS)
    m.reset()
    decode = np.stack([m._run([i])[0] for i in IDS])  # one token at a time: the int8-activation GEMV
    # the kernel computes the dequantized model, within the rounding of the activations
    dq = ref_logits(dequantized_reference(ref, bits, 32), IDS)
    # (activations rounded to int8 per 32 values inside the kernel, as llama.cpp does)
    for got in (prefill, decode):
        assert np.abs(got - dq).max() <= 0.05 * np.abs(dq).max()
    # against the float model: int8 within 4% of the logit range; int4's top-1 agreement reported
    full = ref_logits(ref, IDS)
    err = np.abs(prefill - full).max() / np.abs(full).max()
    agree = float((prefill.argmax(1) == full.argmax(1)).mean())
    print(f"\n{family} int{bits}: max |logit error| / max |logit| = {err:.4f}, top-1 agreement {agree:.2f}")
    if bits == 8:
        assert err < 0.04


def test_export_roundtrip_and_cli(tiny, tmp_path, capsys):
    folder, _ = tiny("qwen2")
    out = tmp_path / "q4"
    assert main(["export", folder, str(out), "--quant-bits", "4", "--group-size", "32"]) == 0
    assert "MiB" in capsys.readouterr().out
    meta = json.loads((out / "express_llm.json").read_text())
    assert meta["quant_bits"] == 4 and meta["group_size"] == 32
    exported = llm.load(out)
    assert isinstance(exported.model.model.layers[0].mlp.up_proj, QuantizedLinear)
    fly = llm.load(folder, quant_bits=4, group_size=32)
    np.testing.assert_array_equal(exported.forward(IDS), fly.forward(IDS))
    assert exported.generate("Hello", max_new_tokens=5) == fly.generate("Hello", max_new_tokens=5)
    with pytest.raises(ex.ModelError, match="quant_bits"):
        llm.load(out, quant_bits=8)
    # a quantized export of another packed layout is refused, not misread
    (out / "express_llm.json").write_text(json.dumps(dict(meta, version=1)))
    with pytest.raises(ex.ModelError, match="version 1.*export it again"):
        llm.load(out)
    # unquantized export (float weights) and untied head
    folder3, ref3 = tiny("qwen3")
    assert main(["export", folder3, str(tmp_path / "f")]) == 0
    np.testing.assert_allclose(llm.load(tmp_path / "f").forward(IDS), ref_logits(ref3, IDS), atol=1e-4, rtol=0)
    assert main(["export", folder3, str(tmp_path / "q8"), "--quant-bits", "8", "--group-size", "32"]) == 0
    # an untied embedding is exported as float16 (looked up row by row), hence the tolerance
    a, b = llm.load(tmp_path / "q8").forward(IDS), llm.load(folder3, quant_bits=8, group_size=32).forward(IDS)
    assert np.abs(a - b).max() < 0.05 * np.abs(b).max()


def test_cli_generate_and_bench(tiny, capsys):
    folder, _ = tiny("llama")
    assert main(["generate", folder, "--prompt", "Hello world", "--max-new-tokens", "4"]) == 0
    assert main(["bench", folder, "--prompt-tokens", "16", "--gen-tokens", "4", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "prefill" in out and "decode" in out and "RSS" in out
    assert main(["generate", folder + "/nope", "--prompt", "x"]) == 2


# ---- LoRA ----
def make_adapter(ref, folder, seed, targets=("q_proj", "v_proj", "down_proj")):
    torch.manual_seed(seed)
    peft_model = get_peft_model(copy.deepcopy(ref), LoraConfig(r=4, lora_alpha=8, target_modules=list(targets),
                                                               init_lora_weights=False))
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_" in n:
                p.normal_(0, 0.3)
    peft_model.save_pretrained(folder)
    return peft_model.merge_and_unload().eval()


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_lora_merged_and_dynamic(tiny, tmp_path, family):
    folder, ref = tiny(family)
    a_ref = make_adapter(ref, tmp_path / "a", 1)
    b_ref = make_adapter(ref, tmp_path / "b", 2, targets=("k_proj", "o_proj", "up_proj"))
    want_a, want_b, base = ref_logits(a_ref, IDS), ref_logits(b_ref, IDS), ref_logits(ref, IDS)
    assert np.abs(want_a - base).max() > 0.1  # the adapter matters
    np.testing.assert_allclose(llm.load(folder, lora=str(tmp_path / "a")).forward(IDS), want_a, atol=1e-4, rtol=0)
    m = llm.load(folder)
    m.add_lora("a", tmp_path / "a")
    m.add_lora("b", tmp_path / "b")
    np.testing.assert_allclose(m.forward(IDS), base, atol=1e-4, rtol=0)  # not active until set
    m.set_lora("a")
    np.testing.assert_allclose(m.forward(IDS), want_a, atol=1e-4, rtol=0)
    m.set_lora("b")
    np.testing.assert_allclose(m.forward(IDS), want_b, atol=1e-4, rtol=0)
    m.set_lora(None)
    np.testing.assert_allclose(m.forward(IDS), base, atol=1e-4, rtol=0)
    with pytest.raises(ex.ModelError, match="no adapter"):
        m.set_lora("c")
    # export with the adapter merged
    assert main(["export", folder, str(tmp_path / "merged"), "--lora", str(tmp_path / "a")]) == 0
    np.testing.assert_allclose(llm.load(tmp_path / "merged").forward(IDS), want_a, atol=1e-4, rtol=0)


def test_lora_on_quantized_base(tiny, tmp_path):
    folder, ref = tiny("qwen2")
    make_adapter(ref, tmp_path / "a", 3)
    m = llm.load(folder, quant_bits=8, group_size=32)
    base = m.forward(IDS)
    m.add_lora("a", tmp_path / "a")
    m.set_lora("a")
    # the quantized base plus the float adapter == the merged float model, within int8 error
    merged = llm.load(folder, lora=str(tmp_path / "a")).forward(IDS)
    got = m.forward(IDS)
    assert np.abs(got - merged).max() < 0.05 * np.abs(merged).max()
    assert np.abs(got - base).max() > 0.1


def test_bad_adapter_folder(tiny, tmp_path):
    folder, _ = tiny("llama")
    m = llm.load(folder)
    with pytest.raises(ex.ModelError, match="adapter_config.json"):
        m.add_lora("x", tmp_path)
