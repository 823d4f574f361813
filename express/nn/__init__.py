"""Neural-network building blocks on top of the expression layer: `Module` (a parameter tree),
layers in PyTorch's weight layouts, and `express.nn.functional`."""
from . import functional  # noqa: F401
from .layers import (GELU, AdaptiveAvgPool2d, AvgPool2d, BatchNorm2d, Conv2d, ConvTranspose2d,  # noqa: F401
                     Dropout, Embedding, Flatten, GroupNorm, Identity, LayerNorm, Linear, MaxPool2d,
                     ModuleList, ReLU, ReLU6, RMSNorm, Sequential, Sigmoid, SiLU)
from .module import Module  # noqa: F401
