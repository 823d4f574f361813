"""Kernel-level graph rewrites run by the planner before elementwise fusion:

  - batch norm after a convolution with constant weights is folded into the weights and bias;
  - a residual `add` of a convolution / linear / quantized linear (one weight) output and a
    same-shape tensor becomes the kernel's residual input;
  - an activation (relu, relu6 = clip(0, 6), silu, gelu, sigmoid) after a convolution, linear,
    group norm or batch norm becomes the kernel's epilogue;
  - a convolution's algorithm is chosen (`ops.nn.choose_conv_algo`); constant weights are
    transformed once here for Winograd, or marked to be packed once for the GEMM micro-kernel;
  - a 1x1 convolution whose only consumer is a depthwise one becomes, with it, one `conv_pwdw`
    when the tensor between them is large (`ops.nn.pwdw_fusable`).

A rewrite only absorbs a producer that has a single consumer and is not a requested output, so
nothing is computed twice. User tensors are never mutated: rewritten nodes are new Tensors and
`canon` is redirected to them."""
from __future__ import annotations

import weakref

import numpy as np

from . import dtypes as dt
from .ops import nn as _nn
from .ops.quant import _QLINEAR
from .tensor import Tensor, constant

_ACT_OPS = {"relu": "relu", "silu": "silu", "gelu": "gelu", "gelu_tanh": "gelu_tanh", "sigmoid": "sigmoid"}
_EPILOGUE = (_nn.CONV2D, _nn.LINEAR, _QLINEAR)
_ACT_HOSTS = (_nn.CONV2D, _nn.LINEAR, _nn.GROUP_NORM, _nn.BATCH_NORM)
# transformed Winograd weights by weight tensor (by id + weak reference: Tensor's == is elementwise)
_WINO_CACHE: dict = {}


def _wino_cached(w, algo):
    e = _WINO_CACHE.get((id(w), algo))
    if e is not None and e[0]() is w:
        return e[1]
    u = constant(_nn.winograd_weights(w._value, algo))

    def drop(ref, k=(id(w), algo)):
        cur = _WINO_CACHE.get(k)
        if cur is not None and cur[0] is ref:
            del _WINO_CACHE[k]
    _WINO_CACHE[(id(w), algo)] = (weakref.ref(w, drop), u)
    return u


def _act_of(t):
    name = t.op.name
    if name in _ACT_OPS:
        return _ACT_OPS[name]
    if name == "clamp" and t.attrs.get("lo") == 0.0 and t.attrs.get("hi") == 6.0:
        return "relu6"
    return None


def _const(t, limit=64):
    """t's value if it is constant: evaluated, or a small lazy subgraph of constants only (e.g.
    `ones(n)` parameters), which is evaluated here; None when it depends on a placeholder."""
    if t._value is not None:
        return t._value
    stack, seen = [t], set()
    while stack:
        u = stack.pop()
        if id(u) in seen or u._value is not None:
            continue
        seen.add(id(u))
        if u.op is None or len(seen) > limit:
            return None
        stack.extend(u.inputs)
    return t.numpy()


def _takes_res(p):
    """Whether kernel p can take a residual input: no activation and none yet.  A quantized linear
    takes one over one weight (not several side by side) and up to 16 rows: a decode step's
    o_proj / down_proj then skip a separate add (a Qwen2.5-0.5B step: 48 kernel calls fewer), but
    with a 128-token prompt those two ran 5-14% slower with the residual than the add cost."""
    if p.attrs.get("has_res") or p.attrs.get("act", "none") != "none":
        return False
    return p.op is not _QLINEAR or (len(p.attrs["ns"]) == 1 and p.shape[0] <= 16)


def _rebuild(t, inputs, **changes):
    attrs = dict(t.attrs, **changes)
    return Tensor(t.op, tuple(inputs), attrs, t.shape, t.dtype)


def _fold_bn(conv, cins, bn, bins):
    """conv's weights/bias with bn folded in, or None when something is not constant."""
    x, w = cins[0], cins[1]
    b = cins[2] if conv.attrs["has_bias"] else None
    mean, var = bins[1], bins[2]
    rest = iter(bins[3:])
    g = next(rest) if bn.attrs["has_w"] else None
    beta = next(rest) if bn.attrs["has_b"] else None
    vals = [_const(t) for t in (w, mean, var) + tuple(t for t in (b, g, beta) if t is not None)]
    if any(v is None for v in vals):
        return None
    v = lambda t: np.asarray(_const(t), np.float64)  # noqa: E731
    s = 1.0 / np.sqrt(v(var) + bn.attrs["eps"])
    if g is not None:
        s = s * v(g)
    w2 = (v(w) * s[:, None, None, None]).astype(np.float32)
    b0 = v(b) if b is not None else 0.0
    b2 = ((b0 - v(mean)) * s + (v(beta) if beta is not None else 0.0)).astype(np.float32)
    return [x, constant(w2), constant(np.ascontiguousarray(b2))]


def _winograd(conv, ins):
    w = ins[1]
    if conv.attrs.get("wlayout", "oihw") != "oihw":
        return None
    a = conv.attrs
    x = ins[0]
    algo = a.get("algo", "auto")
    if algo == "auto":
        algo = _nn.choose_conv_algo(x.shape[1], conv.shape[1], conv.shape[2], conv.shape[3], tuple(w.shape[2:]),
                                    a["stride"], a["dilation"], a["groups"])
    if w._value is None:
        return None
    if algo not in _nn.WINOGRAD_POINTS:  # GEMM / depthwise: constant GEMM weights are packed once at prepare
        return None if a.get("prepack") or algo == "depthwise" else _rebuild(conv, ins, algo=algo, prepack=True)
    u = _wino_cached(w, algo)
    return _rebuild(conv, [x, u] + list(ins[2:]), algo=algo, wlayout="winograd", kernel=tuple(w.shape[2:]),
                    prepack=True)


def fuse_kernels(nodes: list, canon: dict, roots) -> list:
    """Rewrite `nodes` (topological, canonical) in place of the planner's list; updates `canon`."""
    repl: dict[int, Tensor] = {}

    def res(i):
        t = canon.get(id(i), i)
        while id(t) in repl:
            t = repl[id(t)]
        return t

    root_ids = {id(res(r)) for r in roots}
    consumers: dict[int, int] = {}
    for t in nodes:
        for i in {id(res(i)): 0 for i in t.inputs}:
            consumers[i] = consumers.get(i, 0) + 1

    def absorbable(p, ops):
        return (p.op in ops and p._value is None and consumers.get(id(p), 0) == 1 and id(p) not in root_ids)

    out: list[Tensor] = []
    dead: set[int] = set()
    for t in nodes:
        ins = [res(i) for i in t.inputs]
        new = None
        if t.op is _nn.BATCH_NORM and t.attrs["act"] == "none":
            p = ins[0]
            if absorbable(p, (_nn.CONV2D,)) and p.attrs["act"] == "none" and not p.attrs["has_res"] and \
                    p.attrs.get("wlayout", "oihw") == "oihw":
                pins = [res(i) for i in p.inputs]
                folded = _fold_bn(p, pins, t, ins)
                if folded is not None:
                    new, gone = _rebuild(p, folded, has_bias=True), p
        elif t.op.name == "add" and t.dtype is dt.float32 and len(ins) == 2:
            for k in (0, 1):
                p, r = ins[k], ins[1 - k]
                if (absorbable(p, _EPILOGUE) and _takes_res(p) and r.shape == t.shape == p.shape
                        and r.dtype is dt.float32 and r is not p):
                    new, gone = _rebuild(p, [res(i) for i in p.inputs] + [r], has_res=True), p
                    break
        else:
            act = _act_of(t) if t.op.kind == "elementwise" and t.dtype is dt.float32 else None
            if act is not None:
                p = ins[0]
                if absorbable(p, _ACT_HOSTS) and p.attrs["act"] == "none" and p.shape == t.shape:
                    new, gone = _rebuild(p, [res(i) for i in p.inputs], act=act), p
        if new is None:
            out.append(t)
            continue
        dead.add(id(gone))
        repl[id(t)] = new
        consumers[id(new)] = consumers.get(id(t), 0)
        if id(t) in root_ids:
            root_ids.add(id(new))
        for i in {id(x): x for x in new.inputs}.values():
            canon.setdefault(id(i), i)
        out.append(new)
    result = []
    for t in out:
        if id(t) in dead or t._value is not None:  # absorbed, or evaluated as a constant above
            continue
        if t.op is _nn.CONV2D:
            w = _winograd(t, [res(i) for i in t.inputs])
            if w is not None:
                repl[id(t)] = w
                canon.setdefault(id(w.inputs[1]), w.inputs[1])
                t = w
        canon[id(t)] = t
        result.append(t)
    result = _fuse_pwdw(result, canon, {id(res(r)) for r in roots}, res, repl)
    for k in list(canon):
        canon[k] = res(canon[k])
    return result


def _fuse_pwdw(nodes, canon, root_ids, res, repl):
    """Each depthwise convolution fed by a 1x1 convolution that nothing else reads -> one conv_pwdw."""
    uses: dict[int, int] = {}
    for t in nodes:
        for i in {id(res(i)): 0 for i in t.inputs}:
            uses[i] = uses.get(i, 0) + 1
    dead, out = set(), []
    for t in nodes:
        if t.op is _nn.CONV2D and t.attrs.get("wlayout", "oihw") == "oihw":
            ins = [res(i) for i in t.inputs]
            p = ins[0]
            if (p.op is _nn.CONV2D and p._value is None and uses.get(id(p)) == 1 and id(p) not in root_ids
                    and ins[1].ndim == 4 and t.shape[1] == p.shape[1] == ins[1].shape[0] and ins[1].shape[1] == 1
                    and _nn.pwdw_fusable(p.inputs[0].shape, p.attrs, ins[1].shape, t.attrs, p.shape[1])):
                pins = [res(i) for i in p.inputs]
                a, d = p.attrs, t.attrs
                new = Tensor(_nn.CONV_PWDW, tuple(pins + ins[1:]), dict(
                    act1=a["act"], has_b1=a["has_bias"], prepack=bool(a.get("prepack")), stride=d["stride"],
                    pads=d["pads"], act=d["act"], has_b2=d["has_bias"], has_res=d["has_res"]), t.shape, t.dtype)
                dead.add(id(p))
                repl[id(t)] = new
                for i in new.inputs:
                    canon.setdefault(id(i), i)
                canon[id(new)] = new
                t = new
        out.append(t)
    return [t for t in out if id(t) not in dead]
