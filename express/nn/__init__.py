"""Neural-network building blocks on top of the expression layer: `Module` (a parameter tree),
layers in PyTorch's weight layouts, and `express.nn.functional`."""
from . import functional  # noqa: F401
from .layers import (GELU, Embedding, GroupNorm, LayerNorm, Linear, ModuleList, ReLU, RMSNorm,  # noqa: F401
                     Sequential, SiLU)
from .module import Module  # noqa: F401
