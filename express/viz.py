"""Drawing the lazy graph of tensors: `ex.graphviz(t)` shows, in a notebook, the nodes the planner
will run (after common-subexpression elimination and the kernel rewrites: batch norm folded into
a convolution, activations and residual adds as kernel epilogues), their shapes and dtypes, and
the elementwise chains that fuse into one kernel (drawn as dashed boxes).

No system Graphviz is needed: the layout (layers by depth, ordered to keep edges short) and the
SVG are computed here. `.source` is the same graph in DOT, for anyone who wants Graphviz's own
rendering.

>>> import express as ex
>>> from express.viz import graphviz
>>> import numpy as np
>>> x = ex.asarray(np.ones((2, 3), np.float32))
>>> g = graphviz(ex.exp(x * 2) + 1)
>>> g
<Graph: 3 nodes, 1 constant, 1 fused group>
>>> g.source.splitlines()[0]
'digraph express {'
>>> g._repr_svg_().startswith('<svg')
True
"""
from __future__ import annotations

import html

import numpy as np

from . import graph as _graph
from .fusion import fuse_kernels
from .tensor import Tensor

_CHAR_W, _LINE_H, _PAD, _GAP_X, _GAP_Y = 7.2, 15, 8, 18, 36
_COLORS = {"elementwise": "#e8f1fb", "view": "#f3f3f3", "kernel": "#fdf0dc"}


class _Vertex:
    __slots__ = ("key", "lines", "kind", "tip", "inputs", "layer", "x", "y", "w", "h", "group", "root")

    def __init__(self, key, lines, kind, tip=""):
        self.key, self.lines, self.kind, self.tip = key, lines, kind, tip
        self.inputs: list[int] = []
        self.layer, self.x, self.y, self.group, self.root = 0, 0.0, 0.0, None, False
        self.w = max(len(s) for s in lines) * _CHAR_W + 2 * _PAD
        self.h = len(lines) * _LINE_H + _PAD


def _describe(t: Tensor) -> str:
    return f"{t.shape} {t.dtype.name}"


def _leaf(t: Tensor, k: int) -> _Vertex:
    if t._value is None:
        return _Vertex(k, ["input", _describe(t)], "input")
    v = np.asarray(t._value)
    if v.ndim == 0:
        x = v.item()
        return _Vertex(k, [f"{x:.4g}" if isinstance(x, float) else str(x)], "scalar", _describe(t))
    return _Vertex(k, ["constant", _describe(t)], "constant")


def _short(v, n=60) -> str:
    s = repr(v)
    return s if len(s) <= n else s[:n - 3] + "..."


class Graph:
    """The drawing of a lazy graph: `_repr_svg_`/`_repr_html_` for notebooks, `.source` (DOT),
    `.save(path)` (.svg, .html or .dot)."""

    def __init__(self, roots):
        self.roots = list(roots)
        for t in self.roots:
            if not isinstance(t, Tensor):
                raise TypeError(f"graphviz: expected Tensors, got {type(t).__name__}")
        nodes, canon = _graph.order(self.roots)
        nodes = fuse_kernels(nodes, canon, self.roots)  # as the planner does: epilogues, BN folding
        live, stack = set(), [canon.get(id(r), r) for r in self.roots]
        while stack:  # drop what the rewrites left unused (folded batch-norm statistics, ...)
            t = stack.pop()
            if id(t) not in live:
                live.add(id(t))
                stack += _graph.inputs(t, canon)
        nodes = [t for t in nodes if id(t) in live]
        root_ids = {id(canon[id(r)]) for r in self.roots}
        groups = _graph.fuse(nodes, canon, root_ids)
        self.vertices: list[_Vertex] = []
        index: dict[int, int] = {}

        def vertex_of(t):
            t = canon.get(id(t), t)
            if t._value is not None and t._value.ndim == 0:  # a scalar is drawn at each use
                self.vertices.append(_leaf(t, len(self.vertices)))
                return len(self.vertices) - 1
            if id(t) not in index:
                index[id(t)] = len(self.vertices)
                self.vertices.append(_leaf(t, len(self.vertices)))
            return index[id(t)]

        for t in nodes:
            ins = [vertex_of(i) for i in _graph.inputs(t, canon)]
            index[id(t)] = len(self.vertices)
            attrs = ", ".join(f"{k}={_short(v, 30)}" for k, v in t.attrs.items())
            v = _Vertex(len(self.vertices), [t.op.name, _describe(t)], t.op.kind, attrs)
            v.inputs, v.group = ins, groups.get(id(t))
            self.vertices.append(v)
        for r in self.roots:
            self.vertices[vertex_of(r)].root = True
        # a group of one is just a node
        sizes: dict[int, int] = {}
        for v in self.vertices:
            if v.group is not None:
                sizes[v.group] = sizes.get(v.group, 0) + 1
        ids = {g: k for k, g in enumerate(g for g, n in sizes.items() if n > 1)}
        for v in self.vertices:
            v.group = ids.get(v.group)
        self.n_groups = len(ids)
        self._layout()

    # ---- layout (Sugiyama style): layers by depth, long edges split by waypoints, barycentre
    # ordering sweeps, then x placement pulled toward neighbours ----
    def _layout(self):
        vs = self.vertices
        consumers: dict[int, list[int]] = {v.key: [] for v in vs}
        for v in vs:
            for i in v.inputs:
                consumers[i].append(v.key)
        for v in vs:  # vertices are in topological order
            if v.kind in _COLORS:
                v.layer = max([vs[i].layer + 1 for i in v.inputs if vs[i].kind in _COLORS] + [1])
        for v in reversed(vs):  # then as late as possible: side branches sit by their consumer
            if consumers[v.key]:
                v.layer = min(vs[c].layer for c in consumers[v.key]) - 1
            elif v.kind not in _COLORS:
                v.layer = 0
        # items: vertices and waypoints (w = 0), each with neighbours above and below
        up: dict = {v.key: [] for v in vs}
        down: dict = {v.key: [] for v in vs}
        width = {v.key: v.w for v in vs}
        layer_of = {v.key: v.layer for v in vs}
        self.routes: list[list] = []  # per edge: the items it passes, source first
        for v in vs:
            for i in v.inputs:
                route = [i]
                for k in range(vs[i].layer + 1, v.layer):
                    w = ("w", len(self.routes), k)
                    up[w], down[w], width[w], layer_of[w] = [], [], 0.0, k
                    route.append(w)
                route.append(v.key)
                for a, b in zip(route, route[1:]):
                    down[a].append(b)
                    up[b].append(a)
                self.routes.append(route)
        layers: list[list] = [[] for _ in range(max(layer_of.values()) + 1)]
        for k, n in layer_of.items():
            layers[n].append(k)
        pos = {k: float(j) for layer in layers for j, k in enumerate(layer)}

        def sweep(order, nbrs):
            for layer in order:
                for k in layer:
                    if nbrs[k]:
                        pos[k] = sum(pos[n] for n in nbrs[k]) / len(nbrs[k])
                layer.sort(key=lambda k: pos[k])
                for j, k in enumerate(layer):
                    pos[k] = float(j)
        for _ in range(3):
            sweep(layers, up)
            sweep(layers[::-1], down)

        x = {}
        for layer in layers:
            left = 0.0
            for k in layer:
                x[k], left = left, left + width[k] + _GAP_X

        def place(layer, nbrs):
            want = [sum(x[n] + width[n] / 2 for n in nbrs[k]) / len(nbrs[k]) - width[k] / 2 if nbrs[k]
                    else x[k] for k in layer]
            # left to right no overlap, then right to left, and average the two
            a, left = [], -1e9
            for k, w in zip(layer, want):
                a.append(max(w, left))
                left = a[-1] + width[k] + _GAP_X
            b, right = [0.0] * len(layer), 1e9
            for j in range(len(layer) - 1, -1, -1):
                b[j] = min(want[j], right - width[layer[j]])
                right = b[j] - _GAP_X
            for j, k in enumerate(layer):
                x[k] = (a[j] + b[j]) / 2
        for _ in range(4):
            for layer in layers[1:]:
                place(layer, up)
            for layer in layers[::-1][1:]:
                place(layer, down)
        x0 = min(x.values())
        y, ys = _PAD * 3, []
        for layer in layers:
            h = max((vs[k].h for k in layer if not isinstance(k, tuple)), default=0.0)
            ys.append((y, h))
            y += h + _GAP_Y
        self.height = y - _GAP_Y + _PAD * 3
        for v in vs:
            v.x = x[v.key] - x0 + _PAD * 3
            y0, h = ys[v.layer]
            v.y = y0 + (h - v.h) / 2
        self._waypoints = {k: (x[k] - x0 + _PAD * 3, ys[layer_of[k]][0] + ys[layer_of[k]][1] / 2)
                           for k in x if isinstance(k, tuple)}
        self.width = max([v.x + v.w for v in vs] + [p[0] for p in self._waypoints.values()]) + _PAD * 3

    # ---- outputs ----
    def __repr__(self):
        kinds = [v.kind for v in self.vertices]
        n_ops = sum(k in _COLORS for k in kinds)
        n_in = sum(k == "input" for k in kinds)
        n_const = sum(k == "constant" for k in kinds)
        parts = [f"{n_ops} node{'s' * (n_ops != 1)}"]
        if n_in:
            parts.append(f"{n_in} input{'s' * (n_in != 1)}")
        if n_const:
            parts.append(f"{n_const} constant{'s' * (n_const != 1)}")
        if self.n_groups:
            parts.append(f"{self.n_groups} fused group{'s' * (self.n_groups != 1)}")
        return f"<Graph: {', '.join(parts)}>"

    @property
    def source(self) -> str:
        """The graph in Graphviz DOT (fused groups as clusters)."""
        def q(s):
            return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'
        out = ["digraph express {", "  node [fontname=monospace fontsize=10];"]
        style = {"input": "shape=ellipse style=filled fillcolor=\"#e6f4e6\"",
                 "constant": "shape=ellipse style=filled fillcolor=\"#eeeeee\"",
                 "scalar": "shape=plaintext"}
        decl = {}
        for v in self.vertices:
            s = style.get(v.kind, f"shape=box style=\"rounded,filled\" fillcolor=\"{_COLORS.get(v.kind)}\"")
            if v.root:
                s += " penwidth=2"
            decl[v.key] = f"n{v.key} [label={q(chr(10).join(v.lines))} {s}];"
        for g in range(self.n_groups):
            out.append(f"  subgraph cluster_{g} {{ style=dashed; label=\"fused\";")
            out += [f"    {decl.pop(v.key)}" for v in self.vertices if v.group == g]
            out.append("  }")
        out += [f"  {d}" for d in decl.values()]
        out += [f"  n{i} -> n{v.key};" for v in self.vertices for i in v.inputs]
        out.append("}")
        return "\n".join(out)

    def _repr_svg_(self) -> str:
        e = html.escape
        parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{self.width:.0f}" height="{self.height:.0f}" '
                 f'viewBox="0 0 {self.width:.0f} {self.height:.0f}" font-family="monospace" font-size="12">',
                 '<defs><marker id="ex-arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" '
                 'markerHeight="7" orient="auto"><path d="M0,0 L10,5 L0,10 z" fill="#666"/></marker></defs>']
        for g in range(self.n_groups):
            m = [v for v in self.vertices if v.group == g]
            x0, y0 = min(v.x for v in m) - 6, min(v.y for v in m) - 6
            x1, y1 = max(v.x + v.w for v in m) + 6, max(v.y + v.h for v in m) + 6
            parts.append(f'<rect x="{x0:.1f}" y="{y0:.1f}" width="{x1 - x0:.1f}" height="{y1 - y0:.1f}" rx="8" '
                         f'fill="none" stroke="#4a86c8" stroke-dasharray="5,3"><title>fused: {len(m)} ops, '
                         f'one kernel</title></rect>')
        for route in self.routes:
            s, t = self.vertices[route[0]], self.vertices[route[-1]]
            pts = [(s.x + s.w / 2, s.y + s.h)] + [self._waypoints[w] for w in route[1:-1]] + [(t.x + t.w / 2, t.y)]
            d = f"M{pts[0][0]:.1f},{pts[0][1]:.1f}"
            for (x1, y1), (x2, y2) in zip(pts, pts[1:]):
                my = (y1 + y2) / 2
                d += f" C{x1:.1f},{my:.1f} {x2:.1f},{my:.1f} {x2:.1f},{y2:.1f}"
            parts.append(f'<path d="{d}" fill="none" stroke="#666" marker-end="url(#ex-arrow)"/>')
        for v in self.vertices:
            stroke = ' stroke="#222" stroke-width="2.5"' if v.root else ' stroke="#888"'
            tip = f"<title>{e(v.tip)}</title>" if v.tip else ""
            parts.append("<g>" + tip)
            if v.kind == "scalar":
                pass
            elif v.kind in ("input", "constant"):
                fill = "#e6f4e6" if v.kind == "input" else "#eeeeee"
                parts.append(f'<ellipse cx="{v.x + v.w / 2:.1f}" cy="{v.y + v.h / 2:.1f}" rx="{v.w / 2:.1f}" '
                             f'ry="{v.h / 2:.1f}" fill="{fill}"{stroke}/>')
            else:
                parts.append(f'<rect x="{v.x:.1f}" y="{v.y:.1f}" width="{v.w:.1f}" height="{v.h:.1f}" rx="4" '
                             f'fill="{_COLORS[v.kind]}"{stroke}/>')
            for k, line in enumerate(v.lines):
                weight = ' font-weight="bold"' if k == 0 and v.kind in _COLORS else ""
                parts.append(f'<text x="{v.x + v.w / 2:.1f}" y="{v.y + _PAD / 2 + (k + 0.8) * _LINE_H:.1f}" '
                             f'text-anchor="middle"{weight}>{e(line)}</text>')
            parts.append("</g>")
        parts.append("</svg>")
        return "\n".join(parts)

    def _repr_html_(self) -> str:
        return f'<div style="overflow:auto">{self._repr_svg_()}</div>'

    def save(self, path) -> None:
        """Write the drawing: `.svg`, `.html` or `.dot` by the file's suffix."""
        import os
        path = os.fspath(path)
        ext = os.path.splitext(path)[1].lower()
        text = {".svg": self._repr_svg_, ".html": self._repr_html_, ".dot": lambda: self.source}.get(ext)
        if text is None:
            raise ValueError(f"graphviz: save to .svg, .html or .dot, not {path!r}")
        with open(path, "w") as f:
            f.write(text())


def graphviz(*tensors: Tensor) -> Graph:
    """Draw the lazy graph that evaluating `tensors` would run (nothing is evaluated).

    Boxes are ops (blue: elementwise, grey: views, orange: kernels) labelled with their name, shape
    and dtype; ellipses are inputs and constants; bold outlines are the tensors asked for; dashed
    boxes are elementwise chains that run as one fused kernel. Hover a box for its attributes.

    >>> import express as ex
    >>> import express.nn.functional as F
    >>> from express.viz import graphviz
    >>> a = ex.ones((4, 8))
    >>> g = graphviz(F.relu(a @ ex.ones((8, 2)) + 1))
    >>> [v.lines[0] for v in g.vertices if v.kind == "kernel"]
    ['matmul']
    """
    if not tensors:
        raise TypeError("graphviz: give at least one Tensor")
    return Graph(tensors)
