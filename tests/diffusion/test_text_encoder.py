"""Tokenizer against transformers' CLIPTokenizer, text encoder against CLIPTextModel."""
import numpy as np
import pytest

import express as ex
from diffusion.models import CLIPTextModel
from diffusion.tokenizer import CLIPTokenizer
from diffusion.weights import load_component, read_json

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

PROMPTS = ["a photo of an astronaut riding a horse on the moon", "", "A  Painting\tof a CAT, 4k!!  ",
           "the lazy dog's back <|endoftext|> unknown-wörds ünïcode 😀", "x " * 100]


def test_tokenizer_matches_transformers(sd_folder):
    root, pipe = sd_folder
    ours = CLIPTokenizer.from_pretrained(root / "tokenizer")
    ref = transformers.CLIPTokenizer.from_pretrained(str(root / "tokenizer"))
    want = ref(PROMPTS, padding="max_length", max_length=ref.model_max_length, truncation=True,
               return_tensors="np").input_ids
    got = ours(PROMPTS)
    assert got.shape == (len(PROMPTS), 77)
    np.testing.assert_array_equal(got, want)
    assert ours.decode(got[0]) == ref.decode(want[0], skip_special_tokens=True)


@pytest.mark.parametrize("clip_skip", [None, 1, 2])
def test_text_encoder_matches_transformers(sd_folder, clip_skip):
    root, pipe = sd_folder
    model = load_component(CLIPTextModel(read_json(root / "text_encoder" / "config.json")), root / "text_encoder")
    ids = CLIPTokenizer.from_pretrained(root / "tokenizer")(PROMPTS[:3])
    with torch.no_grad():
        out = pipe.text_encoder(torch.from_numpy(ids), output_hidden_states=True)
        te = getattr(pipe.text_encoder, "text_model", pipe.text_encoder)
        want = out.last_hidden_state if clip_skip is None else te.final_layer_norm(out.hidden_states[-(clip_skip + 1)])
        pooled = out.pooler_output
    got, got_pooled = model(ids, clip_skip=clip_skip, pooled=True)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)
    if clip_skip is None:
        np.testing.assert_allclose(got_pooled.numpy(), pooled.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("act", ["gelu"])
def test_openclip_shape(tmp_path, act):
    """SD 2.x's encoder: gelu, pad token "!" (id 0), more heads."""
    cfg = transformers.CLIPTextConfig(hidden_size=64, intermediate_size=96, num_attention_heads=8,
                                      num_hidden_layers=3, vocab_size=300, hidden_act=act, eos_token_id=299,
                                      bos_token_id=298, pad_token_id=0)
    torch.manual_seed(0)
    ref = transformers.CLIPTextModel(cfg).eval()
    sd = {k: v.numpy() for k, v in ref.state_dict().items()}
    model = CLIPTextModel(cfg.to_dict())
    model.load_weights(model.sanitize(sd))
    ids = np.random.default_rng(0).integers(0, 299, (2, 77))
    ids[:, 0], ids[:, 10] = 298, 299
    with torch.no_grad():
        want = ref(torch.from_numpy(ids)).last_hidden_state.numpy()
    np.testing.assert_allclose(model(ids).numpy(), want, rtol=1e-4, atol=1e-4)
    half = model.astype(ex.float16)
    np.testing.assert_allclose(half(ids).numpy().astype(np.float32), want, atol=3e-2)
