"""The op registry: every op is one `OpDef`, defined once, holding everything about it.

An OpDef has a `kind` that tells the planner how it runs:
  - "elementwise": `emit` writes its instructions into a register program (cext ex_elementwise);
    elementwise chains fuse into one program.
  - "view": `view(array, **attrs)` re-describes a buffer (NumPy strides), no data moves.
  - "kernel": `prepare(out, ins, **attrs)` returns a zero-argument callable that runs the C kernel,
    usually a `KernelCall` (express/_lib.py), which the plan runs back to back with its neighbours
    in C.
and always `infer(*inputs, **attrs) -> (shape, dtype)`, run when the node is built (so errors name
the op and the shapes right away), plus `ref(*arrays, **attrs)`, the NumPy reference the tests use.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

REGISTRY: dict[str, "OpDef"] = {}


@dataclass(eq=False)
class OpDef:
    name: str
    kind: str
    infer: Callable
    ref: Callable
    emit: Callable | None = None
    view: Callable | None = None
    prepare: Callable | None = None
    contiguous: tuple = ()          # inputs a kernel needs C-contiguous (the planner copies)
    inplace: int | None = None      # a kernel that writes into this input's buffer and returns it
    # (inputs, **attrs) -> the input a kernel may write its output over when that input's buffer
    # dies there (the kernel reads each of its elements before writing that output), or None
    overwrites: Callable | None = None
    doc: str = field(default="", repr=False)

    def __repr__(self):
        return f"<op {self.name}>"


def defop(name, kind, infer, ref, **kw) -> OpDef:
    if name in REGISTRY:
        raise RuntimeError(f"op {name!r} defined twice")
    op = REGISTRY[name] = OpDef(name, kind, infer, ref, **kw)
    return op
