"""Shape ops. Most are views (NumPy strides over the same buffer; no data moves): reshape,
permute_dims, expand_dims, squeeze, broadcast_to, flip, basic indexing. The planner copies only
where a view is impossible (reshaping a non-contiguous view) or a kernel needs contiguous input.
concat/take copy through kernels."""
from __future__ import annotations

import builtins
import operator

import numpy as np

from .. import dtypes as dt
from .._lib import KernelCall, ffi, ptr
from ..errors import AxisError, DTypeError, ExpressError, OutOfRangeError, ShapeError
from ..tensor import Tensor, as_tensor, constant, node
from .registry import defop


def norm_axis(name: str, axis: int, ndim: int) -> int:
    try:
        axis = operator.index(axis)
    except TypeError:
        raise AxisError(f"{name}: axis must be an int, got {axis!r}") from None
    if not -ndim <= axis < ndim:
        raise AxisError(f"{name}: axis {axis} is out of range for a tensor of rank {ndim}")
    return axis % ndim


def norm_axes(name: str, axis, ndim: int) -> tuple:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if not isinstance(axis, (tuple, list)) else tuple(axis)
    out = tuple(norm_axis(name, a, ndim) for a in axes)
    if len(set(out)) != len(out):
        raise AxisError(f"{name}: repeated axis in {axis}")
    return out


# ---- reshape ----
def _reshape_infer(x, shape):
    return shape, x.dtype


_RESHAPE = defop("reshape", "view", _reshape_infer, lambda a, shape: np.reshape(a, shape),
                 view=lambda a, shape: a.reshape(shape, copy=False))


def _resolve_shape(name, size, shape, src):
    shape = tuple(operator.index(s) for s in shape)
    if builtins.sum(s == -1 for s in shape) > 1 or any(s < -1 for s in shape):
        raise ShapeError(f"{name}: invalid target shape {shape}")
    known = int(np.prod([s for s in shape if s != -1], dtype=np.int64))
    if -1 in shape:
        if known == 0 or size % known:
            raise ShapeError(f"{name}: cannot reshape {src} ({size} elements) into {shape}")
        shape = tuple(size // known if s == -1 else s for s in shape)
    elif known != size:
        raise ShapeError(f"{name}: cannot reshape {src} ({size} elements) into {shape}")
    return shape


def reshape(x, shape):
    """`x` with a new shape of the same size (one dimension may be -1).

    >>> import express as ex
    >>> ex.reshape(ex.arange(6), (2, -1)).shape
    (2, 3)
    """
    x = as_tensor(x)
    shape = _resolve_shape("reshape", x.size, (shape,) if isinstance(shape, int) else shape, x.shape)
    return x if shape == x.shape else node(_RESHAPE, [x], shape=shape)


# ---- permute / transpose ----
def _permute_infer(x, axes):
    return tuple(x.shape[a] for a in axes), x.dtype


_PERMUTE = defop("permute_dims", "view", _permute_infer, lambda a, axes: np.transpose(a, axes),
                 view=lambda a, axes: a.transpose(axes))


def permute_dims(x, axes):
    """Reorder the axes of `x` (a view)."""
    x = as_tensor(x)
    axes = tuple(axes)
    if len(axes) != x.ndim:
        raise AxisError(f"permute_dims: axes {axes} do not match a tensor of shape {x.shape}")
    axes = norm_axes("permute_dims", axes, x.ndim)
    return x if axes == tuple(range(x.ndim)) else node(_PERMUTE, [x], axes=axes)


def transpose(x, axes=None):
    """NumPy's transpose: reverse the axes, or permute them by `axes`."""
    x = as_tensor(x)
    return permute_dims(x, tuple(range(x.ndim))[::-1] if axes is None else axes)


def matrix_transpose(x):
    x = as_tensor(x)
    if x.ndim < 2:
        raise ShapeError(f"matrix_transpose: needs rank >= 2, got shape {x.shape}")
    axes = list(range(x.ndim))
    axes[-2:] = axes[-1], axes[-2]
    return permute_dims(x, axes)


# ---- expand_dims / squeeze / broadcast_to / flip ----
def expand_dims(x, axis):
    """Insert length-1 axes at `axis` (an int or a tuple), positions in the result."""
    x = as_tensor(x)
    axes = norm_axes("expand_dims", axis, x.ndim + (len(axis) if isinstance(axis, (tuple, list)) else 1))
    shape = list(x.shape)
    for a in sorted(axes):
        shape.insert(a, 1)
    return reshape(x, tuple(shape))


def squeeze(x, axis=None):
    """Remove length-1 axes (all of them, or those in `axis`, which must have length 1)."""
    x = as_tensor(x)
    if axis is None:
        axes = tuple(i for i, s in enumerate(x.shape) if s == 1)
    else:
        axes = norm_axes("squeeze", axis, x.ndim)
        bad = [a for a in axes if x.shape[a] != 1]
        if bad:
            raise ShapeError(f"squeeze: axis {bad[0]} of shape {x.shape} has length {x.shape[bad[0]]}, not 1")
    return reshape(x, tuple(s for i, s in enumerate(x.shape) if i not in axes))


def _broadcast_infer(x, shape):
    from .elementwise import broadcast_shapes
    if len(shape) < x.ndim or broadcast_shapes("broadcast_to", x.shape, shape) != shape:
        raise ShapeError(f"broadcast_to: cannot broadcast shape {x.shape} to {shape}")
    return shape, x.dtype


_BROADCAST = defop("broadcast_to", "view", _broadcast_infer, lambda a, shape: np.broadcast_to(a, shape),
                   view=lambda a, shape: np.broadcast_to(a, shape))


def broadcast_to(x, shape):
    """`x` repeated (without copying) to `shape` by NumPy's broadcasting rules."""
    x = as_tensor(x)
    shape = tuple(operator.index(s) for s in shape)
    return x if shape == x.shape else node(_BROADCAST, [x], shape=shape)


_FLIP = defop("flip", "view", lambda x, axes: (x.shape, x.dtype), lambda a, axes: np.flip(a, axes),
              view=lambda a, axes: np.flip(a, axes))


def flip(x, axis=None):
    """Reverse the order of elements along `axis` (all axes by default); a view."""
    x = as_tensor(x)
    axes = norm_axes("flip", axis, x.ndim)
    return x if not axes else node(_FLIP, [x], axes=axes)


# ---- basic indexing: ints, slices, None, Ellipsis -> one view op ----
def _index_infer(x, key):
    return _index_view(np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), x.shape, (0,) * x.ndim), key).shape, x.dtype


def _slice(start, stop, step):
    # slice.indices() gives stop=-1 for "down to the first element"; as a slice -1 means the end
    return slice(start, None if stop < 0 else stop, step)


def _index_view(a, key):
    # the trailing Ellipsis keeps an all-integer key a 0-d view (never a scalar read)
    return a[tuple(_slice(*k[1:]) if k[0] == "s" else k[1] if k[0] == "i" else None for k in key) + (Ellipsis,)]


_INDEX = defop("index", "view", _index_infer, lambda a, key: np.array(_index_view(a, key)), view=_index_view)


def _is_advanced(k):
    return isinstance(k, (Tensor, np.ndarray, list)) or (hasattr(k, "__array__") and not np.isscalar(k))


def getitem(x, key):
    """`x[key]` with NumPy semantics for ints, slices, None, Ellipsis, integer arrays and bool masks."""
    x = as_tensor(x)
    key = key if isinstance(key, tuple) else (key,)
    if any(_is_advanced(k) for k in key):
        return _advanced(x, key)
    n_ell = builtins.sum(k is Ellipsis for k in key)
    if n_ell > 1:
        raise ExpressError("index: an index can only have a single ellipsis ('...')")
    n_real = builtins.sum(k is not None and k is not Ellipsis for k in key)
    if n_real > x.ndim:
        raise OutOfRangeError(f"index: too many indices ({n_real}) for a tensor of shape {x.shape}")
    if not n_ell:
        key = key + (Ellipsis,)
    i = key.index(Ellipsis)
    key = key[:i] + (slice(None),) * (x.ndim - n_real) + key[i + 1:]
    spec, d = [], 0
    for k in key:
        if k is None:
            spec.append(("n",))
            continue
        n = x.shape[d]
        if isinstance(k, slice):
            spec.append(("s",) + k.indices(n))
        else:
            try:
                k = operator.index(k)
            except TypeError:
                raise DTypeError(f"index: {k!r} is not a valid index (ints, slices, None, ..., int or bool arrays)") from None
            if not -n <= k < n:
                raise OutOfRangeError(f"index: index {k} is out of range for axis {d} of size {n} (shape {x.shape})")
            spec.append(("i", k % n))
        d += 1
    spec = tuple(spec)
    if all(k[0] == "s" and k[1:] == (0, n, 1) for k, n in zip(spec, x.shape)) and len(spec) == x.ndim:
        return x
    return node(_INDEX, [x], key=spec)


def _advanced(x, key):
    """Integer-array and bool-mask indexing, lowered to basic indexing plus `take`."""
    if len(key) == 1:
        k = key[0]
        is_t = isinstance(k, Tensor)
        if (k.dtype.is_bool if is_t else np.asarray(k).dtype == np.bool_):
            mask = np.asarray(k.numpy() if is_t else k)  # the result's shape depends on its values
            if mask.shape != x.shape[:mask.ndim]:
                raise ShapeError(f"index: bool mask of shape {mask.shape} does not match tensor shape {x.shape}")
            flat = reshape(x, (-1,) + x.shape[mask.ndim:])
            return take(flat, constant(np.flatnonzero(mask).astype(np.int64)), axis=0)
    # several index arrays: they must be constants here (their bounds are checked now)
    adv = [i for i, k in enumerate(key) if _is_advanced(k)]
    if len(adv) == 1 and not any(k is Ellipsis or k is None for k in key):
        i = adv[0]
        basic = tuple(slice(None) if j == i else k for j, k in enumerate(key))
        y = getitem(x, basic)
        axis = i - builtins.sum(1 for k in key[:i] if not isinstance(k, slice) and not _is_advanced(k))
        return take(y, key[i], axis=axis)
    if any(isinstance(key[i], Tensor) and not key[i].is_evaluated for i in adv) or any(
            k is Ellipsis or k is None for k in key):
        raise ExpressError("index: several integer-array indices must be concrete arrays, without "
                           "None/...; use ex.take for lazy indices")
    if any(not isinstance(k, slice) and not _is_advanced(k) for k in key) or adv != list(range(len(adv))):
        raise ExpressError("index: integer arrays must come first when combined with slices")
    idx = [np.asarray(key[i].numpy() if isinstance(key[i], Tensor) else key[i]) for i in adv]
    if any(not (a.dtype.kind in "iu") for a in idx):
        raise DTypeError("index: index arrays must be integers or a single bool mask")
    idx = np.broadcast_arrays(*idx)
    lin = np.zeros(idx[0].shape, np.int64)
    for d, a in enumerate(idx):
        n = x.shape[d]
        if a.size and (a.min() < -n or a.max() >= n):
            raise OutOfRangeError(f"index: an index is out of range for axis {d} of size {n} (shape {x.shape})")
        lin = lin * n + (a % n)
    rest = x.shape[len(adv):]
    flat = reshape(x, (-1,) + rest)
    y = take(flat, constant(lin.reshape(-1)), axis=0)
    y = reshape(y, lin.shape + rest)
    return getitem(y, (slice(None),) * lin.ndim + tuple(key[len(adv):]))


# ---- take (gather) ----
def _take_infer(x, idx, axis):
    if not (idx.dtype.is_int):
        raise DTypeError(f"take: indices must be integers, got {idx.dtype.name}")
    return x.shape[:axis] + idx.shape + x.shape[axis + 1:], x.dtype


def _take_prepare(out, ins, axis):
    x, idx = ins
    outer = int(np.prod(x.shape[:axis], dtype=np.int64))
    inner = int(np.prod(x.shape[axis + 1:], dtype=np.int64))
    args = (x.itemsize, ffi.cast("void *", ptr(x)), outer, x.shape[axis], inner,
            ffi.cast("int64_t *", ptr(idx)), idx.size, ffi.cast("void *", ptr(out)))
    shape, n = x.shape, x.shape[axis]

    def fail(rc):
        bad = idx[(idx < -n) | (idx >= n)].ravel()
        raise OutOfRangeError(f"take: index {bad[0] if bad.size else '?'} is out of range for axis "
                              f"{axis} of size {n} (shape {shape})")
    return KernelCall("take", args, "take", fail)


_TAKE = defop("take", "kernel", _take_infer, lambda a, i, axis: np.take(a, i, axis=axis),
              prepare=_take_prepare, contiguous=(0, 1))


def take(x, indices, axis=None):
    """Elements of `x` at integer `indices` along `axis` (of the flattened `x` if None).
    Out-of-range indices raise `OutOfRangeError` (at build time when the indices are known)."""
    x = as_tensor(x)
    if axis is None:
        x, axis = reshape(x, (-1,)), 0
    axis = norm_axis("take", axis, x.ndim)
    if not isinstance(indices, Tensor):
        a = np.asarray(indices)
        if a.dtype.kind not in "iu":
            raise DTypeError(f"take: indices must be integers, got {a.dtype}")
        n = x.shape[axis]
        if a.size and (a.min() < -n or a.max() >= n):
            raise OutOfRangeError(f"take: index {a.min() if a.min() < -n else a.max()} is out of range "
                                  f"for axis {axis} of size {n} (shape {x.shape})")
        indices = constant(a.astype(np.int64))
    elif indices.dtype is not dt.int64:
        from .elementwise import astype
        indices = astype(indices, dt.int64)
    return node(_TAKE, [x, indices], axis=axis)


# ---- concat / stack / split ----
def _concat_infer(*xs, axis):
    return xs[0].shape[:axis] + (builtins.sum(x.shape[axis] for x in xs),) + xs[0].shape[axis + 1:], xs[0].dtype


def _concat_prepare(out, ins, axis):
    from ..plan import Calls, copy_thunk
    thunks, start = [], 0
    for a in ins:
        stop = start + a.shape[axis]
        if a.size:
            thunks.append(copy_thunk(a, out[(slice(None),) * axis + (slice(start, stop),)]))
        start = stop
    return Calls(thunks)


_CONCAT = defop("concat", "kernel", _concat_infer, lambda *a, axis: np.concatenate(a, axis=axis),
                prepare=_concat_prepare)


def concat(arrays, axis=0):
    """Join tensors along an existing axis (dtypes promote).

    >>> import express as ex
    >>> ex.concat([ex.ones((1, 2)), ex.zeros((1, 2))]).numpy()
    array([[1., 1.],
           [0., 0.]], dtype=float32)
    """
    xs = [as_tensor(a) for a in arrays]
    if not xs:
        raise ShapeError("concat: needs at least one tensor")
    if axis is None:
        xs, axis = [reshape(x, (-1,)) for x in xs], 0
    nd = xs[0].ndim
    if nd == 0:
        raise ShapeError("concat: zero-dimensional tensors cannot be concatenated")
    axis = norm_axis("concat", axis, nd)
    for x in xs:
        if x.ndim != nd or x.shape[:axis] + x.shape[axis + 1:] != xs[0].shape[:axis] + xs[0].shape[axis + 1:]:
            raise ShapeError(f"concat: shapes {', '.join(str(t.shape) for t in xs)} differ outside axis {axis}")
    d = xs[0].dtype
    for x in xs[1:]:
        d = dt.promote(d, x.dtype)
    from .elementwise import astype
    xs = [astype(x, d) for x in xs]
    return xs[0] if len(xs) == 1 else node(_CONCAT, xs, axis=axis)


def stack(arrays, axis=0):
    """Join same-shape tensors along a new axis."""
    xs = [as_tensor(a) for a in arrays]
    if not xs:
        raise ShapeError("stack: needs at least one tensor")
    if any(x.shape != xs[0].shape for x in xs):
        raise ShapeError(f"stack: shapes {', '.join(str(t.shape) for t in xs)} differ")
    axis = norm_axis("stack", axis, xs[0].ndim + 1)
    return concat([expand_dims(x, axis) for x in xs], axis=axis)


def split(x, indices_or_sections, axis=0):
    """Split into a list of views: `n` equal sections, or at the given indices (as NumPy)."""
    x = as_tensor(x)
    axis = norm_axis("split", axis, x.ndim)
    n = x.shape[axis]
    if isinstance(indices_or_sections, int):
        k = indices_or_sections
        if k <= 0 or n % k:
            raise ShapeError(f"split: axis {axis} of size {n} does not split into {k} equal sections")
        bounds = [i * (n // k) for i in range(k + 1)]
    else:
        bounds = [0] + [builtins.min(builtins.max(int(i), 0), n) for i in indices_or_sections] + [n]
    pre = (slice(None),) * axis
    return [getitem(x, pre + (slice(a, builtins.max(a, b)),)) for a, b in zip(bounds[:-1], bounds[1:])]


# ---- triangles: a mask folded from constants, applied with where ----
def _tri(name, x, k, lower):
    from .elementwise import where
    x = as_tensor(x)
    if x.ndim < 2:
        raise ShapeError(f"{name}: needs rank >= 2, got shape {x.shape}")
    m, n = x.shape[-2:]
    keep = np.tri(m, n, k, dtype=bool) if lower else ~np.tri(m, n, k - 1, dtype=bool)
    return where(constant(keep), x, constant(np.zeros((), x.dtype.np)))


def tril(x, k=0):
    """The lower triangle of the last two axes (elements above diagonal `k` zeroed)."""
    return _tri("tril", x, k, True)


def triu(x, k=0):
    """The upper triangle of the last two axes (elements below diagonal `k` zeroed)."""
    return _tri("triu", x, k, False)


# ---- slice_update: write into an existing buffer (KV caches) ----
def _slice_update_infer(target, update, start, axis):
    if update.dtype is not target.dtype:
        raise DTypeError(f"slice_update: update dtype {update.dtype.name} differs from target {target.dtype.name}")
    if update.ndim != target.ndim or update.shape[:axis] + update.shape[axis + 1:] != target.shape[:axis] + target.shape[axis + 1:]:
        raise ShapeError(f"slice_update: update {update.shape} does not fit target {target.shape} along axis {axis}")
    if update.shape[axis] > target.shape[axis]:
        raise ShapeError(f"slice_update: update {update.shape} is longer than target {target.shape} on axis {axis}")
    if not (start.dtype is dt.int64 and start.ndim == 0):
        raise DTypeError(f"slice_update: start must be a 0-d int64 tensor, got {start.dtype.name} {start.shape}")
    return target.shape, target.dtype


def _slice_update_prepare(out, ins, axis):
    target, update, start = ins
    outer = int(np.prod(target.shape[:axis], dtype=np.int64))
    inner = int(np.prod(target.shape[axis + 1:], dtype=np.int64))
    args = (target.itemsize, ffi.cast("void *", ptr(target)), outer, target.shape[axis], inner,
            ffi.cast("void *", ptr(update)), update.shape[axis], ffi.cast("int64_t *", ptr(start)))
    n, m = target.shape[axis], update.shape[axis]

    def fail(rc):
        raise OutOfRangeError(f"slice_update: start {int(start)} + length {m} is outside axis {axis} "
                              f"of size {n} (target {target.shape})")
    return KernelCall("slice_update", args, "slice_update", fail)


def _slice_update_ref(target, update, start, axis):
    out = np.array(target)
    s = int(start)
    out[(slice(None),) * axis + (slice(s, s + update.shape[axis]),)] = update
    return out


_SLICE_UPDATE = defop("slice_update", "kernel", _slice_update_infer, _slice_update_ref,
                      prepare=_slice_update_prepare, contiguous=(0, 1, 2), inplace=0)


def slice_update(target, update, start, axis=0):
    """Write `update` into the evaluated tensor `target` at `start` along `axis`, in place, and
    return a tensor over target's buffer. `start` may be a 0-d int64 tensor computed at run time
    (a compiled decode step's position), so a preallocated KV cache needs no concat per token.

    >>> import express as ex
    >>> cache = ex.zeros((4, 2))
    >>> ex.eval(cache)
    >>> ex.slice_update(cache, ex.ones((1, 2)), 2).numpy()[:, 0]
    array([0., 0., 1., 0.], dtype=float32)
    """
    target = as_tensor(target)
    if not target.is_evaluated or not target.numpy().flags.c_contiguous:
        raise ExpressError("slice_update: the target must be an evaluated, contiguous tensor (a buffer to write into)")
    axis = norm_axis("slice_update", axis, target.ndim)
    if not isinstance(start, Tensor):
        s = operator.index(start)
        if not 0 <= s <= target.shape[axis] - as_tensor(update).shape[axis]:
            raise OutOfRangeError(f"slice_update: start {s} + length {as_tensor(update).shape[axis]} is outside "
                                  f"axis {axis} of size {target.shape[axis]} (target {target.shape})")
        start = constant(np.array(s, np.int64))
    update = as_tensor(update)
    if update.dtype is not target.dtype:
        from .elementwise import astype
        update = astype(update, target.dtype)
    return node(_SLICE_UPDATE, [target, update, start], axis=axis)
