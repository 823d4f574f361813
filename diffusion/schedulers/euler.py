"""Euler and Euler ancestral samplers over Karras-style sigmas (k-diffusion), as diffusers'
EulerDiscreteScheduler and EulerAncestralDiscreteScheduler."""
from __future__ import annotations

import numpy as np

from express import ModelError

from .base import COMMON, Scheduler, SchedulerOutput, as_noise, spaced_timesteps


def karras_sigmas(sigma_min: float, sigma_max: float, n: int, rho: float = 7.0) -> np.ndarray:
    """Karras et al. (2022) noise levels: `n` sigmas from sigma_max down to sigma_min."""
    ramp = np.linspace(0, 1, n)
    lo, hi = sigma_min ** (1 / rho), sigma_max ** (1 / rho)
    return (hi + ramp * (lo - hi)) ** rho


def sigma_to_t(sigma, log_sigmas: np.ndarray) -> np.ndarray:
    """The (fractional) training timestep of a noise level, interpolated in log sigma."""
    log_sigma = np.log(np.maximum(sigma, 1e-10))
    dists = log_sigma - log_sigmas[:, None]
    low = np.cumsum(dists >= 0, axis=0).argmax(axis=0).clip(max=log_sigmas.shape[0] - 2)
    lo, hi = log_sigmas[low], log_sigmas[low + 1]
    w = np.clip((lo - log_sigma) / (lo - hi), 0, 1)
    return ((1 - w) * low + w * (low + 1)).reshape(np.shape(sigma))


class SigmaScheduler(Scheduler):
    """Shared by samplers that work in sigma space (x = x0 + sigma * eps)."""

    def __init__(self, **config):
        super().__init__(**config)
        if self.config.get("rescale_betas_zero_snr"):
            self.alphas_cumprod[-1] = 2 ** -24
        self.train_sigmas = np.sqrt((1 - self.alphas_cumprod) / self.alphas_cumprod).astype(np.float32)
        self.sigmas = np.concatenate([self.train_sigmas[::-1], [0]]).astype(np.float32)

    @property
    def init_noise_sigma(self) -> float:
        m = float(self.sigmas.max())
        return m if self.config["timestep_spacing"] in ("linspace", "trailing") else (m ** 2 + 1) ** 0.5

    def scale_model_input(self, sample, timestep) -> np.ndarray:
        """Divide by sqrt(sigma^2 + 1): the UNet expects unit-variance input."""
        self._init_step_index(timestep)
        s = self.sigmas[self._step_index]
        return (sample / (s ** 2 + 1) ** 0.5).astype(np.float32)

    def _final_sigma(self):
        kind = self.config.get("final_sigmas_type", "zero")
        if kind == "sigma_min":
            return float(self.train_sigmas[0])
        if kind == "zero":
            return 0.0
        raise ModelError(f"{type(self).__name__}: final_sigmas_type {kind!r} is not supported")

    def _eps_x0(self, model_output, sample, sigma):
        kind = self.config["prediction_type"]
        if kind == "epsilon":
            return sample - sigma * model_output
        if kind == "v_prediction":
            return model_output * (-sigma / (sigma ** 2 + 1) ** 0.5) + sample / (sigma ** 2 + 1)
        if kind in ("sample", "original_sample"):
            return model_output
        raise ModelError(f"{type(self).__name__}: prediction_type {kind!r} is not supported")

    def add_noise(self, original, noise, timesteps) -> np.ndarray:
        t = np.asarray(timesteps).reshape(-1)
        if self._begin_index is None:
            idx = [self.index_for_timestep(x) for x in t]
        else:
            idx = [self._step_index if self._step_index is not None else self._begin_index] * len(t)
        s = self.sigmas[idx].reshape((-1,) + (1,) * (np.ndim(original) - 1))
        return (original + noise * s).astype(np.float32)


class EulerDiscreteScheduler(SigmaScheduler):
    """First-order Euler steps in sigma; `use_karras_sigmas` for the Karras schedule.

    >>> from diffusion.schedulers import EulerDiscreteScheduler
    >>> s = EulerDiscreteScheduler(); s.set_timesteps(3); s.timesteps.tolist()
    [999.0, 499.5, 0.0]
    """
    defaults = dict(COMMON, interpolation_type="linear", use_karras_sigmas=False, sigma_min=None,
                    sigma_max=None, timestep_spacing="linspace", timestep_type="discrete",
                    final_sigmas_type="zero")

    def set_timesteps(self, num_inference_steps: int) -> None:
        n = self.num_inference_steps = num_inference_steps
        ts = spaced_timesteps(self.config, n, np.float32)
        sig = self.train_sigmas
        log_sigmas = np.log(sig)
        if self.config["interpolation_type"] == "linear":
            sigmas = np.interp(ts, np.arange(len(sig)), sig)
        elif self.config["interpolation_type"] == "log_linear":
            sigmas = np.exp(np.linspace(np.log(sig[-1]), np.log(sig[0]), n + 1)).astype(np.float32)
        else:
            raise ModelError(f"EulerDiscreteScheduler: interpolation_type "
                             f"{self.config['interpolation_type']!r} is not supported")
        if self.config["use_karras_sigmas"]:
            sigmas = karras_sigmas(self.config["sigma_min"] or float(sigmas[-1]),
                                   self.config["sigma_max"] or float(sigmas[0]), n)
            ts = np.array([sigma_to_t(s, log_sigmas) for s in sigmas])
        if self.config["timestep_type"] == "continuous" and self.config["prediction_type"] == "v_prediction":
            raise ModelError("EulerDiscreteScheduler: continuous timesteps are not supported")
        self.sigmas = np.concatenate([sigmas, [self._final_sigma()]]).astype(np.float32)
        self.timesteps = ts.astype(np.float32)
        self._step_index = self._begin_index = None

    def step(self, model_output, timestep, sample, **_) -> SchedulerOutput:
        self._check_set()
        self._init_step_index(timestep)
        sample = np.asarray(sample, np.float32)
        sigma = self.sigmas[self._step_index]
        x0 = self._eps_x0(model_output, sample, sigma)
        prev = sample + (sample - x0) / sigma * (self.sigmas[self._step_index + 1] - sigma)
        self._step_index += 1
        return SchedulerOutput(prev.astype(np.float32), x0)


class EulerAncestralDiscreteScheduler(SigmaScheduler):
    """Euler steps to a lower sigma plus fresh noise (from `generator`, or `noise`).

    >>> from diffusion.schedulers import EulerAncestralDiscreteScheduler
    >>> s = EulerAncestralDiscreteScheduler(); s.set_timesteps(2); s.timesteps.tolist()
    [999.0, 0.0]
    """
    defaults = dict(COMMON, timestep_spacing="linspace")

    def set_timesteps(self, num_inference_steps: int) -> None:
        self.num_inference_steps = num_inference_steps
        ts = spaced_timesteps(self.config, num_inference_steps, np.float32)
        sigmas = np.interp(ts, np.arange(len(self.train_sigmas)), self.train_sigmas)
        self.sigmas = np.concatenate([sigmas, [0.0]]).astype(np.float32)
        self.timesteps = ts
        self._step_index = self._begin_index = None

    def step(self, model_output, timestep, sample, generator=None, noise=None) -> SchedulerOutput:
        self._check_set()
        self._init_step_index(timestep)
        sample = np.asarray(sample, np.float32)
        s_from, s_to = self.sigmas[self._step_index], self.sigmas[self._step_index + 1]
        if self.config["prediction_type"] == "sample":
            raise ModelError("EulerAncestralDiscreteScheduler: prediction_type 'sample' is not supported")
        x0 = self._eps_x0(model_output, sample, s_from)
        s_up = (s_to ** 2 * (s_from ** 2 - s_to ** 2) / s_from ** 2) ** 0.5
        s_down = (s_to ** 2 - s_up ** 2) ** 0.5
        prev = sample + (sample - x0) / s_from * (s_down - s_from)
        prev = prev + as_noise(noise, generator, sample.shape) * s_up
        self._step_index += 1
        return SchedulerOutput(prev.astype(np.float32), x0)
