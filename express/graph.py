"""Graph passes run before planning: topological order, common-subexpression elimination and
fusion of elementwise chains into groups (each group becomes one register program).

The passes never mutate user tensors: CSE yields a canonical map, fusion a group assignment."""
from __future__ import annotations

from .tensor import Tensor

MAX_GROUP = 512  # members of one fused program (registers are reused, so this bounds code size only)


def attrs_key(t: Tensor):
    """The node's attrs as a hashable, order-independent tuple (cached on the node)."""
    k = t._akey
    if k is None:
        k = t._akey = tuple(sorted((n, tuple(v) if isinstance(v, list) else v) for n, v in t.attrs.items()))
    return k


def order(roots) -> tuple[list[Tensor], dict]:
    """Lazy nodes reachable from `roots` in topological order (leaves excluded), after CSE.

    Returns (nodes, canon) where canon maps id(node) to its canonical node and `node.inputs` are
    to be read through `inputs(node, canon)`."""
    canon: dict[int, Tensor] = {}
    seen_key: dict[tuple, Tensor] = {}
    out: list[Tensor] = []
    visited: set[int] = set()
    for root in roots:
        stack = [(root, False)]
        while stack:
            t, done = stack.pop()
            if t._value is not None or t.op is None:
                if id(t) not in canon:  # small constants (scalars) merge by value
                    v = t._value
                    k = ("const", v.dtype.str, v.shape, v.tobytes()) if v is not None and v.size <= 16 else None
                    canon[id(t)] = seen_key.setdefault(k, t) if k else t
                continue
            if done:
                ins = tuple(id(canon[id(i)]) for i in t.inputs)
                try:
                    key = (t.op.name, ins, attrs_key(t))
                    hash(key)
                except TypeError:
                    key = (id(t),)
                c = seen_key.setdefault(key, t)
                canon[id(t)] = c
                if c is t:
                    out.append(t)
                continue
            if id(t) in visited:
                continue
            visited.add(id(t))
            stack.append((t, True))
            stack.extend((i, False) for i in reversed(t.inputs) if id(i) not in visited)
    return out, canon


def inputs(t: Tensor, canon: dict) -> tuple:
    return tuple(canon[id(i)] for i in t.inputs)


def fuse(nodes: list[Tensor], canon: dict, roots: set[int]) -> dict[int, int]:
    """Assign each elementwise node to a group (keyed by the id of the group's output node).

    A producer joins its consumer's group when it is elementwise, not a root, has that single
    consumer and the same shape (so nothing is computed twice)."""
    consumers: dict[int, set[int]] = {}
    for t in nodes:
        for i in inputs(t, canon):
            consumers.setdefault(id(i), set()).add(id(t))
    group: dict[int, int] = {}
    size: dict[int, int] = {}
    for t in reversed(nodes):
        if t.op.kind != "elementwise":
            continue
        g = group.setdefault(id(t), id(t))
        size.setdefault(g, 1)
        for i in inputs(t, canon):
            if (i.op is not None and i._value is None and i.op.kind == "elementwise" and id(i) not in roots
                    and id(i) not in group and consumers[id(i)] == {id(t)} and i.shape == t.shape
                    and size[g] < MAX_GROUP):
                group[id(i)] = g
                size[g] += 1
    return group
