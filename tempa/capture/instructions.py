"""Decode a code object into one normalised instruction list for CPython 3.11-3.13.

Why normalise here: the interpreter then has one handler per concept instead of one per
version. What changes per version is written down where it is handled, following
shared/research/frontend.md:

- 3.13 superinstructions (LOAD_FAST_LOAD_FAST, STORE_FAST_LOAD_FAST, STORE_FAST_STORE_FAST)
  are split into their two halves;
- BINARY_SLICE / STORE_SLICE (3.12+) become BUILD_SLICE 2 + BINARY_SUBSCR / STORE_SUBSCR;
- COMPARE_OP's argval is the plain operator string on every version;
- the NULL/method bits of LOAD_GLOBAL, LOAD_ATTR (3.12+) and LOAD_SUPER_ATTR are decoded
  into ``push_null`` / ``method`` flags;
- KW_NAMES' argval is the tuple of names (3.11 leaves it as an index);
- CACHE, EXTENDED_ARG, RESUME, PRECALL and NOP are kept as NOP so jump offsets stay valid.
"""
from __future__ import annotations

import dis
import sys
from dataclasses import dataclass
from types import CodeType

PY = sys.version_info[:2]
# The call layout: on 3.11/3.12 the NULL (or method) sits BELOW the callable; on 3.13 the
# callable is below and NULL|self above it.
NULL_BEFORE_CALLABLE = PY < (3, 13)

_BINARY_OPS = [name for name, _ in dis._nb_ops]  # index -> 'NB_ADD', ... ('NB_INPLACE_ADD' from 13)
_NOPS = {"NOP", "RESUME", "PRECALL", "CACHE", "EXTENDED_ARG", "COPY_FREE_VARS", "MAKE_CELL"}


@dataclass(slots=True)
class Instr:
    opname: str
    arg: int | None
    argval: object
    offset: int            # the offset of the real instruction this came from
    lineno: int | None
    push_null: bool = False   # LOAD_GLOBAL / LOAD_ATTR: push a NULL for a following CALL
    method: bool = False      # LOAD_ATTR (3.12+), LOAD_METHOD, LOAD_SUPER_ATTR: method form
    index: int = -1           # position in the decoded list
    jump_index: int = -1      # for jumps: index of the target instruction

    def __repr__(self) -> str:
        return f"{self.offset}:{self.opname}({self.argval!r})"


@dataclass
class Decoded:
    code: CodeType
    instrs: list[Instr]
    index_of_offset: dict[int, int]   # real offset -> first decoded index at that offset
    exception_table: list              # dis._ExceptionTableEntry(start, end, target, depth, lasti)

    def handler_for(self, offset: int):
        for entry in self.exception_table:
            if entry.start <= offset < entry.end:
                return entry
        return None


_cache: dict[CodeType, Decoded] = {}


def decode(code: CodeType) -> Decoded:
    hit = _cache.get(code)
    if hit is not None:
        return hit
    out: list[Instr] = []
    lineno = code.co_firstlineno
    for ins in dis.get_instructions(code):
        line = ins.positions.lineno if ins.positions is not None else None
        if line is not None:
            lineno = line
        out.extend(_normalise(ins, code, lineno))
    index_of_offset: dict[int, int] = {}
    for i, ins in enumerate(out):
        ins.index = i
        index_of_offset.setdefault(ins.offset, i)
    for ins in out:
        if ins.opname in _JUMPS:
            ins.jump_index = index_of_offset[ins.argval]
    table = dis._parse_exception_table(code) if hasattr(dis, "_parse_exception_table") else []
    decoded = Decoded(code, out, index_of_offset, table)
    _cache[code] = decoded
    return decoded


_JUMPS = {
    "JUMP_FORWARD", "JUMP_BACKWARD", "JUMP_BACKWARD_NO_INTERRUPT", "JUMP", "JUMP_NO_INTERRUPT",
    "POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE", "POP_JUMP_IF_NONE", "POP_JUMP_IF_NOT_NONE",
    # 3.11 spells the direction in the name; normalised below to the 3.12 names.
    "JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP", "FOR_ITER", "SEND",
}


def _normalise(ins: dis.Instruction, code: CodeType, lineno: int) -> list[Instr]:
    op, arg, argval, off = ins.opname, ins.arg, ins.argval, ins.offset

    def mk(opname, a=arg, av=argval, **kw):
        return Instr(opname, a, av, off, lineno, **kw)

    if op in _NOPS:
        return [mk("NOP")]
    # 3.11: POP_JUMP_{FORWARD,BACKWARD}_IF_X -> POP_JUMP_IF_X (argval is absolute already).
    if op.startswith("POP_JUMP_FORWARD_IF_") or op.startswith("POP_JUMP_BACKWARD_IF_"):
        return [mk("POP_JUMP_IF_" + op.split("_IF_", 1)[1])]
    if op == "JUMP_BACKWARD_NO_INTERRUPT":
        return [mk("JUMP_BACKWARD")]
    if op == "LOAD_FAST_CHECK":
        return [mk("LOAD_FAST")]
    if op in ("LOAD_FAST_LOAD_FAST", "STORE_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST"):
        first, second = op.split("_FAST_")[0] + "_FAST", op.split("_FAST_")[1]
        a, b = argval
        return [mk(first, av=a), mk(second, av=b)]
    if op == "BINARY_SLICE":
        return [mk("BUILD_SLICE", a=2, av=2), mk("BINARY_SUBSCR", a=None, av=None)]
    if op == "STORE_SLICE":
        return [mk("BUILD_SLICE", a=2, av=2), mk("STORE_SUBSCR", a=None, av=None)]
    if op == "COMPARE_OP":
        shift = 0 if PY < (3, 12) else (4 if PY < (3, 13) else 5)
        return [mk("COMPARE_OP", av=dis.cmp_op[arg >> shift])]
    if op == "BINARY_OP":
        return [mk("BINARY_OP", av=_BINARY_OPS[arg])]
    if op == "LOAD_GLOBAL":
        return [mk("LOAD_GLOBAL", av=code.co_names[arg >> 1], push_null=bool(arg & 1))]
    if op == "LOAD_ATTR" and PY >= (3, 12):
        return [mk("LOAD_ATTR", av=code.co_names[arg >> 1], method=bool(arg & 1))]
    if op == "LOAD_METHOD":
        return [mk("LOAD_ATTR", method=True)]
    if op == "LOAD_SUPER_ATTR":
        return [mk("LOAD_SUPER_ATTR", av=code.co_names[arg >> 2], method=bool(arg & 1))]
    if op == "KW_NAMES":
        names = code.co_consts[arg] if not isinstance(argval, tuple) else argval
        return [mk("KW_NAMES", av=names)]
    if op == "RETURN_CONST":
        return [mk("LOAD_CONST", av=argval), mk("RETURN_VALUE", a=None, av=None)]
    return [mk(op)]
