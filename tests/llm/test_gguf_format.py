"""GGUF reading: every block format against the gguf package's own dequantizer, metadata to
config, tensor names, the embedded tokenizer, and bad files."""
import numpy as np
import pytest

import gguf  # noqa: E402
from gguf import GGMLQuantizationType as Q, quants  # noqa: E402

import express as ex  # noqa: E402
from llm.gguf import GGUFFile, config_from_gguf, decode_tensor, hf_name, load_weights, tokenizer_from_gguf  # noqa: E402

rng = np.random.default_rng(0)
BLOCK_BYTES = {Q.Q8_0: 34, Q.Q4_0: 18, Q.Q5_0: 22, Q.Q4_K: 144, Q.Q5_K: 176, Q.Q6_K: 210}
BLOCK_SIZE = {Q.Q8_0: 32, Q.Q4_0: 32, Q.Q5_0: 32, Q.Q4_K: 256, Q.Q5_K: 256, Q.Q6_K: 256}
F16_AT = {Q.Q8_0: [0], Q.Q4_0: [0], Q.Q5_0: [0], Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}


def random_blocks(qtype, rows, cols):
    """Random bytes are valid blocks once their f16 scales are finite."""
    nb = cols // BLOCK_SIZE[qtype]
    raw = rng.integers(0, 256, (rows, nb, BLOCK_BYTES[qtype]), dtype=np.uint8)
    for off in F16_AT[qtype]:
        raw[..., off:off + 2] = np.frombuffer((rng.uniform(0.001, 0.1, (rows, nb)).astype(np.float16)).tobytes(),
                                              np.uint8).reshape(rows, nb, 2)
    return raw.reshape(rows, -1)


def write(path, tensors, arch="gemma3", extra=None, tokens=None):
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(1)
    w.add_key_length(16)
    w.add_value_length(16)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_context_length(256)
    w.add_rope_freq_base(1e6)
    if arch == "gemma3":
        w.add_sliding_window(32)
    for k, v in (extra or {}).items():
        v(w)
    if tokens:
        w.add_tokenizer_model("llama")
        w.add_token_list(tokens["tokens"])
        w.add_token_scores(tokens["scores"])
        w.add_token_types(tokens["types"])
        w.add_bos_token_id(2)
        w.add_eos_token_id(1)
        w.add_add_bos_token(True)
    for name, (arr, qtype) in tensors.items():
        w.add_tensor(name, arr, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("qtype", list(BLOCK_BYTES), ids=lambda q: q.name)
def test_block_formats_match_gguf_dequantize(tmp_path, qtype):
    raw = random_blocks(qtype, 3, 512)
    p = write(tmp_path / "m.gguf", {"blk.0.attn_q.weight": (raw, qtype)})
    t = GGUFFile(p).tensors["blk.0.attn_q.weight"]
    qb = decode_tensor(t)
    want = quants.dequantize(raw, qtype)
    assert qb.codes.shape == (3, 512) and qb.kind == qtype.name
    np.testing.assert_allclose(qb.dequantize(), want, rtol=1e-6, atol=1e-7)
    assert np.abs(qb.codes).max() < 2 ** qb.bits


def test_make_resident_reads_the_same_bytes(tmp_path):
    """Quantized tensors read into memory (as the loader does for the decode weights) hold the
    bytes the map holds; the others stay views of the map."""
    raws = {"blk.0.attn_q.weight": (random_blocks(Q.Q4_K, 3, 512), Q.Q4_K),
            "blk.0.attn_k.weight": (random_blocks(Q.Q8_0, 5, 96), Q.Q8_0),
            "token_embd.weight": (rng.standard_normal((7, 64)).astype(np.float32), Q.F32)}
    g = GGUFFile(write(tmp_path / "m.gguf", raws))
    g.make_resident(["blk.0.attn_q.weight", "blk.0.attn_k.weight"])
    mapped = GGUFFile(tmp_path / "m.gguf")
    for name, (raw, _) in raws.items():
        np.testing.assert_array_equal(g.tensors[name].data, mapped.tensors[name].data)
        assert np.shares_memory(g.tensors[name].data, g.mmap) == (name == "token_embd.weight")
    np.testing.assert_array_equal(decode_tensor(g.tensors["blk.0.attn_q.weight"]).dequantize(),
                                  quants.dequantize(raws["blk.0.attn_q.weight"][0], Q.Q4_K))


def test_float_tensors_config_and_names(tmp_path):
    emb = rng.standard_normal((100, 64)).astype(np.float32)
    norm = rng.standard_normal(64).astype(np.float32)
    k = rng.standard_normal((16, 64)).astype(np.float16)
    q8 = quants.quantize(rng.standard_normal((64, 64)).astype(np.float32), Q.Q8_0)
    p = write(tmp_path / "m.gguf", {"token_embd.weight": (emb, None), "output_norm.weight": (norm, None),
                                    "blk.1.attn_k.weight": (k, None), "blk.0.ffn_down.weight": (q8, Q.Q8_0),
                                    "blk.0.post_ffw_norm.weight": (norm, None)})
    g = GGUFFile(p)
    cfg = config_from_gguf(g)
    assert cfg["architectures"] == ["Gemma3ForCausalLM"] and cfg["num_hidden_layers"] == 2
    assert cfg["head_dim"] == 16 and cfg["num_key_value_heads"] == 1 and cfg["sliding_window"] == 32
    w = load_weights(g, cfg)
    np.testing.assert_array_equal(w["model.embed_tokens.weight"], emb)
    np.testing.assert_allclose(w["model.norm.weight"], norm - 1.0)  # GGUF folds Gemma's 1 + w
    np.testing.assert_allclose(w["model.layers.0.post_feedforward_layernorm.weight"], norm - 1.0)
    np.testing.assert_array_equal(w["model.layers.1.self_attn.k_proj.weight"], k)
    np.testing.assert_allclose(w["model.layers.0.mlp.down_proj.weight"].dequantize(), quants.dequantize(q8, Q.Q8_0))
    assert hf_name("gemma3", "blk.3.ffn_norm.weight") == "model.layers.3.pre_feedforward_layernorm.weight"
    assert hf_name("llama", "blk.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"


def test_sentencepiece_tokenizer(tmp_path):
    pieces = ["<pad>", "<eos>", "<bos>", "<unk>", "\n", "\n\n", "  "] + [chr(0x2581) + w for w in ["the", "cat"]] + \
        list("thecatsa") + [chr(0x2581), "th", "he", "at", chr(0x2581) + "t", chr(0x2581) + "c"] + \
        [f"<0x{i:02X}>" for i in range(256)]
    types = [3, 3, 3, 2, 4, 4, 4] + [1] * 16 + [6] * 256
    scores = [0.0] * 7 + [-1.0, -2.0] + [-5.0] * 8 + [-3.0] + [-4.0] * 5 + [0.0] * 256
    p = write(tmp_path / "t.gguf", {"output_norm.weight": (np.ones(64, np.float32), None)},
              tokens={"tokens": pieces, "scores": scores, "types": types})
    tok = tokenizer_from_gguf(GGUFFile(p))
    enc = tok.encode("the cat\n\nsat")
    assert enc.ids[0] == 2  # <bos>
    assert chr(0x2581) + "cat" in [pieces[i] for i in enc.ids]  # " cat": the space becomes U+2581, then merges
    assert tok.decode(enc.ids, skip_special_tokens=True) == "the cat\n\nsat"
    assert tok.token_to_id("\n\n") in enc.ids  # user-defined pieces match whole
    z = tok.encode("zé")  # not in the vocabulary: byte fallback
    assert all(pieces[i].startswith("<0x") for i in z.ids[1:]) and tok.decode(z.ids, skip_special_tokens=True) == "zé"


def test_bad_files(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"NOPE" + bytes(100))
    with pytest.raises(ex.ModelError, match="not a GGUF file"):
        GGUFFile(tmp_path / "x.gguf")
    good = write(tmp_path / "g.gguf", {"output_norm.weight": (np.ones(64, np.float32), None)})
    data = good.read_bytes()
    (tmp_path / "t.gguf").write_bytes(data[: len(data) // 3])
    with pytest.raises(ex.ModelError, match="t.gguf"):
        GGUFFile(tmp_path / "t.gguf")
    with pytest.raises(ex.ModelError, match="no such"):
        GGUFFile(tmp_path / "missing.gguf")
    q2 = rng.integers(0, 256, (2, 84), dtype=np.uint8)  # one Q2_K block per row
    p = write(tmp_path / "q2.gguf", {"blk.0.attn_q.weight": (q2, Q.Q2_K)})
    with pytest.raises(ex.ModelError, match="Q2_K"):
        decode_tensor(GGUFFile(p).tensors["blk.0.attn_q.weight"], str(p))
    p = write(tmp_path / "arch.gguf", {"output_norm.weight": (np.ones(64, np.float32), None)}, arch="mamba")
    with pytest.raises(ex.ModelError, match="mamba"):
        config_from_gguf(GGUFFile(p))


def test_header_matches_gguf_reader(tmp_path):
    """The header read directly, against the gguf package's reader."""
    raw = random_blocks(Q.Q4_K, 4, 256)
    p = write(tmp_path / "m.gguf", {"blk.0.attn_q.weight": (raw, Q.Q4_K), "output_norm.weight": (np.ones(64, np.float32), None)},
              tokens={"tokens": ["<pad>", "<eos>", "<bos>", "a", "b"], "scores": [0.0, 0.0, 0.0, -1.5, -2.5],
                      "types": [3, 3, 3, 1, 1]})
    ours, ref = GGUFFile(p), gguf.GGUFReader(str(p))
    for k, f in ref.fields.items():
        if not k.startswith("GGUF."):
            assert ours.metadata[k] == pytest.approx(f.contents()) if isinstance(ours.metadata[k], (float, list)) \
                else ours.metadata[k] == f.contents(), k
    for t in ref.tensors:
        o = ours.tensors[t.name]
        assert o.tensor_type == t.tensor_type and tuple(o.shape) == tuple(int(s) for s in t.shape)
        np.testing.assert_array_equal(np.asarray(o.data), np.asarray(t.data).view(np.uint8).reshape(-1))


def test_truncated_tensor_data_and_embedding_rows(tmp_path):
    q8 = quants.quantize(rng.standard_normal((40, 64)).astype(np.float32), Q.Q8_0)
    p = write(tmp_path / "m.gguf", {"token_embd.weight": (q8, Q.Q8_0)})
    t = decode_tensor(GGUFFile(p).tensors["token_embd.weight"], lazy=True)
    ids = np.array([[3, 0], [39, 3]])
    np.testing.assert_array_equal(t.lookup(ids), quants.dequantize(q8, Q.Q8_0)[ids])
    data = p.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[:-100])  # the header is whole, the last tensor is not
    with pytest.raises(ex.ModelError, match="runs past the end"):
        GGUFFile(tmp_path / "cut.gguf")
