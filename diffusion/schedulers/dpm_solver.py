"""DPM-Solver++ multistep (Lu et al. 2022): "DPM++ 2M" (and "2M Karras" with `use_karras_sigmas`),
as diffusers' DPMSolverMultistepScheduler."""
from __future__ import annotations

import numpy as np

from express import ModelError

from .base import COMMON, SchedulerOutput, as_noise
from .euler import SigmaScheduler, karras_sigmas, sigma_to_t


def _lambda(alpha, sigma):
    """Half the log signal-to-noise ratio."""
    return np.log(alpha) - np.log(sigma)


class DPMSolverMultistepScheduler(SigmaScheduler):
    """First/second-order multistep DPM-Solver++ in data-prediction form (`algorithm_type`
    "dpmsolver++", or "sde-dpmsolver++" with noise), midpoint or heun second-order update.

    >>> from diffusion.schedulers import DPMSolverMultistepScheduler
    >>> s = DPMSolverMultistepScheduler(); s.set_timesteps(4); s.timesteps.tolist()
    [999, 749, 500, 250]
    """
    defaults = dict(COMMON, solver_order=2, thresholding=False, algorithm_type="dpmsolver++",
                    solver_type="midpoint", lower_order_final=True, euler_at_final=False,
                    use_karras_sigmas=False, sigma_min=None, sigma_max=None, final_sigmas_type="zero",
                    lambda_min_clipped=-float("inf"), variance_type=None, timestep_spacing="linspace")
    init_noise_sigma = 1.0

    def __init__(self, **config):
        super().__init__(**config)
        c = self.config
        if c["algorithm_type"] not in ("dpmsolver++", "sde-dpmsolver++") or c["solver_order"] not in (1, 2):
            raise ModelError(f"DPMSolverMultistepScheduler: algorithm_type {c['algorithm_type']!r} with "
                             f"solver_order {c['solver_order']} is not supported (dpmsolver++ / "
                             "sde-dpmsolver++, order 1 or 2)")
        if c["solver_type"] not in ("midpoint", "heun") or c["thresholding"] or c.get("use_lu_lambdas") \
                or c.get("use_exponential_sigmas") or c.get("use_beta_sigmas") or c.get("use_flow_sigmas"):
            raise ModelError("DPMSolverMultistepScheduler: only midpoint/heun solvers with plain or "
                             "Karras sigmas are supported")
        a = self.alphas_cumprod
        self.lambda_t = (np.log(np.sqrt(a)) - np.log(np.sqrt(1 - a))).astype(np.float32)

    def scale_model_input(self, sample, timestep=None):
        return sample

    @property
    def init_noise_sigma(self):
        return 1.0

    def set_timesteps(self, num_inference_steps: int) -> None:
        c, n = self.config, num_inference_steps
        T = c["num_train_timesteps"]
        last = T - int(np.searchsorted(self.lambda_t[::-1], c["lambda_min_clipped"]))
        spacing = c["timestep_spacing"]
        if spacing == "linspace":
            ts = np.linspace(0, last - 1, n + 1).round()[::-1][:-1].astype(np.int64)
        elif spacing == "leading":
            ts = (np.arange(n + 1) * (last // (n + 1))).round()[::-1][:-1].astype(np.int64) + c["steps_offset"]
        elif spacing == "trailing":
            ts = np.arange(last, 0, -T / n).round().astype(np.int64) - 1
        else:
            raise ModelError(f"DPMSolverMultistepScheduler: timestep_spacing {spacing!r} is not supported")
        sig = self.train_sigmas
        if c["use_karras_sigmas"]:
            sigmas = karras_sigmas(c["sigma_min"] or float(sig[0]), c["sigma_max"] or float(sig[-1]), n)
            ts = np.array([sigma_to_t(s, np.log(sig)) for s in sigmas])
            if c["beta_schedule"] != "squaredcos_cap_v2":
                ts = ts.round()
        else:
            sigmas = np.interp(ts, np.arange(len(sig)), sig)
        self.sigmas = np.concatenate([sigmas, [self._final_sigma()]]).astype(np.float32)
        self.timesteps = ts.astype(np.int64)
        self.num_inference_steps = len(ts)
        self.model_outputs = [None] * c["solver_order"]
        self.lower_order_nums = 0
        self._step_index = self._begin_index = None

    def _alpha_sigma(self, sigma):
        a = 1 / (sigma ** 2 + 1) ** 0.5
        return a, sigma * a

    def _convert(self, model_output, sample):
        if self.config["variance_type"] in ("learned", "learned_range"):
            model_output = model_output[:, :3]
        a, s = self._alpha_sigma(self.sigmas[self._step_index])
        kind = self.config["prediction_type"]
        if kind == "epsilon":
            return (sample - s * model_output) / a
        if kind == "sample":
            return model_output
        if kind == "v_prediction":
            return a * sample - s * model_output
        raise ModelError(f"DPMSolverMultistepScheduler: prediction_type {kind!r} is not supported")

    def step(self, model_output, timestep, sample, generator=None, noise=None) -> SchedulerOutput:
        self._check_set()
        self._init_step_index(timestep)
        c, i, n = self.config, self._step_index, len(self.timesteps)
        final = i == n - 1 and (c["euler_at_final"] or (c["lower_order_final"] and n < 15)
                                or c["final_sigmas_type"] == "zero")
        x0 = self._convert(model_output, sample)
        self.model_outputs = self.model_outputs[1:] + [x0]
        sample = np.asarray(sample, np.float32)
        sde = c["algorithm_type"] == "sde-dpmsolver++"
        z = as_noise(noise, generator, sample.shape) if sde else None
        a_t, s_t = self._alpha_sigma(self.sigmas[i + 1])
        a_0, s_0 = self._alpha_sigma(self.sigmas[i])
        with np.errstate(divide="ignore"):  # the final sigma may be 0: lambda = inf, exp(-h) = 0
            h = _lambda(a_t, s_t) - _lambda(a_0, s_0)
        if c["solver_order"] == 1 or self.lower_order_nums < 1 or final:
            if sde:
                x = s_t / s_0 * np.exp(-h) * sample + a_t * (1 - np.exp(-2.0 * h)) * x0 \
                    + s_t * np.sqrt(1.0 - np.exp(-2 * h)) * z
            else:
                x = s_t / s_0 * sample - a_t * (np.exp(-h) - 1.0) * x0
        else:
            a_1, s_1 = self._alpha_sigma(self.sigmas[i - 1])
            m0, m1 = self.model_outputs[-1], self.model_outputs[-2]
            r0 = (_lambda(a_0, s_0) - _lambda(a_1, s_1)) / h
            d0, d1 = m0, (1.0 / r0) * (m0 - m1)
            mid = c["solver_type"] == "midpoint"
            if sde:
                e2 = 1 - np.exp(-2.0 * h)
                x = s_t / s_0 * np.exp(-h) * sample + a_t * e2 * d0 \
                    + (0.5 * (a_t * e2) if mid else a_t * (e2 / (-2.0 * h) + 1.0)) * d1 \
                    + s_t * np.sqrt(1.0 - np.exp(-2 * h)) * z
            else:
                e = np.exp(-h) - 1.0
                x = s_t / s_0 * sample - a_t * e * d0 + (-0.5 * (a_t * e) if mid else a_t * (e / h + 1.0)) * d1
        self.lower_order_nums = min(self.lower_order_nums + 1, c["solver_order"])
        self._step_index += 1
        return SchedulerOutput(np.asarray(x, np.float32), x0)

    def add_noise(self, original, noise, timesteps) -> np.ndarray:
        t = np.asarray(timesteps).reshape(-1)
        if self._begin_index is None:
            idx = [self._index_or_last(x) for x in t]
        else:
            idx = [self._step_index if self._step_index is not None else self._begin_index] * len(t)
        a, s = self._alpha_sigma(self.sigmas[idx].reshape((-1,) + (1,) * (np.ndim(original) - 1)))
        return (a * original + s * noise).astype(np.float32)

    def _index_or_last(self, t):
        idx = np.nonzero(self.timesteps == t)[0]
        return len(self.timesteps) - 1 if len(idx) == 0 else int(idx[1] if len(idx) > 1 else idx[0])
