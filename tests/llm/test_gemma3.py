"""Gemma 3 (sliding-window and global layers, q/k norms, (1 + w) norms, scaled embeddings,
GeGLU, soft-capped logits) against transformers on a tiny random model."""
import numpy as np
import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

import llm


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    torch.manual_seed(0)
    cfg = Gemma3TextConfig(
        vocab_size=320, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=512, rms_norm_eps=1e-6, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention"],
        query_pre_attn_scalar=24, final_logit_softcapping=30.0, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    m = Gemma3ForCausalLM(cfg).eval()
    with torch.no_grad():  # make the norms and embeddings matter
        for n, p in m.named_parameters():
            if "norm" in n:
                p.normal_(0, 0.5)
    d = tmp_path_factory.mktemp("gemma3")
    m.save_pretrained(d)
    return d, m


def test_logits_match_transformers(gemma_dir):
    d, ref = gemma_dir
    ids = np.random.default_rng(0).integers(3, 320, 20)  # longer than the sliding window
    with torch.no_grad():
        want = ref(torch.tensor(ids[None])).logits[0].numpy()
    got = llm.load(str(d)).forward(ids)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert np.abs(want).max() < 30.0  # soft-capped


def test_greedy_generation_matches(gemma_dir):
    d, ref = gemma_dir
    prompt = [1, 17, 99, 4, 250, 31]
    with torch.no_grad():
        want = ref.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False)[0, len(prompt):].tolist()
    model = llm.load(str(d))
    got = list(model.generate_ids(prompt, max_new_tokens=16))
    assert got[:len(want)] == want
