"""PNDM / PLMS (Liu et al. 2022), as diffusers' PNDMScheduler (SD 1.x's default)."""
from __future__ import annotations

import numpy as np

from express import ModelError

from .base import COMMON, Scheduler, SchedulerOutput


class PNDMScheduler(Scheduler):
    """Pseudo numerical methods: Runge-Kutta warm-up steps (unless `skip_prk_steps`), then
    linear multistep.

    >>> from diffusion.schedulers import PNDMScheduler
    >>> s = PNDMScheduler(skip_prk_steps=True, steps_offset=1); s.set_timesteps(4)
    >>> s.timesteps.tolist()
    [751, 501, 501, 251, 1]
    """
    defaults = dict(COMMON, skip_prk_steps=False, set_alpha_to_one=False, timestep_spacing="leading")

    def __init__(self, **config):
        super().__init__(**config)
        self.final_alpha_cumprod = np.float32(1.0) if self.config["set_alpha_to_one"] else self.alphas_cumprod[0]
        self.timesteps = None

    def set_timesteps(self, num_inference_steps: int) -> None:
        T, n = self.config["num_train_timesteps"], num_inference_steps
        self.num_inference_steps = n
        spacing = self.config["timestep_spacing"]
        if spacing == "linspace":
            ts = np.linspace(0, T - 1, n).round().astype(np.int64)
        elif spacing == "leading":
            ts = (np.arange(n) * (T // n)).round() + self.config["steps_offset"]
        elif spacing == "trailing":
            ts = (np.round(np.arange(T, 0, -T / n))[::-1] - 1).astype(np.int64)
        else:
            raise ModelError(f"PNDMScheduler: timestep_spacing {spacing!r} is not supported")
        if self.config["skip_prk_steps"]:
            self.prk_timesteps = np.array([], np.int64)
            self.plms_timesteps = np.concatenate([ts[:-1], ts[-2:-1], ts[-1:]])[::-1].copy()
        else:
            prk = np.array(ts[-4:]).repeat(2) + np.tile(np.array([0, T // n // 2]), 4)
            self.prk_timesteps = prk[:-1].repeat(2)[1:-1][::-1].copy()
            self.plms_timesteps = ts[:-3][::-1].copy()
        self.timesteps = np.concatenate([self.prk_timesteps, self.plms_timesteps]).astype(np.int64)
        self.ets, self.counter, self.cur_model_output, self.cur_sample = [], 0, 0, None

    def step(self, model_output, timestep, sample, **_) -> SchedulerOutput:
        self._check_set()
        if self.counter < len(self.prk_timesteps) and not self.config["skip_prk_steps"]:
            return self._step_prk(model_output, int(timestep), sample)
        return self._step_plms(model_output, int(timestep), sample)

    def _step_prk(self, out, t, sample):
        half = self.config["num_train_timesteps"] // self.num_inference_steps // 2
        prev = t - (0 if self.counter % 2 else half)
        t = self.prk_timesteps[self.counter // 4 * 4]
        k = self.counter % 4
        if k == 0:
            self.cur_model_output = self.cur_model_output + out / 6
            self.ets.append(out)
            self.cur_sample = sample
        elif k in (1, 2):
            self.cur_model_output = self.cur_model_output + out / 3
        else:
            out = self.cur_model_output + out / 6
            self.cur_model_output = 0
        cur = self.cur_sample if self.cur_sample is not None else sample
        self.counter += 1
        return SchedulerOutput(self._prev_sample(cur, t, prev, out))

    def _step_plms(self, out, t, sample):
        if not self.config["skip_prk_steps"] and len(self.ets) < 3:
            raise ModelError("PNDMScheduler: PLMS steps need the Runge-Kutta warm-up steps first")
        delta = self.config["num_train_timesteps"] // self.num_inference_steps
        prev = t - delta
        if self.counter != 1:
            self.ets = self.ets[-3:] + [out]
        else:
            prev, t = t, t + delta
        e = self.ets
        if len(e) == 1 and self.counter == 0:
            self.cur_sample = sample
        elif len(e) == 1 and self.counter == 1:
            out = (out + e[-1]) / 2
            sample, self.cur_sample = self.cur_sample, None
        elif len(e) == 2:
            out = (3 * e[-1] - e[-2]) / 2
        elif len(e) == 3:
            out = (23 * e[-1] - 16 * e[-2] + 5 * e[-3]) / 12
        else:
            out = (55 * e[-1] - 59 * e[-2] + 37 * e[-3] - 9 * e[-4]) / 24
        self.counter += 1
        return SchedulerOutput(self._prev_sample(sample, t, prev, out))

    def _prev_sample(self, sample, t, prev, out):
        a_t = self.alphas_cumprod[t]
        a_prev = self.alphas_cumprod[prev] if prev >= 0 else self.final_alpha_cumprod
        b_t, b_prev = 1 - a_t, 1 - a_prev
        if self.config["prediction_type"] == "v_prediction":
            out = a_t ** 0.5 * out + b_t ** 0.5 * sample
        elif self.config["prediction_type"] != "epsilon":
            raise ModelError(f"PNDMScheduler: prediction_type {self.config['prediction_type']!r} is not supported")
        denom = a_t * b_prev ** 0.5 + (a_t * b_t * a_prev) ** 0.5
        return ((a_prev / a_t) ** 0.5 * sample - (a_prev - a_t) * out / denom).astype(np.float32)
