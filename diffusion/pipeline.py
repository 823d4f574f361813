"""StableDiffusionPipeline: text-to-image and image-to-image from a diffusers folder.

>>> import diffusion
>>> pipe = diffusion.StableDiffusionPipeline.from_pretrained("path/to/sd15", dtype="float16")  # doctest: +SKIP
>>> out = pipe("a photo of a cat", num_inference_steps=20, seed=0)                              # doctest: +SKIP
>>> out.images[0].save("cat.png")                                                                # doctest: +SKIP
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

import express as ex
from express import ModelError

from .models import AutoencoderKL, CLIPTextModel, UNet2DConditionModel
from .schedulers import Scheduler, get_scheduler
from .tokenizer import CLIPTokenizer
from .weights import component_dir, load_component, read_json, release_pages, weight_files


@dataclass
class PipelineOutput:
    images: list | np.ndarray          # PIL images, or [B, H, W, 3] float32 in [0, 1] ("np")
    latents: np.ndarray | None = None  # the final latents (output_type="latent" returns only these)


def _variant_for(folder, dtype) -> str | None:
    """The "fp16" weight files when loading in float16 and the folder has them."""
    if dtype is not ex.float16:
        return None
    try:
        files = weight_files(folder, "fp16")
    except ModelError:
        return None
    return "fp16" if any(".fp16." in os.path.basename(f) for f in files) else None


def _to_pil(images: np.ndarray):
    from PIL import Image
    return [Image.fromarray((im * 255).round().astype(np.uint8)) for im in images]


def _image_array(image, height, width) -> np.ndarray:
    """An init image (PIL, or HWC / BHWC array in [0, 1] or uint8) as [B, 3, H, W] in [-1, 1]."""
    from PIL import Image
    if isinstance(image, Image.Image):
        image = image.convert("RGB")
        if height and width and image.size != (width, height):
            image = image.resize((width, height), Image.LANCZOS)
        a = np.asarray(image, np.float32) / 255.0
    else:
        a = np.asarray(image)
        a = a.astype(np.float32) / 255.0 if a.dtype == np.uint8 else a.astype(np.float32)
    if a.ndim == 3:
        a = a[None]
    if a.ndim != 4 or a.shape[-1] != 3:
        raise ModelError(f"init image must be PIL, [H, W, 3] or [B, H, W, 3], got shape {a.shape}")
    return np.ascontiguousarray(a.transpose(0, 3, 1, 2) * 2 - 1)


class StableDiffusionPipeline:
    """Stable Diffusion 1.x / 2.x: CLIP text encoder, UNet, VAE and a NumPy scheduler.

    Call it with a prompt for text-to-image, or with `image=` and `strength=` for image-to-image.
    Randomness comes from NumPy's Generator seeded by `seed`, so a seed gives the same image on
    every run and thread count; `latents=` (text-to-image) or `noise=` (image-to-image) take
    the initial noise explicitly."""

    def __init__(self, text_encoder, tokenizer, unet, vae, scheduler_config: dict, dtype=ex.float32):
        self.text_encoder, self.tokenizer, self.unet, self.vae = text_encoder, tokenizer, unet, vae
        self.scheduler_config = dict(scheduler_config)
        self.dtype = dtype
        # float32: one compiled plan per shape (fast replay). Half-precision weights: low-memory
        # mode, evaluated block by block, and the UNet's mapped pages are released before the
        # VAE decode, so one large model is resident at a time.
        self.low_memory = dtype is not ex.float32
        self._unet_step = self._unet_fn if self.low_memory else ex.compile(self._unet_fn)

    @classmethod
    def from_pretrained(cls, path, dtype="float32", variant: str | None = None) -> "StableDiffusionPipeline":
        """Load a diffusers Stable Diffusion folder. `dtype="float16"` keeps the weights in half
        precision (read from the "fp16" variant files when present) and computes in float32."""
        root = os.fspath(path)
        if not os.path.isdir(root):
            raise ModelError(f"StableDiffusionPipeline: no such folder {root!r}")
        index_path = os.path.join(root, "model_index.json")
        if not os.path.isfile(index_path):
            raise ModelError(f"StableDiffusionPipeline: {root!r} has no model_index.json (not a diffusers folder)")
        index = read_json(index_path)
        d = ex.dtypes.as_dtype(dtype)
        if d not in (ex.float32, ex.float16, ex.bfloat16):
            raise ModelError(f"StableDiffusionPipeline: dtype must be float32, float16 or bfloat16, not {d.name}")
        dirs = {n: component_dir(root, n) for n in ("text_encoder", "tokenizer", "unet", "vae", "scheduler")}

        def load(model_cls, name):
            cfg = read_json(os.path.join(dirs[name], "config.json"))
            v = variant or _variant_for(dirs[name], d)
            return load_component(model_cls(cfg), dirs[name], v, dtype=d)

        te = load(CLIPTextModel, "text_encoder")
        unet = load(UNet2DConditionModel, "unet")
        vae = load(AutoencoderKL, "vae")
        sched = read_json(os.path.join(dirs["scheduler"], "scheduler_config.json"))
        if "scheduler" in index and isinstance(index["scheduler"], list):
            sched.setdefault("_class_name", index["scheduler"][1])
        return cls(te, CLIPTokenizer.from_pretrained(dirs["tokenizer"]), unet, vae, sched, d)

    # ---- pieces ----
    def get_scheduler(self, scheduler=None) -> Scheduler:
        """The folder's scheduler, or another one by name over the folder's config, or an instance."""
        if isinstance(scheduler, Scheduler):
            return scheduler
        return get_scheduler(scheduler, self.scheduler_config)

    def encode_prompt(self, prompt, negative_prompt=None, guidance: bool = True, clip_skip=None) -> np.ndarray:
        """Text embeddings [B, 77, dim]; with `guidance`, [negative..., prompt...] stacked (2B rows)."""
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        if not prompts or not all(isinstance(p, str) for p in prompts):
            raise ModelError("prompt must be a string or a list of strings")
        texts = prompts
        if guidance:
            neg = negative_prompt if negative_prompt is not None else ""
            negs = [neg] * len(prompts) if isinstance(neg, str) else list(neg)
            if len(negs) != len(prompts):
                raise ModelError(f"negative_prompt has {len(negs)} entries for {len(prompts)} prompts")
            texts = negs + prompts
        ids = self.tokenizer(texts)
        return np.asarray(self.text_encoder(ids, clip_skip=clip_skip).numpy(), np.float32)

    def _unet_fn(self, x, tf, ctx, cond=None):
        return self.unet(x, None, ctx, timestep_cond=cond, t_features=tf, low_memory=self.low_memory)

    def predict_noise(self, latents, t, embeds, guidance_scale, cond=None) -> np.ndarray:
        """The UNet's output at timestep t; with guidance, one batch of [uncond; cond] combined."""
        guided = embeds.shape[0] == 2 * latents.shape[0]
        x = np.concatenate([latents, latents]) if guided else latents
        tf = self.unet.time_features(t, x.shape[0])
        args = (x.astype(np.float32), tf, embeds) + (() if cond is None else (cond,))
        eps = np.asarray(self._unet_step(*args).numpy(), np.float32)
        if not guided:
            return eps
        uncond, text = np.split(eps, 2)
        return uncond + guidance_scale * (text - uncond)

    def decode_latents(self, latents, tile: bool | None = None) -> np.ndarray:
        """Latents -> images [B, H, W, 3] in [0, 1]; tiles when larger than the VAE's sample size
        (or when `tile=True`)."""
        c = self.vae.config
        z = latents / c.scaling_factor + (c.shift_factor or 0.0)
        big = max(z.shape[-2:]) > self.vae.tile_latent_size
        if tile or (tile is None and big):
            img = self.vae.tiled_decode(z)
        else:
            img = self.vae.decode(np.ascontiguousarray(z, np.float32)).numpy()
        return np.clip(np.asarray(img, np.float32) / 2 + 0.5, 0, 1).transpose(0, 2, 3, 1)

    def encode_image(self, image) -> np.ndarray:
        """[B, 3, H, W] images in [-1, 1] -> scaled latents (the mean of the posterior)."""
        mean, _ = self.vae.encode(image)
        c = self.vae.config
        return ((mean.numpy() - (c.shift_factor or 0.0)) * c.scaling_factor).astype(np.float32)

    # ---- the loop ----
    def __call__(self, prompt, negative_prompt=None, height: int | None = None, width: int | None = None,
                 num_inference_steps: int = 50, guidance_scale: float = 7.5, seed: int | None = None,
                 latents=None, scheduler=None, output_type: str = "pil", image=None, strength: float = 0.8,
                 noise=None, eta: float = 0.0, clip_skip: int | None = None, num_images_per_prompt: int = 1,
                 callback=None, progress: bool = True, tile: bool | None = None) -> PipelineOutput:
        """Generate images.

        prompt / negative_prompt: a string or a list of strings. height, width: multiples of 8
        (default: the UNet's sample size times the VAE factor; for image-to-image, the image's).
        guidance_scale > 1 runs classifier-free guidance (uncond and cond in one UNet batch).
        seed: NumPy seed for all noise. latents: explicit initial latents [B, 4, h/8, w/8]
        (text-to-image). image, strength: image-to-image from a PIL image / array, skipping the
        first (1 - strength) of the steps; noise: the explicit noise added to the image latents.
        scheduler: a name ("euler", "dpm++2m_karras", ...), an instance, or None for the folder's.
        output_type: "pil", "np" ([B, H, W, 3] in [0, 1]) or "latent". callback(step, t, latents)
        runs after every step; return False from it to stop early.
        """
        if output_type not in ("pil", "np", "latent"):
            raise ModelError(f"output_type must be 'pil', 'np' or 'latent', not {output_type!r}")
        if num_inference_steps < 1:
            raise ModelError(f"num_inference_steps must be at least 1, got {num_inference_steps}")
        sched = self.get_scheduler(scheduler)
        rng = np.random.default_rng(seed)
        guided = guidance_scale > 1.0 and self.unet.config.time_cond_proj_dim is None
        prompts = [prompt] if isinstance(prompt, str) else list(prompt)
        if isinstance(negative_prompt, (list, tuple)):
            negative_prompt = [n for n in negative_prompt for _ in range(num_images_per_prompt)]
        prompts = [p for p in prompts for _ in range(num_images_per_prompt)]
        embeds = self.encode_prompt(prompts, negative_prompt, guided, clip_skip)
        batch = len(prompts)
        f = self.vae.scale_factor
        init = None
        if image is not None:
            init = _image_array(image, height, width)
            height, width = init.shape[2], init.shape[3]
        height = height or self.unet.config.sample_size * f
        width = width or self.unet.config.sample_size * f
        if height % 8 or width % 8 or height <= 0 or width <= 0:
            raise ModelError(f"height and width must be positive multiples of 8, got {height}x{width}")
        shape = (batch, self.unet.config.in_channels, height // f, width // f)
        cond = None
        if self.unet.config.time_cond_proj_dim is not None:  # LCM: the guidance scale as an embedding
            from .models.layers import timestep_embedding
            cond = timestep_embedding(np.full(batch, (guidance_scale - 1) * 1000.0), self.unet.config.time_cond_proj_dim,
                                      flip_sin_to_cos=False, shift=1.0)

        if init is None:
            sched.set_timesteps(num_inference_steps)
            timesteps = sched.timesteps
            if latents is None:
                latents = rng.standard_normal(shape, dtype=np.float32)
            latents = np.asarray(latents, np.float32)
            if latents.shape != shape:
                raise ModelError(f"latents must have shape {shape} for {height}x{width}, got {latents.shape}")
            latents = latents * np.float32(sched.init_noise_sigma)
        else:
            if not 0 < strength <= 1:
                raise ModelError(f"strength must be in (0, 1], got {strength}")
            if init.shape[0] not in (1, batch):
                raise ModelError(f"{init.shape[0]} init images for {batch} prompts")
            sched.set_timesteps(num_inference_steps)
            keep = min(int(num_inference_steps * strength), num_inference_steps)
            start = max(num_inference_steps - keep, 0) * sched.order
            timesteps = sched.timesteps[start:]
            if len(timesteps) == 0:
                raise ModelError(f"strength {strength} with {num_inference_steps} steps leaves no step to run")
            sched.set_begin_index(start)
            x0 = self.encode_image(init)
            x0 = np.repeat(x0, batch // x0.shape[0], axis=0)
            noise = rng.standard_normal(x0.shape, dtype=np.float32) if noise is None else np.asarray(noise, np.float32)
            if noise.shape != x0.shape:
                raise ModelError(f"noise must have shape {x0.shape}, got {noise.shape}")
            latents = sched.add_noise(x0, noise, timesteps[:1])

        bar = _progress(len(timesteps), progress)
        extra = {"eta": eta} if "eta" in sched.step.__code__.co_varnames else {}
        for i, t in enumerate(timesteps):
            x_in = sched.scale_model_input(latents, t)
            eps = self.predict_noise(x_in, t, embeds, guidance_scale, cond)
            latents = sched.step(eps, t, latents, generator=rng, **extra).prev_sample
            bar.update(1)
            if callback is not None and callback(i, t, latents) is False:
                break
        bar.close()
        if output_type == "latent":
            return PipelineOutput(latents, latents)
        if self.low_memory:
            release_pages(self.unet)
            release_pages(self.text_encoder)
        images = self.decode_latents(latents, tile)
        return PipelineOutput(images if output_type == "np" else _to_pil(images), latents)

    def img2img(self, prompt, image, strength: float = 0.8, **kwargs) -> PipelineOutput:
        """Image-to-image: `__call__` with an init image."""
        return self(prompt, image=image, strength=strength, **kwargs)


def _progress(total, enabled):
    if not enabled:
        class _Null:
            def update(self, n): pass
            def close(self): pass
        return _Null()
    from tqdm.auto import tqdm
    return tqdm(total=total, desc="denoising", unit="step")
