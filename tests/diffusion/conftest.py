"""A tiny random Stable Diffusion pipeline built with diffusers and saved in the diffusers folder
layout, with a small hand-trained CLIP BPE vocabulary."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")
transformers = pytest.importorskip("transformers")

CORPUS = ("a photo of an astronaut riding a horse on the moon, a painting of a cat in the style of "
          "van gogh; high quality, detailed, 4k! the red fox jumps over the lazy dog's back. "
          "low quality blurry ugly watermark text") * 3


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def tiny_bpe(n_merges=120):
    """CLIP's vocabulary layout (bytes, bytes + "</w>", merges, specials) learned on CORPUS."""
    import re
    b2u = bytes_to_unicode()
    chars = list(b2u.values())
    vocab = chars + [c + "</w>" for c in chars]
    words = {}
    for w in re.findall(r"[a-z]+|[0-9]|[^\sa-z0-9]+", CORPUS.lower()):
        sym = tuple(b2u[b] for b in w.encode())
        sym = sym[:-1] + (sym[-1] + "</w>",)
        words[sym] = words.get(sym, 0) + 1
    merges = []
    for _ in range(n_merges):
        pairs = {}
        for w, f in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] = pairs.get((a, b), 0) + f
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], p))
        merges.append(best)
        vocab.append(best[0] + best[1])
        new = {}
        for w, f in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new[tuple(out)] = f
        words = new
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    return {t: i for i, t in enumerate(vocab)}, merges


def _perturb(model, seed, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * scale)
    return model.eval()


TEXT = dict(bos_token_id=0, eos_token_id=2, hidden_size=32, intermediate_size=37, layer_norm_eps=1e-05,
            num_attention_heads=4, num_hidden_layers=5, pad_token_id=1, vocab_size=1000, hidden_act="quick_gelu")
UNET = dict(block_out_channels=(32, 64), layers_per_block=1, sample_size=16, in_channels=4, out_channels=4,
            down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
            up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), cross_attention_dim=32,
            attention_head_dim=(2, 4), norm_num_groups=8)
VAE = dict(block_out_channels=[32, 64], in_channels=3, out_channels=3,
           down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
           up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"], latent_channels=4, norm_num_groups=8,
           layers_per_block=1, sample_size=32)


def write_tokenizer(folder):
    vocab, merges = tiny_bpe()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(f"{a} {b}" for a, b in merges) + "\n")
    return folder


def build_pipeline(root, text=TEXT, unet=UNET, vae=VAE, seed=0):
    tok_dir = write_tokenizer(root / "_tok")
    tokenizer = transformers.CLIPTokenizer(str(tok_dir / "vocab.json"), str(tok_dir / "merges.txt"),
                                           model_max_length=77)
    vocab = json.loads((tok_dir / "vocab.json").read_text())
    text = dict(text, vocab_size=max(text["vocab_size"], len(vocab)), eos_token_id=vocab["<|endoftext|>"],
                bos_token_id=vocab["<|startoftext|>"], pad_token_id=vocab["<|endoftext|>"])
    torch.manual_seed(seed)
    te = _perturb(transformers.CLIPTextModel(transformers.CLIPTextConfig(**text)), seed)
    un = _perturb(diffusers.UNet2DConditionModel(**unet), seed + 1)
    va = _perturb(diffusers.AutoencoderKL(**vae), seed + 2)
    sched = diffusers.PNDMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                                    skip_prk_steps=True, steps_offset=1, set_alpha_to_one=False)
    pipe = diffusers.StableDiffusionPipeline(vae=va, text_encoder=te, tokenizer=tokenizer, unet=un, scheduler=sched,
                                             safety_checker=None, feature_extractor=None,
                                             requires_safety_checker=False)
    pipe.save_pretrained(root, safe_serialization=True)
    for name in ("vocab.json", "merges.txt"):  # the classic layout, read by both tokenizers
        (root / "tokenizer" / name).write_bytes((tok_dir / name).read_bytes())
    (root / "tokenizer" / "tokenizer.json").unlink(missing_ok=True)
    # the reference is what diffusers reads back from these files (configs included)
    ref = diffusers.StableDiffusionPipeline.from_pretrained(root, safety_checker=None, requires_safety_checker=False)
    ref.set_progress_bar_config(disable=True)
    return ref


@pytest.fixture(scope="session")
def sd_folder(tmp_path_factory):
    """(path, diffusers pipeline) of a tiny random SD pipeline saved to disk."""
    root = tmp_path_factory.mktemp("tiny-sd")
    pipe = build_pipeline(root)
    return root, pipe
