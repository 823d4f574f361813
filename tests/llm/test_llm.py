"""The LLM runtime against transformers + torch on tiny random models of every family."""
import copy
import json
import os
import shutil

import numpy as np
import pytest
import torch
import transformers

import express as ex
import llm
from llm.sampler import Sampler, SamplerConfig
from llm.tokenizer import StreamDetokenizer

from conftest import FAMILIES, build

ALL = list(FAMILIES)
IDS = [1, 17, 42, 250, 9, 33, 100, 7, 8, 200, 64, 3]


def ref_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].numpy()


def ref_greedy(model, ids, n):
    ids = list(ids)
    out = []
    with torch.no_grad():
        for _ in range(n):
            t = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            out.append(t)
            ids.append(t)
    return out


@pytest.mark.parametrize("family", ALL)
def test_forward_matches_transformers(tiny, family):
    folder, ref = tiny(family)
    m = llm.load(folder)
    ours = m.forward(IDS)
    assert ours.shape == (len(IDS), ref.config.vocab_size) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref_logits(ref, IDS), atol=1e-4, rtol=0)


@pytest.mark.parametrize("family", ALL)
def test_greedy_generation_matches(tiny, family):
    folder, ref = tiny(family)
    m = llm.load(folder, prefill_chunk=4)  # the 12-token prompt runs in three chunks
    got = list(m.generate_ids(IDS, max_new_tokens=10, stop_on_eos=False))
    assert got == ref_greedy(ref, IDS, 10)


def test_bfloat16_checkpoint(tiny, tmp_path):
    _, ref = tiny("qwen2")
    half = copy.deepcopy(ref).to(torch.bfloat16)
    half.save_pretrained(tmp_path)
    # the same bf16 weights computed in fp32 by transformers (rope frequencies recomputed)
    want = ref_logits(transformers.AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32), IDS)
    np.testing.assert_allclose(llm.load(tmp_path).forward(IDS), want, atol=1e-4, rtol=0)


def test_chunked_prefill_and_bucket_crossing(tiny):
    folder, ref = tiny("qwen2")
    m = llm.load(folder, prefill_chunk=100, max_context=300)
    prompt = (IDS * 30)[:250]  # prefill 100 + 100 + 50; decode crosses the 256-slot bucket
    got = list(m.generate_ids(prompt, max_new_tokens=10, stop_on_eos=False))
    assert got == ref_greedy(ref, prompt, 10)
    np.testing.assert_allclose(m.forward(prompt[:120]), ref_logits(ref, prompt[:120]), atol=1e-4, rtol=0)


def test_decode_step_reads_the_plans_logits(tiny):
    """generate_ids' step: one token through the decode plan, logits read from its own buffer
    (valid until the next step); the same numbers as a full forward pass."""
    folder, ref = tiny("qwen3")
    m = llm.load(folder, max_context=300)
    want = ref_logits(ref, IDS)
    m._run(IDS[:3])
    rows = [m._decode(t).copy() for t in IDS[3:]]
    np.testing.assert_allclose(np.stack(rows), want[3:], atol=1e-4, rtol=0)
    assert m.cache.pos == len(IDS) and np.shares_memory(m._decode(5), m._decode(6))  # one buffer, overwritten
    assert not np.shares_memory(m._run([7]), m._run([8]))  # _run copies
    m.reset()
    m._run([1] * 299)
    m._decode(2)  # the last slot
    with pytest.raises(ex.OutOfRangeError, match="context"):
        m._decode(3)


def test_cache_reuse_extends_prompt(tiny):
    folder, ref = tiny("llama")
    m = llm.load(folder)
    list(m.generate_ids(IDS[:6], max_new_tokens=3, stop_on_eos=False))
    # a prompt sharing a prefix with the cache only runs its new part, with the same result
    got = list(m.generate_ids(IDS, max_new_tokens=5, stop_on_eos=False))
    assert got == ref_greedy(ref, IDS, 5)


def test_tokenizer_and_chat_template_match_transformers(tiny):
    folder, _ = tiny("qwen2")
    m = llm.load(folder)
    hf = transformers.AutoTokenizer.from_pretrained(folder)
    text = "Hello world! naïve café, 東京 🙂"
    assert m.tokenizer.encode(text) == hf.encode(text)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello world!"}]
    assert m.tokenizer.apply_chat_template(msgs) == hf.apply_chat_template(msgs, tokenize=False,
                                                                             add_generation_prompt=True)
    ids = hf.apply_chat_template(msgs, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
    assert m.tokenizer.apply_chat_template(msgs, tokenize=True) == list(ids)


def test_streaming_detokenizer_keeps_utf8_whole(tiny):
    folder, _ = tiny("qwen2")
    m = llm.load(folder)
    text = "naïve café, 東京 🙂 emoji"
    ids = m.tokenizer.encode(text)
    d = StreamDetokenizer(m.tokenizer)
    pieces = [d.add(i) for i in ids] + [d.flush()]
    assert "".join(pieces) == m.tokenizer.decode(ids) == text
    assert all("\ufffd" not in p for p in pieces)


def test_generate_stream_equals_text_and_chat(tiny):
    folder, _ = tiny("qwen3")
    m = llm.load(folder)
    full = m.generate("Hello world", max_new_tokens=12)
    m.reset()
    assert "".join(m.generate("Hello world", max_new_tokens=12, stream=True)) == full
    out = m.chat([{"role": "user", "content": "Hello"}], max_new_tokens=6)
    assert isinstance(out, str)


def test_sampling_seeded_and_filters_match_transformers():
    from transformers.generation.logits_process import (MinPLogitsWarper, RepetitionPenaltyLogitsProcessor,
                                                        TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)
    rng = np.random.default_rng(0)
    logits = rng.standard_normal(50).astype(np.float32) * 3
    history = [3, 7, 7, 20]
    cfg = SamplerConfig(temperature=0.7, top_k=20, top_p=0.8, min_p=0.05, repetition_penalty=1.3, seed=5)
    p = Sampler(cfg).probs(logits, history)
    s = torch.tensor(logits)[None].double()
    ids = torch.tensor([history])
    for proc in (RepetitionPenaltyLogitsProcessor(1.3), TemperatureLogitsWarper(0.7), TopKLogitsWarper(20),
                 TopPLogitsWarper(0.8), MinPLogitsWarper(0.05)):
        s = proc(ids, s)
    ref = torch.softmax(s, -1)[0].numpy()
    np.testing.assert_array_equal(p > 0, ref > 0)
    np.testing.assert_allclose(p, ref, atol=1e-6)
    a = [Sampler(cfg).sample(logits, history) for _ in range(3)]
    s1, s2 = Sampler(cfg), Sampler(cfg)
    assert [s1.sample(logits, history) for _ in range(20)] == [s2.sample(logits, history) for _ in range(20)]
    assert all(p[t] > 0 for t in a)
    assert Sampler(SamplerConfig(temperature=1.0, top_k=1, seed=1)).sample(logits, []) == int(np.argmax(logits))


def test_seeded_generation_reproducible(tiny):
    folder, _ = tiny("mistral")
    m = llm.load(folder)
    kw = dict(max_new_tokens=8, temperature=0.9, top_p=0.9, seed=123)
    assert m.generate(IDS, **kw) == m.generate(IDS, **kw)


# ---- bad input ----
def test_missing_shard(tmp_path):
    model = build("llama", str(tmp_path / "src"))
    model.save_pretrained(tmp_path / "sharded", max_shard_size="40KB")
    index = json.loads((tmp_path / "sharded" / "model.safetensors.index.json").read_text())
    shard = sorted(set(index["weight_map"].values()))[1]
    os.remove(tmp_path / "sharded" / shard)
    with pytest.raises(ex.ModelError, match=shard):
        llm.load(tmp_path / "sharded")


def test_sharded_folder_loads(tmp_path, tiny):
    _, ref = tiny("qwen2")
    ref.save_pretrained(tmp_path, max_shard_size="40KB")
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".safetensors")]) > 1
    np.testing.assert_allclose(llm.load(tmp_path).forward(IDS), ref_logits(ref, IDS), atol=1e-4, rtol=0)


def test_unknown_architecture(tmp_path, tiny):
    folder, _ = tiny("llama")
    shutil.copytree(folder, tmp_path / "m")
    cfg = json.loads((tmp_path / "m" / "config.json").read_text())
    cfg["architectures"] = ["FancyNetForCausalLM"]
    (tmp_path / "m" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ex.ModelError, match="FancyNetForCausalLM"):
        llm.load(tmp_path / "m")


def test_prompt_longer_than_context(tiny):
    folder, _ = tiny("llama")
    m = llm.load(folder, max_context=16)
    with pytest.raises(ex.OutOfRangeError, match="context"):
        m.generate(IDS * 2, max_new_tokens=2)
    with pytest.raises(ex.OutOfRangeError, match="context"):
        m.forward(IDS * 2)
    assert len(list(m.generate_ids(IDS, max_new_tokens=50, stop_on_eos=False))) == 16 - len(IDS) + 1


def test_not_a_model_folder(tmp_path):
    with pytest.raises(ex.ModelError, match="config.json"):
        llm.load(tmp_path)


def test_cli_chat_session(tiny, monkeypatch, capsys):
    from llm.__main__ import main
    folder, _ = tiny("qwen2")
    lines = iter(["Hello", "How are you?", "/reset", "Hi"])

    def fake_input(prompt=""):
        try:
            return next(lines)
        except StopIteration:
            raise EOFError from None
    monkeypatch.setattr("builtins.input", fake_input)
    assert main(["chat", folder, "--max-new-tokens", "4", "--max-context", "64"]) == 0
    assert "(history cleared)" in capsys.readouterr().out
