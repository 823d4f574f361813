"""Op definitions, one family per module; `registry.REGISTRY` lists them all."""
from . import creation, elementwise, linalg, reduce, shape  # noqa: F401
from .registry import REGISTRY  # noqa: F401
