"""ex.compile(fn): trace `fn` once per input signature into a cached plan, then replay it.

Tracing runs `fn` on placeholder tensors; every subgraph that does not depend on a placeholder
is evaluated right then (constant folding), so a replay runs only the input-dependent kernels over
fixed, preallocated buffers: the Python cost per call is one loop over prepared kernel calls."""
from __future__ import annotations

import functools

import numpy as np

from . import dtypes as dt
from . import graph
from ._lib import ffi
from .errors import ExpressError
from .plan import Plan, evaluate
from .tensor import Tensor, as_numpy, constant


def _flatten(out):
    if isinstance(out, Tensor):
        return [out], lambda xs: xs[0]
    if isinstance(out, (tuple, list)):
        kind = type(out)
        if not all(isinstance(o, Tensor) for o in out):
            raise ExpressError("ex.compile: the function must return a Tensor or a tuple/list/dict of Tensors")
        return list(out), lambda xs: kind(xs)
    if isinstance(out, dict):
        keys = list(out)
        if not all(isinstance(out[k], Tensor) for k in keys):
            raise ExpressError("ex.compile: the function must return a Tensor or a tuple/list/dict of Tensors")
        return [out[k] for k in keys], lambda xs: dict(zip(keys, xs))
    raise ExpressError(f"ex.compile: the function returned {type(out).__name__}, not Tensors")


def _fold_constants(outs, inputs):
    """Evaluate every maximal subgraph that does not depend on an input."""
    nodes, canon = graph.order(outs)
    dep = {id(t) for t in inputs}
    for t in nodes:
        if any(id(i) in dep for i in graph.inputs(t, canon)):
            dep.add(id(t))
    frontier = {id(i): i for t in nodes if id(t) in dep for i in graph.inputs(t, canon)
                if id(i) not in dep and i._value is None}
    frontier.update({id(o): o for o in outs if id(canon.get(id(o), o)) not in dep and o._value is None})
    evaluate(list(frontier.values()))
    # nodes CSE merged into a folded one take its value too (or the plan would compute them again)
    stack, seen = list(outs), set()
    while stack:
        t = stack.pop()
        if id(t) in seen or t._value is not None:
            continue
        seen.add(id(t))
        c = canon.get(id(t))
        if c is not None and c is not t and c._value is not None:
            t._value, t.op, t.inputs, t.attrs = c._value, None, (), {}
        else:
            stack.extend(t.inputs)


class _Compiled:
    """The plan traced for one input signature.  A call copies its arguments in and its results
    out; a hot loop may instead write into `input_arrays` (the plan's own input buffers) and call
    `run()`, which returns the plan's output buffers themselves: overwritten by the next run."""

    def __init__(self, fn, inputs, plan, unflatten):
        self.fn, self.inputs, self.plan, self.unflatten = fn, inputs, plan, unflatten
        self.input_arrays = plan.input_arrays

    def run(self) -> list:
        return self.plan.run()

    def __call__(self, arrays):
        for dst, a in zip(self.input_arrays, arrays):
            if a.flags.c_contiguous and a.dtype == dst.dtype:
                ffi.memmove(dst, a, a.nbytes)
            else:
                np.copyto(dst, a, casting="unsafe")
        return self.unflatten([constant(np.array(o, copy=True)) for o in self.plan.run()])


def compile(fn):
    """Trace `fn(*tensors)` once per input signature (shapes, dtypes, non-tensor arguments) and
    replay the cached plan on later calls.  `compiled.prepare(*args)` returns the plan for a
    signature without running it, for loops that write its `input_arrays` and call `run()`.

    >>> import express as ex
    >>> f = ex.compile(lambda x, y: ex.exp(x) * y + 1)
    >>> f(ex.zeros((3,)), ex.ones((3,))).numpy()
    array([2., 2., 2.], dtype=float32)
    """
    cache: dict = {}

    def lookup(args):
        arrays, key, static = [], [], []
        for a in args:
            if isinstance(a, Tensor) or isinstance(a, np.ndarray):
                arr = a.numpy() if isinstance(a, Tensor) else as_numpy(a)
                arrays.append(arr)
                key.append((arr.shape, arr.dtype.str))
                static.append(None)
            else:
                key.append(("static", a if _hashable(a) else id(a)))
                static.append(a)
        key = tuple(key)
        c = cache.get(key)
        if c is None:
            c = cache[key] = _trace(fn, args, arrays, static)
        return c, arrays

    @functools.wraps(fn)
    def wrapper(*args):
        c, arrays = lookup(args)
        return c(arrays)

    def prepare(*args):
        """The traced plan for arguments of the shapes, dtypes and static values of `args` (traced
        now if new): write into its `input_arrays`, then `run()`, for a loop that calls it with
        the same signature many times (an LLM decode step)."""
        return lookup(args)[0]

    wrapper.cache, wrapper.prepare = cache, prepare
    return wrapper


def _hashable(a):
    try:
        hash(a)
        return True
    except TypeError:
        return False


def _trace(fn, args, arrays, static):
    it = iter(arrays)
    inputs, call_args = [], []
    for a, s in zip(args, static):
        if s is None:
            arr = next(it)
            t = Tensor(None, (), {}, arr.shape, dt.from_numpy(arr.dtype))  # a placeholder
            inputs.append(t)
            call_args.append(t)
        else:
            call_args.append(s)
    outs, unflatten = _flatten(fn(*call_args))
    _fold_constants(outs, inputs)
    return _Compiled(fn, inputs, Plan(outs, inputs, kept=True), unflatten)
