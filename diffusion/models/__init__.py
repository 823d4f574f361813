"""Stable Diffusion's networks written with express.nn: the CLIP text encoder, the UNet and the
VAE. Parameter names follow the transformers/diffusers state dicts, so weight files load as they are."""
from .clip import CLIPTextConfig, CLIPTextModel  # noqa: F401
from .unet import UNet2DConditionModel, UNetConfig  # noqa: F401
from .vae import AutoencoderKL, VAEConfig  # noqa: F401
