"""Graph passes run on import, on the importer's graph (ir.py):

- constant folding: a node whose inputs are all initializers (Constant nodes included) is run
  once and replaced by its value (when that is not larger than 4M values or than its inputs, so
  int8 weights dequantized by Cast and Mul fold to float32 once);
- BatchNormalization after a Conv folds into the Conv's weights and bias;
- LayerNorm written out (ReduceMean, Sub, Pow, ReduceMean, Add eps, Sqrt, Div, Mul, Add) becomes
  one LayerNormalization node (the fused layer_norm kernel);
- GELU written out (the erf form and the tanh form) becomes one Gelu node;
- attention written out (MatMul(Q, K^T), scaling, mask, Softmax, MatMul V) becomes one
  `express:Attention` node (the fused scaled_dot_product_attention kernel);
- MatMul by a constant 2-D weight (and Gemm with constant B), with an Add of a constant bias and
  a Relu/Gelu/Sigmoid/Tanh after it, becomes one `express:Linear` node with its weight stored
  (out, in) for the linear kernel.
Shape subgraphs of known shapes fold when the graph is built for given inputs (Shape yields a
constant there), so dynamic axes stay dynamic. Fused nodes check the shapes they meet at run time
and fall back to the written-out computation where the kernel does not apply.
"""
from __future__ import annotations

import math

import numpy as np

from express.tensor import Tensor

from .ir import Graph, ModelIR, Node

_NO_FOLD = {"If", "Loop", "Scan", "SequenceMap", "RandomNormal", "RandomUniform", "RandomNormalLike",
            "RandomUniformLike", "Bernoulli", "Multinomial", "Dropout"}
_MAX_FOLD = 1 << 22


def optimize(ir: ModelIR) -> ModelIR:
    from express.errors import ModelError
    g = ir.graph
    try:
        fold_constants(g, ir.opset)
        fold_batchnorm(g)
        fuse_layernorm(g)
        fuse_gelu(g)
        fuse_attention(g, ir.opset)
        fuse_linear(g)
    except (IndexError, KeyError, ValueError, TypeError, AttributeError) as e:
        raise ModelError(f"malformed graph {g.name!r}: {type(e).__name__}: {e}") from None
    return ir


def _uses(g: Graph):
    uses = {}
    for n in g.nodes:
        for i in n.inputs:
            uses[i] = uses.get(i, 0) + 1
        for v in n.attrs.values():
            for sub in (v if isinstance(v, list) else [v]):
                if isinstance(sub, Graph):   # names a subgraph reads from the outer scope
                    for sn in sub.nodes:
                        for i in sn.inputs:
                            uses[i] = uses.get(i, 0) + 1
    for o in g.outputs:
        uses[o.name] = uses.get(o.name, 0) + 1
    return uses


def fold_constants(g: Graph, opset: int) -> int:
    from .ops import OPS

    class _Ctx:
        pass
    ctx = _Ctx()
    ctx.opset = opset
    keep, folded = [], 0
    for n in g.nodes:
        impl = OPS.get(n.op_type if not n.domain else f"{n.domain}:{n.op_type}")
        ins = [i for i in n.inputs if i]
        if (impl is None or impl.ctx and n.op_type != "Softmax" or n.op_type in _NO_FOLD
                or not all(i in g.initializers for i in ins) or any(isinstance(v, Graph) for v in n.attrs.values())):
            keep.append(n)
            continue
        try:
            from .model import _const_tensor
            args = [_const_tensor(g.initializers[i]) if i else None for i in n.inputs]
            while args and args[-1] is None:
                args.pop()
            ctx.node = n
            res = impl.fn(ctx, *args, **n.attrs) if impl.ctx else impl.fn(*args, **n.attrs)
            res = res if isinstance(res, tuple) else (res,)
            limit = max([_MAX_FOLD] + [g.initializers[i].size for i in ins])   # never larger than its inputs
            if not all(isinstance(r, Tensor) and r.size <= limit for r, o in zip(res, n.outputs) if o):
                keep.append(n)
                continue
            for r, o in zip(res, n.outputs):
                if o:
                    g.initializers[o] = np.array(r.numpy())
            folded += 1
        except Exception:   # leave it to run time, where errors name the node
            keep.append(n)
    g.nodes[:] = keep
    return folded


def fold_batchnorm(g: Graph) -> int:
    uses = _uses(g)
    producer = {o: n for n in g.nodes for o in n.outputs}
    drop, done = set(), 0
    for bn in g.nodes:
        if bn.op_type != "BatchNormalization" or bn.attrs.get("training_mode", 0) or len([o for o in bn.outputs if o]) != 1:
            continue
        if len(bn.inputs) != 5:
            continue
        conv = producer.get(bn.inputs[0])
        params = bn.inputs[1:5]
        if (conv is None or conv.op_type != "Conv" or len(conv.inputs) < 2 or len(conv.outputs) != 1 or uses.get(conv.outputs[0], 0) != 1
                or not all(p in g.initializers for p in params) or conv.inputs[1] not in g.initializers
                or (len(conv.inputs) > 2 and conv.inputs[2] and conv.inputs[2] not in g.initializers)):
            continue
        scale, bias, mean, var = (np.asarray(g.initializers[p], np.float32) for p in params)
        w = np.asarray(g.initializers[conv.inputs[1]], np.float32)
        b = np.asarray(g.initializers[conv.inputs[2]], np.float32) if len(conv.inputs) > 2 and conv.inputs[2] else 0.0
        k = scale / np.sqrt(var + bn.attrs.get("epsilon", 1e-5))
        wn, bn_name = conv.inputs[1] + "/bnfold", conv.outputs[0] + "/bias"
        g.initializers[wn] = (w * k.reshape((-1,) + (1,) * (w.ndim - 1))).astype(np.float32)
        g.initializers[bn_name] = ((b - mean) * k + bias).astype(np.float32)
        conv.inputs[1:] = [wn, bn_name]
        conv.outputs[0] = bn.outputs[0]
        drop.add(id(bn))
        done += 1
    g.nodes[:] = [n for n in g.nodes if id(n) not in drop]
    return done


_ACTS = {"Relu": "Relu", "Sigmoid": "Sigmoid", "Tanh": "Tanh"}


def _linear_weight(g: Graph, node):
    """(weight (out, in) float32 as stored for the linear kernel, bias name or None) of a MatMul or
    Gemm by a constant 2-D weight, else None."""
    w = g.initializers.get(node.inputs[1]) if len(node.inputs) > 1 else None
    if w is None or w.ndim != 2 or w.dtype.kind != "f" or node.inputs[0] in g.initializers:
        return None
    if node.op_type == "MatMul":
        return np.ascontiguousarray(w.T), None
    a = node.attrs
    if a.get("transA", 0) or len(node.outputs) != 1:
        return None
    wt = (w if a.get("transB", 0) else w.T) * np.asarray(a.get("alpha", 1.0), w.dtype)
    c = node.inputs[2] if len(node.inputs) > 2 and node.inputs[2] else None
    if c is None:
        return np.ascontiguousarray(wt), None
    b = g.initializers.get(c)
    if b is None or b.size != wt.shape[0] or b.ndim > 2 or b.ndim == 2 and b.shape[0] != 1:
        return None
    bn = f"{c}/{node.outputs[0]}/bias"
    g.initializers[bn] = (np.asarray(b).reshape(-1) * np.asarray(a.get("beta", 1.0), b.dtype)).astype(b.dtype)
    return np.ascontiguousarray(wt), bn


def fuse_linear(g: Graph) -> int:
    v = _View(g)
    drop, done = set(), 0
    for mm in g.nodes:
        if mm.op_type not in ("MatMul", "Gemm") or mm.domain or len(mm.outputs) != 1 or id(mm) in drop:
            continue
        got = _linear_weight(g, mm)
        if got is None:
            continue
        wt, bias = got
        out = mm.outputs[0]
        if bias is None and mm.op_type == "MatMul":
            add = v.only_user(out, "Add")
            if add is not None and len(add.inputs) == 2 and id(add) not in drop:
                other = add.inputs[1] if add.inputs[0] == out else add.inputs[0]
                b = g.initializers.get(other)
                if b is not None and b.shape == (wt.shape[0],) and b.dtype == wt.dtype:
                    bias, out = other, add.outputs[0]
                    drop.add(id(add))
        act = ""
        nxt = v.only_user(out, *_ACTS, "Gelu")
        if nxt is not None and len(nxt.outputs) == 1 and id(nxt) not in drop:
            act = {"none": "Gelu", "tanh": "GeluTanh"}.get(nxt.attrs.get("approximate", "none"), None) \
                if nxt.op_type == "Gelu" else _ACTS[nxt.op_type]
            if act is not None:
                out = nxt.outputs[0]
                drop.add(id(nxt))
            act = act or ""
        wname, layout = mm.inputs[1], 1
        if v.uses.get(wname, 0) == 1:      # read only here: store it (out, in)
            g.initializers[wname] = wt
        elif mm.op_type == "MatMul":       # shared: keep the one (in, out) copy
            layout = 0
        else:
            wname = f"{wname}/{mm.outputs[0]}/linear"
            g.initializers[wname] = wt
        mm.op_type, mm.domain = "Linear", "express"
        mm.inputs, mm.outputs = [mm.inputs[0], wname] + ([bias] if bias else []), [out]
        mm.attrs = {"activation": act, "wt": layout}
        done += 1
    g.nodes[:] = [n for n in g.nodes if id(n) not in drop]
    return done


# ---- pattern matching over the node list ----
class _View:
    """Producer/consumer maps of a graph, rebuilt per pass."""

    def __init__(self, g: Graph):
        self.g = g
        self.uses = _uses(g)
        self.prod = {o: n for n in g.nodes for o in n.outputs if o}
        self.cons = {}
        for n in g.nodes:
            for i in set(n.inputs):
                if i:
                    self.cons.setdefault(i, []).append(n)
        self.outs = {o.name for o in g.outputs}

    def const(self, name):
        """The float value of a one-element initializer of rank 0 or 1 (it does not raise the rank of
        what it multiplies), else None."""
        a = self.g.initializers.get(name)
        if a is None or a.size != 1 or a.ndim > 1 or a.dtype.kind not in "fiu":
            return None
        return float(np.asarray(a).reshape(-1)[0])

    def private(self, name, n=1):
        """`name` is read exactly `n` times, and is not a graph output."""
        return self.uses.get(name, 0) == n and name not in self.outs

    def node(self, name, *ops, private=True):
        """The producer of `name` when its op type is one of `ops` (and its output feeds only here)."""
        p = self.prod.get(name)
        if p is None or p.domain or p.op_type not in ops or (private and not self.private(name)):
            return None
        return p

    def only_user(self, name, *ops):
        c = self.cons.get(name, [])
        if len(c) != 1 or c[0].domain or c[0].op_type not in ops or name in self.outs \
                or self.uses.get(name, 0) != c[0].inputs.count(name):
            return None
        return c[0]

    def split(self, n, value=None):
        """(the scalar constant, the other input) of a binary node with one constant operand."""
        if len(n.inputs) != 2:
            return None, None
        a, b = n.inputs
        for c, o in ((b, a), (a, b)):
            v = self.const(c)
            if v is not None and (value is None or _near(v, value)):
                return v, o
        return None, None


def _near(v, want, rel=1e-4):
    return abs(v - want) <= rel * abs(want)


def _replace(g: Graph, matches) -> int:
    """Put each (new node, nodes it replaces) into the graph at the place of the last replaced node."""
    drop, put = set(), {}
    for new, old in matches:
        drop.update(id(n) for n in old)
        put[id(old[-1])] = new
    g.nodes[:] = [put.get(id(n), n) for n in g.nodes if id(n) not in drop or id(n) in put]
    return len(matches)


def _reduce_axes(v: _View, n):
    if n.attrs.get("keepdims", 1) != 1:
        return None
    if len(n.inputs) > 1 and n.inputs[1]:
        a = v.g.initializers.get(n.inputs[1])
        return None if a is None else tuple(int(i) for i in np.asarray(a).reshape(-1))
    return tuple(n.attrs["axes"]) if "axes" in n.attrs else None


def fuse_layernorm(g: Graph) -> int:
    """ReduceMean -> Sub -> Pow 2 (or Mul) -> ReduceMean -> Add eps -> Sqrt -> Div [-> Mul gamma
    -> Add beta] over trailing axes (negative, as exporters write them) -> LayerNormalization."""
    v, found = _View(g), []
    claimed = set()
    for r1 in g.nodes:
        if r1.op_type != "ReduceMean" or r1.domain:
            continue
        axes = _reduce_axes(v, r1)
        if not axes or sorted(axes) != list(range(-len(axes), 0)):
            continue
        x, m = r1.inputs[0], r1.outputs[0]
        sub = v.only_user(m, "Sub")
        if sub is None or sub.inputs != [x, m]:
            continue
        d = sub.outputs[0]
        users = v.cons.get(d, [])
        sq = next((n for n in users if n.op_type == "Pow" and n.inputs[0] == d and v.const(n.inputs[1]) == 2.0
                   or n.op_type == "Mul" and n.inputs == [d, d]), None)
        div = next((n for n in users if n.op_type == "Div" and n.inputs[0] == d), None)
        if sq is None or div is None or len(users) != 2 or not v.private(d, 2 + (sq.op_type == "Mul")):
            continue
        r2 = v.only_user(sq.outputs[0], "ReduceMean")
        if r2 is None or _reduce_axes(v, r2) != axes:
            continue
        add = v.only_user(r2.outputs[0], "Add")
        eps, _ = v.split(add) if add is not None else (None, None)
        sqrt = v.only_user(add.outputs[0], "Sqrt") if eps is not None else None
        if sqrt is None or v.only_user(sqrt.outputs[0], "Div") is not div or div.inputs[1] != sqrt.outputs[0]:
            continue
        chain, out, gamma, beta = [r1, sub, sq, r2, add, sqrt, div], div.outputs[0], "", ""
        mul = v.only_user(out, "Mul")
        if mul is not None:
            other = mul.inputs[1] if mul.inputs[0] == out else mul.inputs[0]
            if other in g.initializers:
                chain.append(mul)
                gamma, out = other, mul.outputs[0]
                bias = v.only_user(out, "Add")
                if bias is not None:
                    other = bias.inputs[1] if bias.inputs[0] == out else bias.inputs[0]
                    if other in g.initializers:
                        chain.append(bias)
                        beta, out = other, bias.outputs[0]
        if claimed & {id(n) for n in chain}:
            continue
        claimed.update(id(n) for n in chain)
        ins = [x, gamma, beta] if beta else [x, gamma] if gamma else [x]
        found.append((Node("LayerNormalization", ins, [out], {"axis": min(axes), "epsilon": eps},
                           r1.name or out), chain))
    return _replace(g, found)


def _gelu_tail(v: _View, x, one_plus):
    """The nodes computing 0.5 * x * one_plus, in any of the orders exporters write, and the output."""
    m1 = v.only_user(one_plus, "Mul")
    if m1 is None:
        return None
    other = m1.inputs[1] if m1.inputs[0] == one_plus else m1.inputs[0]
    if other == x:                                   # (x * (1 + e)) * 0.5
        m2 = v.only_user(m1.outputs[0], "Mul")
        if m2 is not None and v.split(m2, 0.5)[1] == m1.outputs[0]:
            return [m1, m2], m2.outputs[0]
        return None
    if v.const(other) is not None and _near(v.const(other), 0.5):    # x * ((1 + e) * 0.5)
        m2 = v.only_user(m1.outputs[0], "Mul")
        if m2 is not None and set(m2.inputs) == {x, m1.outputs[0]}:
            return [m1, m2], m2.outputs[0]
        return None
    half = v.node(other, "Mul")                      # (x * 0.5) * (1 + e)
    if half is not None and v.split(half, 0.5)[1] == x:
        return [half, m1], m1.outputs[0]
    return None


def fuse_gelu(g: Graph) -> int:
    """The erf form 0.5 * x * (1 + erf(x / sqrt 2)) and the tanh form
    0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 x^3))) -> Gelu."""
    v, found, claimed = _View(g), [], set()
    for n in g.nodes:
        if n.domain or n.op_type not in ("Erf", "Tanh"):
            continue
        head, x = [], None
        if n.op_type == "Erf":
            p = v.node(n.inputs[0], "Div", "Mul")
            if p is not None:
                c, x = v.split(p)
                ok = c is not None and (_near(c, math.sqrt(2)) and p.op_type == "Div" and p.inputs[1] != x
                                        or _near(c, math.sqrt(0.5)) and p.op_type == "Mul")
                x = x if ok else None
                head = [p]
            approx = "none"
        else:
            approx = "tanh"
            p = v.node(n.inputs[0], "Mul")
            c, u = v.split(p, math.sqrt(2 / math.pi)) if p is not None else (None, None)
            add = v.node(u, "Add") if u is not None else None
            if add is not None:
                for cand in add.inputs:
                    rest = add.inputs[1] if add.inputs[0] == cand else add.inputs[0]
                    mc = v.node(rest, "Mul")
                    _, cube = v.split(mc, 0.044715) if mc is not None else (None, None)
                    cube_nodes = _cube(v, cube, cand) if cube is not None else None
                    if cube_nodes is not None:
                        x, head = cand, cube_nodes + [mc, add, p]
                        break
        if x is None:
            continue
        a1 = v.only_user(n.outputs[0], "Add")
        if a1 is None or v.split(a1, 1.0)[1] != n.outputs[0]:
            continue
        tail = _gelu_tail(v, x, a1.outputs[0])
        if tail is None:
            continue
        chain = head + [n, a1] + tail[0]
        if claimed & {id(c) for c in chain}:
            continue
        claimed.update(id(c) for c in chain)
        found.append((Node("Gelu", [x], [tail[1]], {"approximate": approx}, n.name or tail[1]),
                      sorted(chain, key=lambda c: g.nodes.index(c))))
    return _replace(g, found)


def _cube(v: _View, name, x):
    """The nodes computing x^3 as Pow(x, 3), x * (x * x) or (x * x) * x."""
    p = v.node(name, "Pow", "Mul")
    if p is None:
        return None
    if p.op_type == "Pow":
        return [p] if p.inputs[0] == x and v.const(p.inputs[1]) == 3.0 else None
    if x not in p.inputs:
        return None
    other = p.inputs[1] if p.inputs[0] == x else p.inputs[0]
    sq = v.prod.get(other)
    if sq is not None and sq.op_type == "Mul" and sq.inputs == [x, x] and v.private(other):
        return [sq, p]
    return None


def _scaled(v: _View, name, scale=1.0, nodes=None):
    """Follow Mul/Div by scalar constants back from `name`: (the source, total factor, nodes)."""
    nodes = [] if nodes is None else nodes
    while True:
        p = v.node(name, "Mul", "Div")
        if p is None:
            return name, scale, nodes
        c, src = v.split(p)
        if c is None or c == 0 or (p.op_type == "Div" and p.inputs[0] != src):
            return name, scale, nodes
        scale = scale / c if p.op_type == "Div" else scale * c
        nodes.insert(0, p)
        name = src


def fuse_attention(g: Graph, opset: int) -> int:
    """MatMul(Q, K^T) -> scale (Mul/Div by constants, on the scores or on Q and K^T) -> optional
    additive mask (Add) or masked fill (Where) -> Softmax over the last axis [-> IsNaN/Where guard]
    -> MatMul V  ->  one express:Attention node (express.nn.functional.scaled_dot_product_attention)."""
    v, found, claimed = _View(g), [], set()
    for sm in g.nodes:
        if sm.op_type != "Softmax" or sm.domain or ("axis" not in sm.attrs and opset < 13):
            continue
        chain, mask, attrs = [], [], {}
        s = sm.inputs[0]
        pre = v.node(s, "Add", "Where")
        scores = s
        if pre is not None:
            if pre.op_type == "Add":
                for cand in pre.inputs:
                    src, _, _ = _scaled(v, cand)
                    if v.node(src, "MatMul") is not None:
                        scores = cand
                        mask = [pre.inputs[1] if pre.inputs[0] == cand else pre.inputs[0]]
                        attrs["mask_kind"] = "add"
                        break
            else:
                c, a, b = pre.inputs
                fa, fb = v.const(a), v.const(b)    # a masked fill with -inf (a finite fill is not a mask)
                if fa == -math.inf and fb is None:
                    scores, mask, attrs["mask_kind"] = b, [c], "fill_true"
                elif fb == -math.inf and fa is None:
                    scores, mask, attrs["mask_kind"] = a, [c], "fill_false"
            if mask:
                chain.append(pre)
        src, scale, snodes = _scaled(v, scores)
        mm = v.node(src, "MatMul")
        if mm is None or not mask and scores != s:
            continue
        q, qs, qn = _scaled(v, mm.inputs[0])
        kt, ks, kn = _scaled(v, mm.inputs[1])
        p, guard = sm.outputs[0], []
        users = v.cons.get(p, [])
        if len(users) == 2 and {u.op_type for u in users} == {"IsNaN", "Where"} and v.private(p, 2):
            isnan = next(u for u in users if u.op_type == "IsNaN")
            w = next(u for u in users if u.op_type == "Where")
            if w.inputs[0] == isnan.outputs[0] and v.const(w.inputs[1]) == 0.0 and w.inputs[2] == p \
                    and v.private(isnan.outputs[0]):
                guard, p = [isnan, w], w.outputs[0]
                attrs["nan_guard"] = 1
        mv = v.only_user(p, "MatMul")
        if mv is None or mv.inputs[0] != p or not v.private(p):
            continue
        chain = qn + kn + [mm] + snodes + chain + [sm] + guard + [mv]
        if claimed & {id(c) for c in chain}:
            continue
        claimed.update(id(c) for c in chain)
        attrs.update(scale=float(scale * qs * ks), softmax_axis=int(sm.attrs.get("axis", -1 if opset >= 13 else 1)),
                     legacy_softmax=int(opset < 13))
        found.append((Node("Attention", [q, kt, mv.inputs[1]] + mask, [mv.outputs[0]], attrs,
                           sm.name or mv.outputs[0], "express"), chain))
    return _replace(g, found)
