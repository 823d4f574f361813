"""What every scheduler shares: the config (diffusers' scheduler_config.json keys), the beta/alpha
schedule, `add_noise`, and the step output. Everything is NumPy (float32 samples, the schedule in
float32 as diffusers keeps it)."""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass

import numpy as np

from express import ModelError


@dataclass
class SchedulerOutput:
    prev_sample: np.ndarray
    pred_original_sample: np.ndarray | None = None


def betas_for(config: dict) -> np.ndarray:
    """The training betas of a config: linear, scaled_linear, squaredcos_cap_v2, or trained_betas."""
    n, b0, b1 = config["num_train_timesteps"], config["beta_start"], config["beta_end"]
    kind = config["beta_schedule"]
    if config.get("trained_betas") is not None:
        betas = np.asarray(config["trained_betas"], np.float32)
    elif kind == "linear":
        betas = np.linspace(b0, b1, n).astype(np.float32)
    elif kind == "scaled_linear":
        betas = np.linspace(b0 ** 0.5, b1 ** 0.5, n).astype(np.float32) ** 2
    elif kind == "squaredcos_cap_v2":
        f = lambda t: math.cos((t + 0.008) / 1.008 * math.pi / 2) ** 2  # noqa: E731
        betas = np.array([min(1 - f((i + 1) / n) / f(i / n), 0.999) for i in range(n)], np.float32)
    else:
        raise ModelError(f"scheduler: beta_schedule {kind!r} is not supported "
                         "(linear, scaled_linear, squaredcos_cap_v2)")
    if config.get("rescale_betas_zero_snr"):
        betas = _zero_terminal_snr(betas)
    return betas


def _zero_terminal_snr(betas):
    s = np.sqrt(np.cumprod(1.0 - betas.astype(np.float64)))
    s0, sT = s[0], s[-1]
    s = (s - sT) * (s0 / (s0 - sT))
    a_bar = s ** 2
    alphas = np.concatenate([a_bar[:1], a_bar[1:] / a_bar[:-1]])
    return (1 - alphas).astype(np.float32)


def spaced_timesteps(config: dict, n: int, dtype=np.int64) -> np.ndarray:
    """Inference timesteps, descending, with diffusers' `timestep_spacing` rules."""
    T, spacing = config["num_train_timesteps"], config["timestep_spacing"]
    if spacing == "linspace":
        t = np.linspace(0, T - 1, n)[::-1]
        return (t.round() if dtype == np.int64 else t).astype(dtype)
    if spacing == "leading":
        return ((np.arange(n) * (T // n)).round()[::-1] + config.get("steps_offset", 0)).astype(dtype)
    if spacing == "trailing":
        return (np.round(np.arange(T, 0, -T / n)) - 1).astype(dtype)
    raise ModelError(f"scheduler: timestep_spacing {spacing!r} is not supported (linspace, leading, trailing)")


def as_noise(noise, generator, shape):
    """The noise of a stochastic step: given, or drawn from a NumPy Generator (default seed 0)."""
    if noise is not None:
        return np.asarray(noise, np.float32)
    g = generator if generator is not None else np.random.default_rng(0)
    return g.standard_normal(shape, dtype=np.float32)


class Scheduler:
    """Base class: `config` holds the keys of scheduler_config.json over the class defaults.

    >>> from diffusion.schedulers import DDIMScheduler
    >>> s = DDIMScheduler(beta_schedule="scaled_linear", beta_start=0.00085, beta_end=0.012)
    >>> s.set_timesteps(4); s.timesteps.tolist()
    [750, 500, 250, 0]
    """
    defaults: dict = {}
    order = 1
    init_noise_sigma = 1.0

    def __init__(self, **config):
        self.config = {**self.defaults, **{k: v for k, v in config.items() if not k.startswith("_")}}
        self.betas = betas_for(self.config)
        self.alphas = (1.0 - self.betas).astype(np.float32)
        self.alphas_cumprod = np.cumprod(self.alphas.astype(np.float64)).astype(np.float32)
        self.num_inference_steps = None
        self.timesteps = np.arange(self.config["num_train_timesteps"])[::-1].copy()
        self._begin_index = None
        self._step_index = None

    @classmethod
    def from_config(cls, config) -> "Scheduler":
        """From a dict, a scheduler_config.json path, or a folder holding one."""
        if isinstance(config, (str, os.PathLike)):
            path = os.fspath(config)
            if os.path.isdir(path):
                path = os.path.join(path, "scheduler_config.json")
            if not os.path.isfile(path):
                raise ModelError(f"scheduler: no config file {path!r}")
            with open(path) as f:
                config = json.load(f)
        return cls(**dict(config))

    def __repr__(self):
        return f"{type(self).__name__}(steps={self.num_inference_steps})"

    # ---- step bookkeeping (the sigma-based schedulers count steps) ----
    @property
    def step_index(self):
        return self._step_index

    def set_begin_index(self, begin_index: int = 0) -> None:
        """Start counting steps at `begin_index` (image-to-image skips the first steps)."""
        self._begin_index = begin_index

    def index_for_timestep(self, t) -> int:
        idx = np.nonzero(self.timesteps == t)[0]
        if len(idx) == 0:
            raise ModelError(f"{type(self).__name__}: timestep {t} is not in the schedule")
        return int(idx[1] if len(idx) > 1 else idx[0])

    def _init_step_index(self, t):
        if self._step_index is None:
            self._step_index = self.index_for_timestep(t) if self._begin_index is None else self._begin_index

    def scale_model_input(self, sample, timestep=None) -> np.ndarray:
        return sample

    def _check_set(self):
        if self.num_inference_steps is None:
            raise ModelError(f"{type(self).__name__}: call set_timesteps(n) before step()")

    def _x0(self, model_output, sample, a_t):
        """The predicted clean sample from the model output (epsilon, sample or v)."""
        b_t, kind = 1 - a_t, self.config["prediction_type"]
        if kind == "epsilon":
            return (sample - b_t ** 0.5 * model_output) / a_t ** 0.5
        if kind == "sample":
            return model_output
        if kind == "v_prediction":
            return a_t ** 0.5 * sample - b_t ** 0.5 * model_output
        raise ModelError(f"{type(self).__name__}: prediction_type {kind!r} is not supported")

    def add_noise(self, original, noise, timesteps) -> np.ndarray:
        """Forward diffusion q(x_t | x_0) at `timesteps` (one per batch row, or a scalar)."""
        t = np.asarray(timesteps).reshape(-1).astype(np.int64)
        a = self.alphas_cumprod[t].reshape((-1,) + (1,) * (np.ndim(original) - 1))
        return (np.sqrt(a) * original + np.sqrt(1 - a) * noise).astype(np.float32)

    def __len__(self):
        return self.config["num_train_timesteps"]


COMMON = dict(num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear",
              trained_betas=None, prediction_type="epsilon", steps_offset=0, rescale_betas_zero_snr=False)
