"""Errors raised by Express. Every one derives from `ExpressError`; the builtin bases let callers
catch them the way they would catch NumPy's (`ValueError`, `TypeError`, `IndexError`)."""


class ExpressError(Exception):
    """Base of every error Express raises."""


class ShapeError(ExpressError, ValueError):
    """Shapes that do not fit an op (raised when the node is built)."""


class DTypeError(ExpressError, TypeError):
    """A dtype an op does not accept, or one Express does not support."""


class AxisError(ExpressError, ValueError, IndexError):
    """An axis out of range for the tensor's rank."""


class OutOfRangeError(ExpressError, IndexError):
    """An index outside the extent of the axis it indexes."""


class KernelError(ExpressError, RuntimeError):
    """A C kernel refused its arguments (a bug in Express if it ever reaches a user)."""


class ModelError(ExpressError, ValueError):
    """A model or weight file that is corrupt, truncated or unsupported."""
