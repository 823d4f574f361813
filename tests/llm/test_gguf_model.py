"""A GGUF Gemma 3 end to end: a tiny random transformers model written as GGUF (Q8_0/Q4_0/Q5_0
and F32 tensors, embedded SentencePiece vocabulary), loaded by llm.load, against transformers
running the same dequantized weights."""
import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q, quants
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

import llm

V, D = 320, 64
GGUF_NAMES = {"self_attn.q_proj": ("attn_q", Q.Q4_0), "self_attn.k_proj": ("attn_k", Q.Q5_0),
              "self_attn.v_proj": ("attn_v", Q.Q8_0), "self_attn.o_proj": ("attn_output", Q.Q8_0),
              "mlp.gate_proj": ("ffn_gate", Q.Q4_0), "mlp.up_proj": ("ffn_up", Q.Q5_0),
              "mlp.down_proj": ("ffn_down", Q.Q8_0), "input_layernorm": ("attn_norm", None),
              "post_attention_layernorm": ("post_attention_norm", None), "pre_feedforward_layernorm": ("ffn_norm", None),
              "post_feedforward_layernorm": ("post_ffw_norm", None), "self_attn.q_norm": ("attn_q_norm", None),
              "self_attn.k_norm": ("attn_k_norm", None)}


@pytest.fixture(scope="module")
def gemma_gguf(tmp_path_factory):
    torch.manual_seed(0)
    cfg = Gemma3TextConfig(vocab_size=V, hidden_size=D, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=1, head_dim=32, max_position_embeddings=256, sliding_window=16,
                           query_pre_attn_scalar=32, bos_token_id=2, eos_token_id=1, pad_token_id=0)
    ref = Gemma3ForCausalLM(cfg).eval()
    path = tmp_path_factory.mktemp("gguf") / "tiny-gemma3.gguf"
    w = gguf.GGUFWriter(str(path), "gemma3")
    for add, v in ((w.add_block_count, 2), (w.add_embedding_length, D), (w.add_feed_forward_length, 128),
                   (w.add_head_count, 4), (w.add_head_count_kv, 1), (w.add_key_length, 32), (w.add_value_length, 32),
                   (w.add_layer_norm_rms_eps, 1e-6), (w.add_context_length, 256), (w.add_rope_freq_base, 1e6),
                   (w.add_sliding_window, 16)):
        add(v)
    pieces = ["<pad>", "<eos>", "<bos>", "<unk>"] + [f"<0x{i:02X}>" for i in range(256)] + \
        ["\u2581" + c for c in "abcdefghijklmnopqrstuvwxyz"] + list("abcdefghijklmnopqrstuvwxyz") + ["\u2581"] + \
        ["ab", "cd", "ef", "\u2581a", "\u2581b", "\u2581c", "gh"]
    assert len(pieces) == V
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores([0.0] * 260 + [-float(i) for i in range(V - 260)])
    w.add_token_types([3, 3, 3, 2] + [6] * 256 + [1] * (V - 260))
    w.add_bos_token_id(2)
    w.add_eos_token_id(1)
    w.add_add_bos_token(True)
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in ref.state_dict().items()}
    deq = {}

    def put(name, arr, qtype):
        if qtype is None:
            w.add_tensor(name, arr)
            return arr
        raw = quants.quantize(arr, qtype)
        w.add_tensor(name, raw, raw_dtype=qtype)
        return quants.dequantize(raw, qtype).reshape(arr.shape)
    deq["model.embed_tokens.weight"] = put("token_embd.weight", sd["model.embed_tokens.weight"], Q.Q8_0)
    put("output_norm.weight", sd["model.norm.weight"] + 1.0, None)  # GGUF stores Gemma's 1 + w
    for i in range(2):
        for hf, (name, qtype) in GGUF_NAMES.items():
            k = f"model.layers.{i}.{hf}.weight"
            if qtype is None:
                put(f"blk.{i}.{name}.weight", sd[k] + 1.0, None)
            else:
                deq[k] = put(f"blk.{i}.{name}.weight", sd[k], qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with torch.no_grad():  # the reference runs exactly the values the file holds
        for k, v in deq.items():
            ref.state_dict()[k].copy_(torch.from_numpy(np.ascontiguousarray(v)))
    return path, ref


def test_gguf_gemma3_matches_transformers(gemma_gguf):
    path, ref = gemma_gguf
    m = llm.load(str(path))
    ids = [2] + list(np.random.default_rng(1).integers(4, V, 24))  # longer than the sliding window
    with torch.no_grad():
        want = ref(torch.tensor([ids])).logits[0].numpy()
    got = m.forward(ids)
    span = want.max() - want.min()
    assert np.abs(got - want).max() < 0.03 * span  # activations are rounded to int8 inside the GEMM
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.9
    assert m.tokenizer.encode("abc")[0] == 2  # the embedded vocabulary, with <bos>


def test_gguf_load_errors(tmp_path):
    from express import ModelError
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 20)
    with pytest.raises(ModelError, match="bad.gguf"):
        llm.load(str(bad))
    with pytest.raises(ModelError, match="GGUF model"):
        llm.load(str(bad), quant_bits=4)
