"""The imported model: an interpreter over the importer's graph that builds lazy Express tensors.

`run(feeds)` checks the feeds against the declared inputs; the first run for an input signature
(shapes and dtypes of the feeds, the outputs asked for) builds the graph for those shapes (shape
subgraphs fold to constants as they are built) and compiles it with `ex.compile`; later runs with
the same signature replay that plan. Graphs whose structure depends on input values (data-dependent
If/Loop, NonZero, TopK, ...) are rebuilt and evaluated on every run. `model(*tensors)` builds the
outputs lazily without evaluating."""
from __future__ import annotations

from collections import ChainMap, OrderedDict

import numpy as np

import express as ex
from express import dtypes as dt
from express.errors import DTypeError, ExpressError, ModelError, ShapeError
from express.tensor import Tensor, as_numpy, constant

from .ir import Graph, ModelIR, ValueInfo
from .ops import OPS


def _const_tensor(a):
    if isinstance(a, np.ndarray) and a.dtype.kind in "OUS":
        return a  # strings: only usable by ops that take them (none yet)
    try:
        return constant(as_numpy(a))
    except DTypeError:
        return a


class _Ctx:
    def __init__(self, model, opset):
        self.model, self.opset, self.node = model, opset, None

    def subgraph(self, g: Graph, args, outer=None):
        return self.model._run_graph(g, args, self.scope)


class Model:
    """An ONNX model imported into Express.

    >>> import numpy as np, onnx
    >>> from onnx import helper as h, TensorProto as T
    >>> g = h.make_graph([h.make_node("Relu", ["x"], ["y"])], "g",
    ...                  [h.make_tensor_value_info("x", T.FLOAT, ["n", 3])],
    ...                  [h.make_tensor_value_info("y", T.FLOAT, ["n", 3])])
    >>> import express as ex
    >>> m = ex.onnx.load(h.make_model(g).SerializeToString())
    >>> m.inputs
    [ValueInfo('x', shape=('n', 3), dtype=float32)]
    >>> m.run({"x": np.array([[-1, 0, 2]], np.float32)})["y"]
    array([[0., 0., 2.]], dtype=float32)
    """

    max_plans = 8   # compiled input signatures kept per model (the least recently used is dropped)

    def __init__(self, ir: ModelIR, optimize: bool = True):
        self.ir = ir
        if optimize:
            from .passes import optimize as _opt
            _opt(ir)
        self._check_ops(ir.graph)
        self._consts = {}
        self._plans: OrderedDict = OrderedDict()   # input signature -> compiled run, or None (not compilable)
        self.inputs: list[ValueInfo] = list(ir.graph.inputs)
        self.outputs: list[ValueInfo] = list(ir.graph.outputs)

    def _check_ops(self, g: Graph):
        for n in g.nodes:
            key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}:{n.op_type}"
            if key not in OPS:
                dom = f" (domain {n.domain!r})" if n.domain else ""
                raise ModelError(f"unsupported ONNX op {n.op_type}{dom} in node {n.name!r} "
                                 f"(inputs {n.inputs}, outputs {n.outputs})")
            for v in n.attrs.values():
                for sub in (v if isinstance(v, list) else [v]):
                    if isinstance(sub, Graph):
                        self._check_ops(sub)

    @property
    def opset(self) -> int:
        return self.ir.opset

    def __repr__(self):
        ins = ", ".join(f"{v.name}{list(v.shape) if v.shape is not None else ''}" for v in self.inputs)
        outs = ", ".join(v.name for v in self.outputs)
        return f"<express.onnx.Model opset {self.opset}: ({ins}) -> ({outs}), {len(self.ir.graph.nodes)} nodes>"

    # ---- running ----
    def __call__(self, *args, **kwargs):
        """Build the outputs lazily from Tensors (positional in input order, or by name): one
        Tensor for a single-output model, else a tuple in output order."""
        feeds = dict(zip([v.name for v in self.inputs], args))
        feeds.update(kwargs)
        outs = self._build(self._check_feeds(feeds))
        vals = [outs[v.name] for v in self.outputs]
        return vals[0] if len(vals) == 1 else tuple(vals)

    def run(self, feeds: dict, output_names=None) -> dict:
        """Run the model on NumPy arrays: returns {output name: np.ndarray}. The first run for an
        input signature (feed shapes and dtypes, outputs asked for) compiles the graph; later runs
        with that signature replay it."""
        if not isinstance(feeds, dict):
            raise ExpressError(f"run: feeds must be a dict of input name -> array, got {type(feeds).__name__}")
        names = [v.name for v in self.outputs] if output_names is None else list(output_names)
        known = {v.name for v in self.outputs}
        bad = [n for n in names if n not in known]
        if bad:
            raise ExpressError(f"run: unknown output name(s) {bad}; the model's outputs are {sorted(known)}")
        checked = self._check_feeds(feeds)
        order = [v.name for v in self.inputs]
        if all(isinstance(checked[k], Tensor) for k in order):
            key = (tuple((checked[k].shape, checked[k].dtype.name) for k in order), tuple(names))
            if key not in self._plans:
                self._plans[key] = self._compile(order, names)
                while len(self._plans) > self.max_plans:
                    self._plans.popitem(last=False)
            self._plans.move_to_end(key)
            fn = self._plans[key]
            if fn is not None:
                try:
                    outs = fn(*[checked[k] for k in order])
                    return {n: outs[n].numpy() for n in names}   # fresh arrays, not the plan's buffers
                except Exception:   # not compilable (the graph reads input values while it is built, ...):
                    self._plans[key] = None   # build and evaluate it per run, where a real error is raised
        outs = self._build(checked, names)
        tensors = [t for n in names for t in _flat(outs[n])]
        ex.eval(*tensors)
        return {n: _to_numpy(outs[n]) for n in names}

    def _compile(self, order, names):
        def fn(*ts):
            outs = self._build(dict(zip(order, ts)), names)
            return {n: outs[n] for n in names}
        return ex.compile(fn)

    def _check_feeds(self, feeds):
        expected = {v.name: v for v in self.inputs}
        unknown = [k for k in feeds if k not in expected]
        if unknown:
            raise ExpressError(f"run: unknown input name(s) {unknown}; the model's inputs are {list(expected)}")
        missing = [k for k in expected if k not in feeds]
        if missing:
            raise ExpressError(f"run: missing input(s) {missing}; the model's inputs are {list(expected)}")
        out, dims = {}, {}
        for name, v in feeds.items():
            info = expected[name]
            if isinstance(v, list) or v is None:     # a sequence or an empty optional
                out[name] = [constant(as_numpy(np.asarray(a))) if not isinstance(a, Tensor) else a for a in v] \
                    if isinstance(v, list) else None
                continue
            if isinstance(v, Tensor):
                t = v
            else:
                a = np.asarray(v)
                if info.dtype is not None and a.dtype != info.dtype.np and not (
                        a.dtype in (np.float64, np.int16, np.uint16, np.uint32) and dt.from_numpy(a.dtype) is info.dtype
                        and self._declared_wide(name)):
                    raise DTypeError(f"run: input {name!r} expects {info.dtype.name}, got an array of {a.dtype}")
                try:
                    t = constant(as_numpy(a))
                except DTypeError as e:
                    raise DTypeError(f"run: input {name!r}: {e}") from None
            if info.dtype is not None and t.dtype is not info.dtype:
                raise DTypeError(f"run: input {name!r} expects {info.dtype.name}, got {t.dtype.name}")
            if info.shape is not None:
                if len(info.shape) != t.ndim:
                    raise ShapeError(f"run: input {name!r} expects rank {len(info.shape)} (shape "
                                     f"{_fmt(info.shape)}), got shape {t.shape}")
                for d, (want, got) in enumerate(zip(info.shape, t.shape)):
                    if isinstance(want, int) and want > 0 and want != got:
                        raise ShapeError(f"run: input {name!r} expects shape {_fmt(info.shape)}, got {t.shape} "
                                         f"(axis {d})")
                    if isinstance(want, str):
                        if dims.setdefault(want, got) != got:
                            raise ShapeError(f"run: dimension {want!r} is {dims[want]} in one input and {got} in "
                                             f"input {name!r}")
            out[name] = t
        return out

    def _declared_wide(self, name):
        return bool(getattr(self.ir, "wide_inputs", None) and name in self.ir.wide_inputs)

    def _build(self, feeds, names=None):
        ctx = _Ctx(self, self.opset)
        return self._run_graph(self.ir.graph, feeds, {}, ctx, names)

    def _consts_of(self, g: Graph):
        c = self._consts.get(id(g))
        if c is None:
            c = self._consts[id(g)] = {k: _const_tensor(a) for k, a in g.initializers.items()}
        return c

    def _run_graph(self, g: Graph, feeds, outer, ctx=None, names=None):
        if ctx is None:  # a subgraph: feeds is a list bound to the graph's inputs in order
            raise AssertionError
        if isinstance(feeds, (list, tuple)):
            if len(feeds) != len(g.inputs):
                raise ModelError(f"subgraph {g.name!r} takes {len(g.inputs)} inputs, got {len(feeds)}")
            feeds = {v.name: a for v, a in zip(g.inputs, feeds)}
        scope = ChainMap(dict(self._consts_of(g)), outer)
        scope.maps[0].update(feeds)
        for node in g.nodes:
            key = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}:{node.op_type}"
            impl = OPS[key]
            try:
                args = [scope[n] if n else None for n in node.inputs]
            except KeyError as e:
                raise ModelError(f"{node.describe()}: input {e.args[0]!r} is not produced by any node, "
                                 "initializer or graph input") from None
            while args and args[-1] is None:
                args.pop()
            ctx.node, ctx.scope = node, scope
            sub_ctx = _SubCtx(self, ctx, scope)
            try:
                res = impl.fn(sub_ctx, *args, **node.attrs) if impl.ctx else impl.fn(*args, **node.attrs)
            except ExpressError as e:
                if str(e).startswith(node.op_type):
                    raise
                raise type(e)(f"{node.describe()}: {e}") from None
            except (TypeError, ValueError, IndexError, KeyError, AttributeError, ZeroDivisionError,
                    OverflowError) as e:
                raise ModelError(f"{node.describe()}: {type(e).__name__}: {e} (inputs "
                                 f"{[_desc(a) for a in args]})") from None
            res = res if isinstance(res, tuple) else (res,)
            for name, v in zip(node.outputs, res):
                if name:
                    scope.maps[0][name] = v
        out = {}
        for v in g.outputs if names is None else [o for o in g.outputs if o.name in names]:
            if v.name not in scope:
                raise ModelError(f"graph output {v.name!r} is not produced by any node")
            out[v.name] = scope[v.name]
        if ctx is not None and g is not self.ir.graph:
            return [out[v.name] for v in g.outputs]
        return out

    def save(self, path, quant_bits=None, group_size: int = 64) -> dict:
        """Save as Express's own format (.exm): the graph plus weights, optionally int8/int4.
        Returns a small report (sizes, quantized tensors)."""
        from ..exm import save_model
        return save_model(self, path, quant_bits=quant_bits, group_size=group_size)


class _SubCtx:
    """What an op with ctx=True sees: the opset, its node, and a way to run its subgraphs."""

    def __init__(self, model, ctx, scope):
        self.model, self.opset, self.node, self._ctx, self._scope = model, ctx.opset, ctx.node, ctx, scope

    def subgraph(self, g: Graph, args):
        return self.model._run_graph(g, list(args), self._scope, self._ctx)


def _flat(v):
    if isinstance(v, Tensor):
        return [v]
    if isinstance(v, list):
        return [t for t in v if isinstance(t, Tensor)]
    return []


def _to_numpy(v):
    if isinstance(v, Tensor):
        return np.array(v.numpy())
    if isinstance(v, list):
        return [_to_numpy(t) for t in v]
    return v


def _fmt(shape):
    return "(" + ", ".join(str(s) if s is not None else "?" for s in shape) + ")"


def _desc(a):
    if isinstance(a, Tensor):
        return f"{a.dtype.name}{list(a.shape)}"
    if isinstance(a, list):
        return f"sequence[{len(a)}]"
    return repr(a)
