"""Stable Diffusion on Express: CLIP text encoder, UNet and VAE in express.nn, NumPy schedulers,
a pipeline and a CLI (`python -m diffusion generate MODEL "prompt" -o out.png`).

>>> import diffusion
>>> sorted(diffusion.schedulers.NAMES)[:3]
['ddim', 'dpm++2m', 'dpm++2m_karras']
"""
from . import schedulers  # noqa: F401
from .pipeline import PipelineOutput, StableDiffusionPipeline  # noqa: F401
from .tokenizer import CLIPTokenizer  # noqa: F401

__all__ = ["StableDiffusionPipeline", "PipelineOutput", "CLIPTokenizer", "schedulers"]
