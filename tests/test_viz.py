"""ex.viz.graphviz: the drawing shows exactly the planner's graph (after CSE), its fused groups,
and valid SVG/DOT, without evaluating anything."""
import xml.etree.ElementTree as ET

import numpy as np
import pytest

import express as ex
import express.nn.functional as F
from express import graph
from express.viz import graphviz


def _block():
    x = ex.asarray(np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32))
    w = ex.asarray(np.random.default_rng(1).standard_normal((8, 8)).astype(np.float32))
    h = F.gelu(x @ w + 1.0)
    return x, (h - h.mean(axis=-1, keepdims=True)) * F.rsqrt(ex.square(h).mean(axis=-1, keepdims=True) + 1e-5)


def test_vertices_are_the_planned_nodes_and_nothing_runs():
    x, y = _block()
    g = graphviz(y)
    assert not y.is_evaluated
    nodes, canon = graph.order([y])
    ops = [v for v in g.vertices if v.kind in ("elementwise", "view", "kernel")]
    assert [v.lines[0] for v in ops] == [t.op.name for t in nodes]
    assert [v.lines[1] for v in ops] == [f"{t.shape} {t.dtype.name}" for t in nodes]
    groups = graph.fuse(nodes, canon, {id(y)})
    sizes = {}
    for gid in groups.values():
        sizes[gid] = sizes.get(gid, 0) + 1
    assert g.n_groups == sum(n > 1 for n in sizes.values())
    assert sum(v.root for v in g.vertices) == 1
    assert sum(v.kind == "constant" for v in g.vertices) == 2   # x and w


def test_svg_and_dot_are_well_formed(tmp_path):
    _, y = _block()
    g = graphviz(y)
    svg = ET.fromstring(g._repr_svg_())
    ns = "{http://www.w3.org/2000/svg}"
    n_edges = sum(len(v.inputs) for v in g.vertices)
    assert len(svg.findall(f"{ns}path")) == n_edges
    dot = g.source
    assert dot.startswith("digraph express {") and dot.rstrip().endswith("}")
    assert dot.count("->") == n_edges and dot.count("subgraph cluster_") == g.n_groups
    for ext in ("svg", "html", "dot"):
        g.save(tmp_path / f"g.{ext}")
        assert (tmp_path / f"g.{ext}").stat().st_size > 100
    with pytest.raises(ValueError, match="svg"):
        g.save(tmp_path / "g.png")


def test_boxes_in_a_layer_do_not_overlap():
    _, y = _block()
    g = graphviz(y)
    rows = {}
    for v in g.vertices:
        rows.setdefault(round(v.y + v.h / 2), []).append(v)
    for row in rows.values():
        row.sort(key=lambda v: v.x)
        for a, b in zip(row, row[1:]):
            assert a.x + a.w <= b.x + 1e-6


def test_several_roots_shared_subgraph_and_leaves():
    a = ex.ones((3,)) * 2
    s, m = a.sum(), a.max()
    g = graphviz(s, m)
    assert sum(v.root for v in g.vertices) == 2
    assert [v.lines[0] for v in g.vertices].count("multiply") == 1   # CSE: a is drawn once
    a.numpy()
    assert repr(graphviz(a)) == "<Graph: 0 nodes, 1 constant>"
    f = ex.compile(lambda t: (captured.append(graphviz(t + 1)), t + 1)[1])
    captured = []
    f(np.zeros(2, np.float32))
    assert "1 input" in repr(captured[0])


def test_bad_arguments():
    with pytest.raises(TypeError, match="Tensor"):
        graphviz(np.ones(3))
    with pytest.raises(TypeError):
        graphviz()


def test_kernel_rewrites_are_drawn_as_the_planner_runs_them():
    """conv -> batch norm -> + residual -> relu is one convolution kernel (BN folded into its
    weights, the add and relu as its epilogue), and that is what the drawing shows."""
    import express.nn as nn
    x = ex.asarray(np.random.default_rng(0).standard_normal((1, 8, 12, 12)).astype(np.float32))
    conv, bn = nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)
    y = F.relu(bn(conv(x)) + x)
    g = graphviz(y)
    ops = [v for v in g.vertices if v.kind in ("elementwise", "view", "kernel")]
    assert [v.lines[0] for v in ops] == ["conv2d"]
    assert "act='relu'" in ops[0].tip and "has_res=True" in ops[0].tip
    assert not y.is_evaluated
