"""Latent consistency models (Luo et al. 2023), as diffusers' LCMScheduler: few-step sampling."""
from __future__ import annotations

import numpy as np

from express import ModelError

from .base import COMMON, Scheduler, SchedulerOutput, as_noise


class LCMScheduler(Scheduler):
    """Consistency sampling over a subset of `original_inference_steps` training timesteps; noise
    is re-injected between steps (from `generator`, or `noise`).

    >>> from diffusion.schedulers import LCMScheduler
    >>> s = LCMScheduler(); s.set_timesteps(4); s.timesteps.tolist()
    [999, 759, 499, 259]
    """
    defaults = dict(COMMON, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                    original_inference_steps=50, clip_sample=False, clip_sample_range=1.0,
                    set_alpha_to_one=True, thresholding=False, timestep_spacing="leading", timestep_scaling=10.0)

    def __init__(self, **config):
        super().__init__(**config)
        self.final_alpha_cumprod = np.float32(1.0) if self.config["set_alpha_to_one"] else self.alphas_cumprod[0]

    def set_timesteps(self, num_inference_steps: int, strength: float = 1.0) -> None:
        T, orig = self.config["num_train_timesteps"], self.config["original_inference_steps"]
        origin = np.arange(1, int(orig * strength) + 1) * (T // orig) - 1
        skip = len(origin) // num_inference_steps
        if skip < 1 or num_inference_steps > orig:
            raise ModelError(f"LCMScheduler: {num_inference_steps} steps exceed the {int(orig * strength)} "
                             f"steps of the original schedule (original_inference_steps x strength)")
        self.num_inference_steps = num_inference_steps
        origin = origin[::-1].copy()
        idx = np.floor(np.linspace(0, len(origin), num=num_inference_steps, endpoint=False)).astype(np.int64)
        self.timesteps = origin[idx]
        self._step_index = self._begin_index = None

    def step(self, model_output, timestep, sample, generator=None, noise=None) -> SchedulerOutput:
        self._check_set()
        self._init_step_index(timestep)
        t = int(timestep)
        nxt = self._step_index + 1
        prev = int(self.timesteps[nxt]) if nxt < len(self.timesteps) else t
        a_t = self.alphas_cumprod[t]
        a_prev = self.alphas_cumprod[prev] if prev >= 0 else self.final_alpha_cumprod
        st = t * self.config["timestep_scaling"]
        c_skip, c_out = 0.25 / (st ** 2 + 0.25), st / (st ** 2 + 0.25) ** 0.5
        x0 = self._x0(model_output, sample, a_t)
        if self.config["clip_sample"]:
            x0 = np.clip(x0, -self.config["clip_sample_range"], self.config["clip_sample_range"])
        denoised = (c_out * x0 + c_skip * sample).astype(np.float32)
        if self._step_index != self.num_inference_steps - 1:
            z = as_noise(noise, generator, np.shape(sample))
            prev_sample = a_prev ** 0.5 * denoised + (1 - a_prev) ** 0.5 * z
        else:
            prev_sample = denoised
        self._step_index += 1
        return SchedulerOutput(np.asarray(prev_sample, np.float32), denoised)
