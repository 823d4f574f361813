"""Express: a lazy, NumPy-like expression layer over a C kernel library.

>>> import express as ex
>>> x = ex.arange(6).reshape(2, 3).astype(ex.float32)
>>> y = ex.exp(x) @ ex.ones((3, 2)) + 1   # builds a graph; nothing runs yet
>>> y.shape
(2, 2)
>>> ex.eval(y)                              # runs the plan
>>> float(y.numpy()[0, 0]) > 10
True
"""
from . import random  # noqa: F401
from ._lib import get_num_threads, isa, memory_stats, reset_peak_memory, set_isa, set_num_threads
from .compile import compile
from .dtypes import DType, bfloat16, bool_ as bool, float16, float32, int8, int32, int64, uint8
from .errors import (AxisError, DTypeError, ExpressError, KernelError, ModelError, OutOfRangeError,
                     ShapeError)
from .io import load, save
from .ops.creation import (arange, array, asarray, eye, full, full_like, linspace, ones, ones_like,
                           zeros, zeros_like)
from .ops.elementwise import (abs, add, astype, ceil, clip, cos, divide, equal, exp, floor, greater,
                              greater_equal, less, less_equal, log, logical_and, logical_not,
                              logical_or, maximum, minimum, multiply, negative, not_equal, pow,
                              round, sin, sqrt, square, subtract, tanh, where)
from .ops.linalg import matmul
from .ops.reduce import argmax, argmin, cumsum, max, mean, min, prod, sum
from .ops.shape import (broadcast_to, concat, expand_dims, flip, matrix_transpose, permute_dims, slice_update,
                        reshape, split, squeeze, stack, take, transpose, tril, triu)
from .plan import evaluate as _evaluate
from .tensor import Tensor
from .viz import graphviz

__version__ = "0.1.0"


def eval(*tensors) -> None:
    """Evaluate tensors together: shared subgraphs run once, and each keeps its value.

    >>> import express as ex
    >>> a = ex.ones((2,)) + 1
    >>> b = a * 3
    >>> ex.eval(a, b)
    >>> b.numpy()
    array([6., 6.], dtype=float32)
    """
    _evaluate(tensors)

from . import onnx  # noqa: E402  (last: the ONNX op table is written with the public API above)
