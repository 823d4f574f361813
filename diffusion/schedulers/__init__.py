"""Diffusion schedulers in NumPy, configured by diffusers' scheduler_config.json keys.

`get_scheduler(name, config)` picks one by a short name ("ddim", "pndm", "euler", "euler_a",
"dpm++2m", "dpm++2m_karras", "lcm") or by the diffusers class name in `config["_class_name"]`.

>>> from diffusion.schedulers import get_scheduler
>>> s = get_scheduler("euler", {"beta_schedule": "scaled_linear", "beta_start": 0.00085, "beta_end": 0.012})
>>> type(s).__name__
'EulerDiscreteScheduler'
"""
from __future__ import annotations

from express import ModelError

from .base import Scheduler, SchedulerOutput  # noqa: F401
from .ddim import DDIMScheduler
from .dpm_solver import DPMSolverMultistepScheduler
from .euler import EulerAncestralDiscreteScheduler, EulerDiscreteScheduler
from .lcm import LCMScheduler
from .pndm import PNDMScheduler

CLASSES = {c.__name__: c for c in (DDIMScheduler, PNDMScheduler, EulerDiscreteScheduler,
                                   EulerAncestralDiscreteScheduler, DPMSolverMultistepScheduler, LCMScheduler)}
# short name -> (class, config overrides)
NAMES = {
    "ddim": (DDIMScheduler, {}),
    "pndm": (PNDMScheduler, {}),
    "plms": (PNDMScheduler, {"skip_prk_steps": True}),
    "euler": (EulerDiscreteScheduler, {}),
    "euler_karras": (EulerDiscreteScheduler, {"use_karras_sigmas": True}),
    "euler_a": (EulerAncestralDiscreteScheduler, {}),
    "euler_ancestral": (EulerAncestralDiscreteScheduler, {}),
    "dpm++2m": (DPMSolverMultistepScheduler, {"algorithm_type": "dpmsolver++", "solver_order": 2}),
    "dpm++2m_karras": (DPMSolverMultistepScheduler, {"algorithm_type": "dpmsolver++", "solver_order": 2,
                                                     "use_karras_sigmas": True}),
    "dpmpp_2m": (DPMSolverMultistepScheduler, {"algorithm_type": "dpmsolver++", "solver_order": 2}),
    "dpmpp_2m_karras": (DPMSolverMultistepScheduler, {"algorithm_type": "dpmsolver++", "solver_order": 2,
                                                      "use_karras_sigmas": True}),
    "lcm": (LCMScheduler, {}),
}
def get_scheduler(name: str | None, config: dict | None = None) -> Scheduler:
    """A scheduler by short name or class name, from a (pipeline's) scheduler config.

    Every key of `config` that the chosen class takes carries over, as with diffusers'
    `from_config`; `name=None` uses `config["_class_name"]`."""
    config = dict(config or {})
    cls_name = config.pop("_class_name", None)
    if name is None:
        name = cls_name
    if name is None:
        raise ModelError("get_scheduler: no scheduler name and the config has no _class_name")
    key = name.lower().replace("-", "_").replace(" ", "_")
    if name in CLASSES:
        cls, over = CLASSES[name], {}
    elif key in NAMES or name.lower() in NAMES:
        cls, over = NAMES.get(key) or NAMES[name.lower()]
    else:
        raise ModelError(f"unknown scheduler {name!r}; choose one of {', '.join(sorted(NAMES))} "
                         f"or {', '.join(sorted(CLASSES))}")
    config = {k: v for k, v in config.items() if k in cls.defaults}
    return cls(**{**config, **over})


__all__ = ["get_scheduler", "Scheduler", "SchedulerOutput", *CLASSES]
