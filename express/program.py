"""Register programs for cext's `ex_elementwise`: the form every elementwise op (and every fused
chain of them) takes before it runs.

Ops append instructions through `Program.op`; registers are SSA while building. `assemble` then
reuses registers whose last read has passed, never writing an input register (the C side may read
inputs in place) and writing the output register only with its final value.
"""
from __future__ import annotations

from ._lib import ffi, lib

F, I = lib.EX_REG_F, lib.EX_REG_I


class Program:
    def __init__(self):
        self.kinds: list[int] = []       # register kinds
        self.code: list[tuple] = []      # (opcode, dst, a, b, c, imm0, imm1)
        self.consts: dict[int, float] = {}  # registers loaded from float scalar constants

    def reg(self, kind: int) -> int:
        self.kinds.append(kind)
        return len(self.kinds) - 1

    def op(self, opcode: int, kind: int, a=-1, b=-1, c=-1, imm0=0.0, imm1=0.0) -> int:
        dst = self.reg(kind)
        self.code.append((opcode, dst, a, b, c, float(imm0), float(imm1)))
        return dst

    # conversions between the two register kinds
    def as_float(self, r: int) -> int:
        return r if self.kinds[r] == F else self.op(lib.EX_OP_I_TO_F, F, r)

    def as_truth(self, r: int) -> int:
        """An int register holding 0/1."""
        return self.op(lib.EX_OP_F_NONZERO, I, r) if self.kinds[r] == F else self.op(lib.EX_OP_I_OR, I, r, r)


def assemble(p: Program, in_regs: list[int], out_reg: int):
    """Rename registers to reuse dead ones. Returns (code, kinds, in_regs, out_reg) renamed;
    an input register nothing reads is renamed to -1 (its operand can be dropped)."""
    last = {}
    for i, (_, _, a, b, c, _, _) in enumerate(p.code):
        for r in (a, b, c):
            if r >= 0:
                last[r] = i
    pinned = set(in_regs) | {out_reg}
    new, kinds, free = {}, [], {F: [], I: []}
    for r in in_regs:
        if r not in new and (r in last or r == out_reg):
            new[r] = len(kinds)
            kinds.append(p.kinds[r])
    code = []
    for i, (opc, dst, a, b, c, i0, i1) in enumerate(p.code):
        srcs = [new[r] if r >= 0 else -1 for r in (a, b, c)]
        for r in {a, b, c}:  # registers read for the last time here may be the destination
            if r >= 0 and last.get(r) == i and r not in pinned:
                free[p.kinds[r]].append(new[r])
        k = p.kinds[dst]
        if dst in pinned or not free[k]:
            new[dst] = len(kinds)
            kinds.append(k)
        else:
            new[dst] = free[k].pop()
        code.append((opc, new[dst], *srcs, i0, i1))
    return code, kinds, [new.get(r, -1) for r in in_regs], new[out_reg]


def build(code, kinds, inputs, outputs, shape):
    """The cffi `ex_program` for `code` over iteration `shape`.

    inputs/outputs: lists of (address, dtype_code, reg, element_strides). Returns (program, keep),
    where `keep` holds the cffi buffers the program points into."""
    nd = len(shape)
    ins = ffi.new("ex_operand[]", max(len(inputs), 1))
    outs = ffi.new("ex_operand[]", max(len(outputs), 1))
    for arr, ops in ((ins, inputs), (outs, outputs)):
        for j, (addr, code_, reg, strides) in enumerate(ops):
            o = arr[j]
            o.data = ffi.cast("void *", addr)
            o.dtype, o.reg = code_, reg
            o.strides[0:nd] = strides
    instrs = ffi.new("ex_instr[]", max(len(code), 1))
    for j, (opc, dst, a, b, c, i0, i1) in enumerate(code):
        instrs[j] = (opc, dst, a, b, c, i0, i1)
    rk = ffi.new("int32_t[]", kinds or [0])
    prog = ffi.new("ex_program *")
    prog.ndim = nd
    prog.shape[0:nd] = shape
    prog.n_in, prog.n_out, prog.n_instr, prog.n_reg = len(inputs), len(outputs), len(code), len(kinds)
    setattr(prog, "in", ins)  # `in` is a Python keyword
    prog.out = outs
    prog.code, prog.reg_kind = instrs, rk
    return prog, (ins, outs, instrs, rk)
