"""The eight dtypes, their NumPy counterparts and the promotion rules.

Promotion follows the Python Array API: same-kind types widen, int with float gives the float,
int8 with uint8 gives int32 here (no int16), float16 with bfloat16 gives float32. Python scalars are
"weak": they take the tensor's dtype when their kind allows it.
"""
from __future__ import annotations

import numpy as np

from .errors import DTypeError


def np_dtype(name: str) -> np.dtype:
    """The NumPy dtype called `name`; "bfloat16" is ml_dtypes', imported on first use (the package
    takes most of a second to import, three quarters of `import express` when it came first)."""
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


class DType:
    __slots__ = ("name", "code", "_np", "itemsize", "kind")

    def __init__(self, name: str, code: int, itemsize: int, kind: str):
        self.name, self.code, self.itemsize, self.kind, self._np = name, code, itemsize, kind, None

    @property
    def np(self) -> np.dtype:
        if self._np is None:
            self._np = np_dtype(self.name)
        return self._np

    is_float = property(lambda self: self.kind == "f")
    is_int = property(lambda self: self.kind in "iu")
    is_bool = property(lambda self: self.kind == "b")

    def __repr__(self):
        return f"express.{self.name}"

    def __reduce__(self):
        return (_by_name, (self.name,))


# codes match `enum ex_dtype` in cext/express.h
float32 = DType("float32", 0, 4, "f")
float16 = DType("float16", 1, 2, "f")
bfloat16 = DType("bfloat16", 2, 2, "f")
int8 = DType("int8", 3, 1, "i")
uint8 = DType("uint8", 4, 1, "u")
int32 = DType("int32", 5, 4, "i")
int64 = DType("int64", 6, 8, "i")
bool_ = DType("bool", 7, 1, "b")

ALL = (float32, float16, bfloat16, int8, uint8, int32, int64, bool_)
FLOATS = (float32, float16, bfloat16)
INTS = (int8, uint8, int32, int64)
_BY_NAME = {d.name: d for d in ALL}
_BY_NP = {np.dtype(d.name): d for d in ALL if d is not bfloat16}  # bfloat16 joins on first sight
# NumPy types we accept on the way in and narrow, as MNN does: there is no float64 kernel path
_NARROWED = {np.dtype(np.float64): float32, np.dtype(np.int16): int32, np.dtype(np.uint16): int32,
             np.dtype(np.uint32): int64}


def _by_name(name):
    return _BY_NAME[name]


def _ours(npd: np.dtype):
    """Our dtype for NumPy dtype `npd`, or None. bfloat16's NumPy type only exists once ml_dtypes
    is imported, so it is recognized by name (slow: `dtype.name` is Python code) and then cached."""
    d = _BY_NP.get(npd)
    if d is None and npd.itemsize == 2 and npd.isnative and npd.name == "bfloat16":
        d = _BY_NP[npd] = bfloat16
    return d


def as_dtype(x) -> DType:
    """`x` as an Express dtype: a DType, a name ('float32'), a NumPy dtype or a Python type."""
    if isinstance(x, DType):
        return x
    if x is float:
        return float32
    if x is int:
        return int64
    if x is bool:
        return bool_
    if isinstance(x, str) and x in _BY_NAME:
        return _BY_NAME[x]
    try:
        npd = np.dtype(x)
    except TypeError:
        raise DTypeError(f"unknown dtype {x!r}; Express supports {', '.join(_BY_NAME)}") from None
    d = _ours(npd)
    if d is not None:
        return d
    raise DTypeError(f"dtype {npd} is not supported; Express supports {', '.join(_BY_NAME)}")


def from_numpy(npd) -> DType:
    """The dtype an incoming NumPy array is stored as (float64 narrows to float32)."""
    npd = np.dtype(npd)
    d = _BY_NP.get(npd) or _NARROWED.get(npd) or _ours(npd)
    if d is not None:
        return d
    raise DTypeError(f"NumPy dtype {npd} is not supported; Express supports {', '.join(_BY_NAME)}")


_INT_RANK = {int8: 0, uint8: 0, int32: 1, int64: 2}


def promote(a: DType, b: DType) -> DType:
    """The result type of a binary op on two tensors."""
    if a is b:
        return a
    if a.is_bool:
        return b
    if b.is_bool:
        return a
    if a.is_float and b.is_float:
        return float32  # any mix of distinct float types
    if a.is_float:
        return a
    if b.is_float:
        return b
    if {a, b} == {int8, uint8}:
        return int32
    return a if _INT_RANK[a] >= _INT_RANK[b] else b


def scalar_dtype(value, other: DType) -> DType:
    """The dtype a Python scalar takes next to a tensor of dtype `other` (weak promotion)."""
    if isinstance(value, (bool, np.bool_)):
        return other
    if isinstance(value, (int, np.integer)):
        if other.is_bool:
            return int64
        if other.is_int:
            info = np.iinfo(other.np)
            if not info.min <= int(value) <= info.max:
                raise DTypeError(f"Python int {value} does not fit in {other.name}")
        return other
    if isinstance(value, (float, np.floating)):
        return other if other.is_float else float32
    raise DTypeError(f"cannot use {type(value).__name__} {value!r} as a tensor operand")


def default_for(value) -> DType:
    """The dtype of a lone Python scalar."""
    if isinstance(value, (bool, np.bool_)):
        return bool_
    if isinstance(value, (int, np.integer)):
        return int64
    if isinstance(value, (float, np.floating)):
        return float32
    raise DTypeError(f"cannot make a tensor from {type(value).__name__} {value!r}")
