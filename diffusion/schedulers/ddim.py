"""DDIM (Song et al. 2020), as diffusers' DDIMScheduler."""
from __future__ import annotations

import numpy as np

from express import ModelError

from .base import COMMON, Scheduler, SchedulerOutput, as_noise, spaced_timesteps


class DDIMScheduler(Scheduler):
    """Denoising diffusion implicit models; `eta=0` is deterministic.

    >>> import numpy as np
    >>> from diffusion.schedulers import DDIMScheduler
    >>> s = DDIMScheduler(); s.set_timesteps(10)
    >>> x = np.ones((1, 4, 8, 8), np.float32)
    >>> s.step(np.zeros_like(x), s.timesteps[0], x).prev_sample.shape
    (1, 4, 8, 8)
    """
    defaults = dict(COMMON, clip_sample=True, clip_sample_range=1.0, set_alpha_to_one=True,
                    thresholding=False, timestep_spacing="leading")

    def __init__(self, **config):
        super().__init__(**config)
        self.final_alpha_cumprod = np.float32(1.0) if self.config["set_alpha_to_one"] else self.alphas_cumprod[0]
        if self.config.get("thresholding"):
            raise ModelError("DDIMScheduler: thresholding is not supported")

    def set_timesteps(self, num_inference_steps: int) -> None:
        if num_inference_steps > self.config["num_train_timesteps"]:
            raise ModelError(f"DDIMScheduler: {num_inference_steps} steps exceed the "
                             f"{self.config['num_train_timesteps']} training timesteps")
        self.num_inference_steps = num_inference_steps
        self.timesteps = spaced_timesteps(self.config, num_inference_steps)

    def _alpha_prev(self, t):
        return self.alphas_cumprod[t] if t >= 0 else self.final_alpha_cumprod

    def step(self, model_output, timestep, sample, eta: float = 0.0, generator=None, noise=None) -> SchedulerOutput:
        self._check_set()
        t = int(timestep)
        prev = t - self.config["num_train_timesteps"] // self.num_inference_steps
        a_t, a_prev = self.alphas_cumprod[t], self._alpha_prev(prev)
        x0 = self._x0(model_output, sample, a_t)
        kind = self.config["prediction_type"]
        eps = (model_output if kind == "epsilon" else
               a_t ** 0.5 * model_output + (1 - a_t) ** 0.5 * sample if kind == "v_prediction" else
               (sample - a_t ** 0.5 * x0) / (1 - a_t) ** 0.5)
        if self.config["clip_sample"]:
            r = self.config["clip_sample_range"]
            x0 = np.clip(x0, -r, r)
        var = (1 - a_prev) / (1 - a_t) * (1 - a_t / a_prev)
        std = eta * var ** 0.5
        prev_sample = a_prev ** 0.5 * x0 + (1 - a_prev - std ** 2) ** 0.5 * eps
        if eta > 0:
            prev_sample = prev_sample + std * as_noise(noise, generator, np.shape(sample))
        return SchedulerOutput(prev_sample.astype(np.float32), x0)
