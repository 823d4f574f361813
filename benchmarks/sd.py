"""Stable Diffusion 1.5 shapes on Express against diffusers + PyTorch (CPU, fp32), in one run:
the UNet step at 512x512 with classifier-free guidance (batch 2) and at 256x256, the VAE decode
of a 512x512 image, the CLIP text encoder; seconds per call (best of interleaved runs) and peak RSS. Random
weights with the exact SD 1.5 configs (nothing is downloaded).

    python benchmarks/sd.py [--threads 2] [--repeat 3] [--skip-torch] [--generate-rss] [--attention]

Targets: UNet step >= 1.5x faster than diffusers + torch at 2 threads; peak RSS of a full
512x512 generation with fp16 weights (`--generate-rss`, a fresh process) under 4 GB.
`--attention`: only the UNet's attention shapes, F.scaled_dot_product_attention against torch's."""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

import express as ex

UNET = {"act_fn": "silu", "attention_head_dim": 8, "block_out_channels": [320, 640, 1280, 1280],
        "center_input_sample": False, "cross_attention_dim": 768,
        "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
        "downsample_padding": 1, "flip_sin_to_cos": True, "freq_shift": 0, "in_channels": 4, "layers_per_block": 2,
        "mid_block_scale_factor": 1, "norm_eps": 1e-05, "norm_num_groups": 32, "out_channels": 4, "sample_size": 64,
        "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"]}
VAE = {"act_fn": "silu", "block_out_channels": [128, 256, 512, 512],
       "down_block_types": ["DownEncoderBlock2D"] * 4, "in_channels": 3, "latent_channels": 4, "layers_per_block": 2,
       "norm_num_groups": 32, "out_channels": 3, "sample_size": 512, "scaling_factor": 0.18215,
       "up_block_types": ["UpDecoderBlock2D"] * 4}
TEXT = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
        "max_position_embeddings": 77, "vocab_size": 49408, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5,
        "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1, "projection_dim": 768}
SCHEDULER = {"_class_name": "PNDMScheduler", "beta_end": 0.012, "beta_schedule": "scaled_linear",
             "beta_start": 0.00085, "num_train_timesteps": 1000, "set_alpha_to_one": False, "skip_prk_steps": True,
             "steps_offset": 1, "trained_betas": None, "clip_sample": False}


def peak_rss_mb() -> float:
    """This process's peak resident memory: VmHWM (reset by exec, unlike ru_maxrss) where Linux has it."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timeit(fns, repeat):
    """Best-of-`repeat` seconds per call of each function, the runs interleaved (a, b, a, b, ...)
    so that load from other processes falls on both alike; one warm-up call each."""
    fns = [f for f in fns if f is not None]
    for f in fns:
        f()
    runs = [[] for _ in fns]
    for _ in range(repeat):
        for f, r in zip(fns, runs):
            t = time.perf_counter()
            f()
            r.append(time.perf_counter() - t)
    return [min(r) for r in runs]


def random_state(shapes: dict, seed: int, dtype=np.float32) -> dict:
    """Random weights for every parameter: norms near 1, the rest small (std 0.02)."""
    rng = np.random.default_rng(seed)
    out = {}
    for k, shape in shapes.items():
        a = rng.standard_normal(shape, dtype=np.float32) * 0.02
        if "norm" in k and k.endswith("weight"):
            a += 1
        out[k] = a.astype(dtype)
    return out


def our_models():
    from diffusion.models import AutoencoderKL, CLIPTextModel, UNet2DConditionModel
    return CLIPTextModel(TEXT), UNet2DConditionModel(UNET), AutoencoderKL(VAE)


def bench(args):
    import express.nn.functional as F  # noqa: F401
    ex.set_num_threads(args.threads)
    te, unet, vae = our_models()
    rows = []
    torch_models = None
    if not args.skip_torch:
        import diffusers
        import torch
        import transformers
        torch.set_num_threads(args.threads)
        torch.manual_seed(0)
        t_unet = diffusers.UNet2DConditionModel(**UNET).eval()
        t_vae = diffusers.AutoencoderKL(**VAE).eval()
        t_te = transformers.CLIPTextModel(transformers.CLIPTextConfig(**TEXT)).eval()
        torch_models = t_te, t_unet, t_vae
        for ours, theirs in zip((te, unet, vae), torch_models):  # the same weights in both
            sd = {k: v.detach().numpy() for k, v in theirs.state_dict().items()}
            ours.load_weights(ours.sanitize(sd) if hasattr(ours, "sanitize") else sd)
    else:
        for m, seed in ((te, 0), (unet, 1), (vae, 2)):
            m.load_weights(random_state({k: v.shape for k, v in m.named_parameters().items()}, seed))
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 49000, (2, 77))
    ctx = rng.standard_normal((2, 77, 768), dtype=np.float32)
    step = ex.compile(lambda x, tf, c: unet(x, None, c, t_features=tf))
    dec = ex.compile(lambda z: vae.decode(z))
    enc = ex.compile(lambda i: te(i))
    torch = None
    if torch_models:
        import torch
        torch.set_grad_enabled(False)
    z = rng.standard_normal((1, 4, 64, 64), dtype=np.float32)
    cases = []
    for name, shape in [("UNet step 512x512, CFG batch 2", (2, 4, 64, 64)),
                        ("UNet step 256x256, CFG batch 2", (2, 4, 32, 32))]:
        x = rng.standard_normal(shape, dtype=np.float32)
        tf = unet.time_features(500, shape[0])
        cases.append((name, lambda x=x, tf=tf: step(x, tf, ctx).numpy(),
                      torch and (lambda x=x: torch_models[1](torch.from_numpy(x), 500, torch.from_numpy(ctx)).sample)))
    cases.append(("VAE decode 512x512", lambda: dec(z).numpy(),
                  torch and (lambda: torch_models[2].decode(torch.from_numpy(z)).sample)))
    cases.append(("CLIP text encoder, 2 x 77 tokens", lambda: enc(ids).numpy(),
                  torch and (lambda: torch_models[0](torch.from_numpy(ids)).last_hidden_state)))
    for name, ours, theirs in cases:
        t = timeit([ours, theirs], args.repeat)
        rows.append((name, t[0], t[1] if len(t) > 1 else None))
        print(f"  {name}: {t}", file=sys.stderr, flush=True)

    print(f"\nStable Diffusion 1.5 shapes, {args.threads} threads, fp32 weights (random), best of {args.repeat} "
          "interleaved runs")
    print(f"{'':36s} {'express s':>10s} {'torch s':>10s} {'speedup':>8s}")
    for name, a, b in rows:
        print(f"{name:36s} {a:10.3f} {b if b is not None else float('nan'):10.3f} "
              f"{(b / a) if b else float('nan'):7.2f}x")
    print(f"peak RSS of this process (both engines' weights): {peak_rss_mb():.0f} MB")


def attention_shapes():
    """(label, batch, heads, Lq, Lk, head dim) of every attention in the UNet step: self-attention at
    each level of the 512x512 and 256x256 latents (8 heads of 320/640/1280 channels) and the
    cross-attention over 77 text tokens."""
    out = []
    for res, side in ((512, 64), (256, 32)):
        for lvl, d in enumerate((40, 80, 160, 160)):
            lq = (side >> lvl) ** 2
            out += [(f"{res} self", 2, 8, lq, lq, d), (f"{res} cross", 2, 8, lq, 77, d)]
    return out


def bench_attention(args):
    """Side by side, per UNet attention shape: seconds per call, ours and torch's SDPA."""
    import torch
    import express.nn.functional as F
    ex.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    sdpa = ex.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v))
    print(f"\nscaled_dot_product_attention, SD 1.5 UNet shapes, {args.threads} threads, best of {args.repeat}")
    print(f"{'shape (B, H, Lq, Lk, D)':34s} {'express ms':>10s} {'torch ms':>10s} {'speedup':>8s}")
    for label, b, h, lq, lk, d in attention_shapes():
        q = rng.standard_normal((b, h, lq, d), dtype=np.float32)
        k, v = (rng.standard_normal((b, h, lk, d), dtype=np.float32) for _ in range(2))
        tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
        np.testing.assert_allclose(sdpa(q, k, v).numpy(), torch.nn.functional.scaled_dot_product_attention(
            tq, tk, tv).numpy(), rtol=1e-3, atol=1e-4)
        t = timeit([lambda: sdpa(q, k, v).numpy(),
                    lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv)], args.repeat)
        print(f"{label + str((b, h, lq, lk, d)):34s} {t[0] * 1e3:10.2f} {t[1] * 1e3:10.2f} {t[1] / t[0]:7.2f}x",
              flush=True)


def write_folder(root):
    """A diffusers folder with SD 1.5 shapes, random fp16 weights and a byte-level vocabulary."""
    from safetensors.numpy import save_file
    te, unet, vae = our_models()
    for name, m, cfg, file, seed in (("text_encoder", te, TEXT, "model.fp16.safetensors", 0),
                                     ("unet", unet, UNET, "diffusion_pytorch_model.fp16.safetensors", 1),
                                     ("vae", vae, VAE, "diffusion_pytorch_model.fp16.safetensors", 2)):
        os.makedirs(os.path.join(root, name))
        with open(os.path.join(root, name, "config.json"), "w") as f:
            json.dump(cfg, f)
        shapes = {k: v.shape for k, v in m.named_parameters().items()}
        save_file(random_state(shapes, seed, np.float16), os.path.join(root, name, file))
        del m
    os.makedirs(os.path.join(root, "scheduler"))
    with open(os.path.join(root, "scheduler", "scheduler_config.json"), "w") as f:
        json.dump(SCHEDULER, f)
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:] + [256 + i for i in range(256 - len(bs))]
    bs += [b for b in range(256) if b not in bs]
    chars = [chr(c) for c in cs]
    vocab = {t: i for i, t in enumerate(chars + [c + "</w>" for c in chars] + ["<|startoftext|>", "<|endoftext|>"])}
    os.makedirs(os.path.join(root, "tokenizer"))
    with open(os.path.join(root, "tokenizer", "vocab.json"), "w") as f:
        json.dump(vocab, f)
    with open(os.path.join(root, "tokenizer", "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
    with open(os.path.join(root, "model_index.json"), "w") as f:
        json.dump({"_class_name": "StableDiffusionPipeline", "scheduler": ["diffusers", "PNDMScheduler"]}, f)


def generate_rss(args):
    """In a fresh process: load fp16 weights, generate one 512x512 image; report time and peak RSS."""
    if args.child:
        import diffusion
        ex.set_num_threads(args.threads)
        t0 = time.perf_counter()
        pipe = diffusion.StableDiffusionPipeline.from_pretrained(args.child, dtype="float16")
        t1 = time.perf_counter()
        rss_loaded = peak_rss_mb()
        pipe("a photo of an astronaut riding a horse", height=512, width=512, num_inference_steps=args.steps,
             seed=0, progress=False)
        t2 = time.perf_counter()
        print(json.dumps({"load_s": t1 - t0, "generate_s": t2 - t1, "rss_loaded_mb": rss_loaded,
                          "peak_rss_mb": peak_rss_mb(), "steps": args.steps}))
        return
    with tempfile.TemporaryDirectory() as root:
        write_folder(root)
        r = subprocess.run([sys.executable, __file__, "--generate-rss", "--child", root, "--steps", str(args.steps),
                            "--threads", str(args.threads)], capture_output=True, text=True)
        if r.returncode:
            print(r.stdout, r.stderr)
            raise SystemExit(r.returncode)
        res = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"\nFull 512x512 generation, fp16 weights, CFG, {res['steps']} steps, {args.threads} threads (fresh process)")
    print(f"  load {res['load_s']:.1f} s, generate {res['generate_s']:.1f} s "
          f"({res['generate_s'] / res['steps']:.1f} s/step incl. text encoder and VAE decode)")
    print(f"  peak RSS after load {res['rss_loaded_mb']:.0f} MB, peak RSS overall {res['peak_rss_mb']:.0f} MB "
          f"(target < 4096 MB)")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2, help="steps of the --generate-rss run")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--generate-rss", action="store_true", help="only the full-generation memory run")
    ap.add_argument("--attention", action="store_true", help="only the attention shapes, against torch's SDPA")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.attention:
        bench_attention(args)
    elif args.generate_rss:
        generate_rss(args)
    else:
        bench(args)


if __name__ == "__main__":
    main()
