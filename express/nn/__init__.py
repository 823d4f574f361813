"""Neural-network building blocks on top of the expression layer."""
from . import functional  # noqa: F401
