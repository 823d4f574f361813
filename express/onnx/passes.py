"""Graph passes run on import, on the importer's graph (ir.py):

- constant folding: a node whose inputs are all initializers (Constant nodes included) is run
  once and replaced by its value;
- BatchNormalization after a Conv folds into the Conv's weights and bias;
- MatMul by a constant 2-D weight followed by Add of a constant bias (and Relu/Gelu/Sigmoid/Tanh)
  becomes one `express:Linear` node.
Shape subgraphs of known shapes fold when the graph is built for given inputs (Shape yields a
constant there), so dynamic axes stay dynamic.
"""
from __future__ import annotations

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
            if not all(isinstance(r, Tensor) and r.size <= _MAX_FOLD for r, o in zip(res, n.outputs) if o):
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


_ACTS = {"Relu": "Relu", "Gelu": "Gelu", "Sigmoid": "Sigmoid", "Tanh": "Tanh"}


def fuse_linear(g: Graph) -> int:
    uses = _uses(g)
    consumer = {}
    for n in g.nodes:
        for i in n.inputs:
            consumer.setdefault(i, []).append(n)
    drop, done = set(), 0
    out_names = {o.name for o in g.outputs}
    for mm in g.nodes:
        if mm.op_type != "MatMul" or mm.domain or len(mm.inputs) != 2 or len(mm.outputs) != 1 \
                or mm.inputs[1] not in g.initializers:
            continue
        w = g.initializers[mm.inputs[1]]
        h = mm.outputs[0]
        if w.ndim != 2 or uses.get(h, 0) != 1 or h in out_names:
            continue
        add = consumer.get(h, [None])[0]
        if add is None or add.op_type != "Add" or id(add) in drop or len(add.inputs) != 2 or len(add.outputs) != 1:
            continue
        other = add.inputs[1] if add.inputs[0] == h else add.inputs[0]
        b = g.initializers.get(other)
        if b is None or b.shape not in ((w.shape[1],),):
            continue
        act, out = "", add.outputs[0]
        nxt = consumer.get(out, [])
        if len(nxt) == 1 and uses.get(out, 0) == 1 and nxt[0].op_type in _ACTS and out not in out_names \
                and not nxt[0].attrs.get("approximate", "none") != "none":
            act, out = _ACTS[nxt[0].op_type], nxt[0].outputs[0]
            drop.add(id(nxt[0]))
        drop.add(id(add))
        mm.op_type, mm.domain = "Linear", "express"
        mm.inputs, mm.outputs, mm.attrs = [mm.inputs[0], mm.inputs[1], other], [out], {"activation": act}
        done += 1
    g.nodes[:] = [n for n in g.nodes if id(n) not in drop]
    return done
