"""The kernel emitter that IR bodies call: ``k.load``, ``k.op``, ``k.cast``, ``k.piecewise``.

IR bodies name their operations (``k.op("exp", [x], dtype)``, backend/ops.py); ``CPP_OPS``
below spells each in C++, as ``TRITON_OPS`` does in Triton (codegen/triton_emit.py).

One class serves two purposes. Rendering: it appends C++ statements (with common
subexpressions shared within a scope). Probing: the scheduler runs a body with a load hook
that records which buffer is read at which index, and throws the text away.

Each temporary also gets a canonical form (its expression with the temporaries it reads
replaced by their own canonical forms, interned), so that a value computed in one loop can
be recognised when another loop computes it again under other names: ``reuse`` maps such a
form to a variable that already holds the value (codegen/reuse.py).

Loop-invariant values are computed once, in the outermost loop where everything they read is
defined (``open_loop`` opens each loop with a slot for them). BatchNorm's scale
``1 / sqrt(var + eps)`` reads only the channel's statistics: written per element inside the
zero padding's ``if`` that HF's depthwise convolutions put around it, gcc neither hoisted it
nor vectorised the loop (the branch holds a division and a square root), 13 ns an element;
hoisted to the channel loop, the element loop vectorises: 36x faster on MobileNetV2's
96x65x65 kernel. A value moves out of a branch only when computing it cannot fault: no
integer division, and a load only where its index is in bounds for every value of the loops
it reads (so also where an inner loop runs zero times) from a buffer no loop here writes.
"""
from __future__ import annotations

import re

import torch

from ..index import Indirect, IndexExpr, Var
from ..ir import CTYPES, ERR_BITS, ScalarExpr, Unlowerable
from ..ops import result_dtype, spelling


_TEMP = re.compile(r"\bt\d+\b")     # the temporaries _cse declares
# Every identifier of an expression, and whether a call's parenthesis follows it.
_IDENT = re.compile(r"(?<![\w.])([A-Za-z_]\w*)(\s*\()?")
# Identifiers that name no value: C++ types and keywords of the spellings, the m:: namespace.
_NOT_VALUES = set(CTYPES.values()) | {"static_cast", "true", "false", "m"}
# Spellings that can fault (integer division by zero); only those of integer results can.
_FAULTING = re.compile(r"/|%|t_floordiv|t_remainder|t_fmod")


class _Frame:
    """An open loop (or the group's block, ``var`` None): where values invariant in the loops
    inside it are declared. ``slot`` is at the top of its body; ``tail`` just before the loop
    now open inside it, after what the body computed so far (a row's reduction result, the
    group's earlier members' stores). Both are lists spliced into ``lines`` by ``flatten``."""
    __slots__ = ("var", "slot", "tail", "scope", "depth")

    def __init__(self, var, slot, scope, depth):
        self.var, self.slot, self.scope, self.depth = var, slot, scope, depth
        self.tail = None

# Every op of ops.OPS in C++: {0}, {1}.. the arguments, {T} the C type computed in. The m::
# and t_ helpers are the prelude's (codegen/prelude.py); integer cases live there too.
CPP_OPS = {
    "neg": "-{0}", "abs": "m::abs({0})", "exp": "m::exp({0})", "exp2": "m::exp2({0})",
    "log": "m::log({0})", "log2": "m::log2({0})", "log10": "m::log10({0})",
    "log1p": "m::log1p({0})", "expm1": "m::expm1({0})", "sqrt": "m::sqrt({0})",
    "rsqrt": "({T})1 / m::sqrt({0})", "sin": "m::sin({0})", "cos": "m::cos({0})",
    "tan": "m::tan({0})", "tanh": "m::tanh({0})", "sinh": "m::sinh({0})", "cosh": "m::cosh({0})",
    "asin": "m::asin({0})", "acos": "m::acos({0})", "atan": "m::atan({0})",
    "asinh": "m::asinh({0})", "acosh": "m::acosh({0})", "atanh": "m::atanh({0})",
    "erf": "m::erf({0})", "erfc": "m::erfc({0})", "lgamma": "m::lgamma({0})",
    "sigmoid": "({T})1 / (({T})1 + m::exp(-{0}))", "relu": "m::max({0}, ({T})0)",
    "floor": "t_floor({0})", "ceil": "t_ceil({0})", "round": "t_round({0})",
    "trunc": "t_trunc({0})", "sign": "t_sign({0})", "reciprocal": "({T})1 / {0}",
    "bitwise_not": "t_not({0})", "logical_not": "!{0}", "isnan": "m::isnan({0})",
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}",
    "maximum": "t_max({0}, {1})", "minimum": "t_min({0}, {1})", "pow": "t_pow({0}, {1})",
    "atan2": "m::atan2({0}, {1})", "fmod": "t_fmod({0}, {1})",
    "remainder": "t_remainder({0}, {1})", "floordiv": "t_floordiv({0}, {1})",
    "bitwise_and": "{0} & {1}", "bitwise_or": "{0} | {1}", "bitwise_xor": "{0} ^ {1}",
    "eq": "{0} == {1}", "ne": "{0} != {1}", "lt": "{0} < {1}", "le": "{0} <= {1}",
    "gt": "{0} > {1}", "ge": "{0} >= {1}",
    "logical_and": "{0} && {1}", "logical_or": "{0} || {1}", "logical_xor": "{0} != {1}",
    "where": "{0} ? {1} : {2}",
}


def ctype(dt):
    t = CTYPES.get(dt)
    if t is None:
        raise Unlowerable(f"dtype {dt}")
    return t


def _any_ctype(dt):
    """A probe's C type: any dtype the target admitted (the text is thrown away)."""
    return CTYPES.get(dt) or str(dt)


# An ``omp simd`` loop of at least this many iterations (a multiple of 16) asks for 16 lanes,
# on a CPU with AVX-512: gcc's tuning for such CPUs prefers 256-bit vectors, and a GELU over
# (tokens, 3072) took 1.58 ms at 8 lanes against 1.19 at 16 (eager 0.80, its own 16-lane
# code). Long loops only: 512-bit vectors everywhere made the zoo 12% slower (rows of tens
# to hundreds of elements, where the wider vector's set-up and remainder dominate).
WIDE_SIMD_MIN = 512


class Emitter:
    def __init__(self, load_hook=None, names=None, probing=False):
        # probing (the scheduler and lowerings asking which buffers a body reads): the GPU's
        # bf16/fp16 bodies are walked too; rendering C++ accepts only the C++ dtypes
        self.ctype = _any_ctype if probing else ctype
        self.lines: list[str] = []
        self.scopes: list[dict] = [{}]
        self.depth = 1
        self.load_hook = load_hook
        self.names = names if names is not None else [0]
        self.loads: list = []
        self.canon: dict = {}           # temporary -> canonical id of its value
        self._interned: dict = {}       # (ctype, canonical expression) -> id
        self.reuse: dict = {}           # canonical id -> [variable holding it, used?]
        self.checks: list = []          # the ir.IndexChecks flagged, in code order
        self.frames: list = []          # _Frame per open loop, outermost first (hoisting)
        self.home: dict = {}            # name -> (_Frame, inline?) where it is defined
        self.written: set = set()       # pointers the loops being rendered write
        self.writing = None             # the pointer the member being rendered writes
        self.group_frames = 0           # frames of the group's block and its outer loops
        self.branches = 0               # piecewise branches open around the current line
        self.wide_simd = False          # long fixed-length simd loops get 512-bit vectors

    def tmp(self, prefix="t"):
        self.names[0] += 1
        return f"{prefix}{self.names[0]}"

    def line(self, s: str):
        self.lines.append("  " * self.depth + s)

    def push(self):
        self.scopes.append({})
        self.depth += 1

    def pop(self):
        self.scopes.pop()
        self.depth -= 1

    def canonical(self, t: str, expr: str) -> str:
        """The canonical id of the value ``expr`` (of C type ``t``): equal for equal values
        built from the same loads, whatever the temporaries are called."""
        ce = _TEMP.sub(lambda m: self.canon.get(m.group(0), m.group(0)), expr)
        return self._interned.setdefault((t, ce), f"@{len(self._interned)}")

    # -- loops and hoisting (C++ rendering only: probes and Triton open no frames) -------
    def open_block(self):
        """The group's own block: values invariant in all its loops go here."""
        self._open_frame(None)

    def open_loop(self, var, pragma=None):
        if self.frames:
            self.frames[-1].tail = tail = []
            self.lines.append(tail)
        if pragma and self.wide_simd and "simd" in pragma and isinstance(var.size, int) \
                and var.size >= WIDE_SIMD_MIN and var.size % 16 == 0:
            pragma += " simdlen(16)"
        if pragma:
            self.line(pragma)
        self.line(f"for (int64_t {var.name} = 0; {var.name} < {var.size}; ++{var.name}) {{")
        self.push()
        self._open_frame(var)

    def close_loop(self):
        self.frames.pop()
        self.pop()
        self.line("}")

    def close_block(self):
        return self.frames.pop()

    def _open_frame(self, var):
        slot: list = []
        self.lines.append(slot)
        frame = _Frame(var, slot, len(self.scopes) - 1, self.depth)
        self.frames.append(frame)
        if var is not None:
            self.home[var.name] = (frame, False)

    def defined(self, name: str):
        """``name`` was just declared at the current line (a register local, a kept term)."""
        if self.frames:
            self.home[name] = (self.frames[-1], True)

    def flatten(self, start: int = 0):
        """Splice the hoisting slots from ``start`` on into ``lines`` (after rendering)."""
        out = []
        for l in self.lines[start:]:
            out.extend(l if isinstance(l, list) else [l])
        self.lines[start:] = out

    def _frame_for(self, names, t: str, expr: str, need: int = 0):
        """The first place where a value reading ``names`` may be declared, as ``2 * frame +
        tail`` (a frame's slot, or its tail); None for the current line. A name declared in a
        frame's slot, or a frame's loop variable, is usable from that slot on; one declared
        inline or in the tail, from the tail on. ``need``: a place the value needs at least."""
        if not self.frames:
            return None
        at = {id(f): i for i, f in enumerate(self.frames)}
        for name in names:
            home = self.home.get(name)
            if home is None or id(home[0]) not in at:
                return None
            need = max(need, 2 * at[id(home[0])] + home[1])
        if need // 2 >= len(self.frames) - 1:
            return None
        if self.branches and t not in ("float", "double") and _FAULTING.search(expr):
            return None
        return need

    def _op_frame(self, t: str, expr: str):
        """Where a computed value may be declared: from the names its spelling reads."""
        names = [m.group(1) for m in _IDENT.finditer(expr)
                 if not m.group(2) and m.group(1) not in _NOT_VALUES]
        return self._frame_for(names, t, expr)

    def _hoisted(self, t: str, expr: str, place: int, key) -> str:
        frame, tail = self.frames[place // 2], bool(place % 2)
        name = self.tmp()
        (frame.tail if tail else frame.slot).append("  " * frame.depth + f"const {t} {name} = {expr};")
        self.scopes[frame.scope][key] = name
        self.canon[name] = self.canonical(t, expr)
        self.home[name] = (frame, tail)
        return name

    def _load_frame(self, buf, ix: IndexExpr, t: str, expr: str):
        """Where a load may be declared: out of the current loop only when its index is in
        bounds for all values of its loops. A buffer the group writes is read only after the
        members rendered before this one (in the tail of the innermost outer loop or below),
        and the buffer this member writes not out of its loops at all."""
        if not self.frames or buf.cname == self.writing:
            return None
        atoms = ix.vars()
        if any(not isinstance(a, Var) for a in atoms):
            return None
        need = 0
        if buf.cname in self.written:
            if not self.group_frames:
                return None
            need = 2 * (self.group_frames - 1) + 1
        place = self._frame_for([a.name for a in atoms], t, expr, need)
        if place is None or not _in_bounds(buf, ix):
            return None
        return place

    def _cse(self, t: str, expr: str, place=None) -> str:
        """The temporary holding ``expr``: one already declared in scope, or a new one, declared
        where ``place`` (default: ``_op_frame``) says, the current line when it says None."""
        key = (t, expr)
        for sc in reversed(self.scopes):
            if key in sc:
                return sc[key]
        cid = self.canonical(t, expr)
        slot = self.reuse.get(cid)
        if slot is not None:
            slot[1] = True
            self.scopes[-1][key] = slot[0]
            return slot[0]
        where = (place or self._op_frame)(t, expr) if self.frames else None
        if where is not None:
            return self._hoisted(t, expr, where, key)
        name = self.tmp()
        self.line(f"const {t} {name} = {expr};")
        self.scopes[-1][key] = name
        self.canon[name] = cid
        self.defined(name)
        return name

    def forget_loads(self, cname: str) -> None:
        """After a store through ``cname``: its earlier loads no longer hold its values."""
        prefix = cname + "["
        for sc in self.scopes:
            for key in [key for key in sc if key[1].startswith(prefix)]:
                del sc[key]

    # -- the operations bodies use -------------------------------------------------------
    def load(self, buf, ix: IndexExpr) -> ScalarExpr:
        self.loads.append((buf, ix))
        if self.load_hook is not None:
            hooked = self.load_hook(buf, ix)
            if hooked is not None:
                return hooked
        t, expr = self.ctype(buf.dtype), f"{buf.cname}[{ix.c()}]"
        return ScalarExpr(self._cse(t, expr, lambda t, e: self._load_frame(buf, ix, t, e)), buf.dtype)

    def op(self, name: str, vals, dtype) -> ScalarExpr:
        """The op ``name`` of ops.OPS on ``vals`` (already in ``dtype``), computed in ``dtype``."""
        template = spelling(CPP_OPS, name, len(vals), "C++")
        rdt = result_dtype(name, dtype)
        expr = template.format(*[v.expr for v in vals], T=self.ctype(dtype))
        return ScalarExpr(self._cse(self.ctype(rdt), expr), rdt)

    def cast(self, v: ScalarExpr, dt) -> ScalarExpr:
        if v.dtype == dt:
            return v
        t = self.ctype(dt)
        if dt == torch.bool:
            return ScalarExpr(self._cse(t, f"({v.expr} != 0)"), dt)
        return ScalarExpr(self._cse(t, f"static_cast<{t}>({v.expr})"), dt)

    def const(self, v, dt=None) -> ScalarExpr:
        from ..lower.core import literal
        if dt is None:
            dt = torch.bool if isinstance(v, bool) else (torch.int64 if isinstance(v, int) else torch.float64)
        return ScalarExpr(literal(v, dt) if dt in CTYPES or self.ctype is ctype else repr(v), dt)

    def index(self, ix) -> ScalarExpr:
        return ScalarExpr(f"static_cast<int64_t>({IndexExpr.of(ix).c()})", torch.int64)

    def indirect(self, v: ScalarExpr, size: int, check) -> IndexExpr:
        """An index read from a tensor, checked as ``check`` (an ir.IndexCheck) says."""
        raw = self.tmp("raw")
        self.line(f"const int64_t {raw} = static_cast<int64_t>({v.expr});")
        if check.wrap_negative:
            self.line(f"const int64_t {raw}w = {raw} < 0 ? {raw} + {size} : {raw};")
            raw = f"{raw}w"
        bad = self.flag_out_of_range(ScalarExpr(raw, torch.int64), size, check)
        name = self.tmp("ind")
        self.line(f"const int64_t {name} = {bad} ? 0 : {raw};")
        return IndexExpr.of(Indirect(name, 0, max(size - 1, 0)))

    def flag_out_of_range(self, v: ScalarExpr, size: int, check) -> str:
        """Flag ``v`` outside [0, size) (eager raises): sets bit ``n`` of ``err`` for the
        n-th check of this segment (``self.checks``; from the 31st on they share bit 30), and
        the wrapper raises the error of the lowest bit set (compile_graph.index_error).
        Returns the name of the flag. Why a bit mask ORed in: an OR reduction keeps the loop
        vectorised, where keeping "which code" with a select and a max reduction made a
        LayerNorm over gathered embeddings 8x slower. Selects, not ifs, for the same reason:
        a branch in a loop body stops gcc's vectoriser, and embedding or gather reads sit in
        row loops."""
        if check not in self.checks:
            self.checks.append(check)
        bit = min(self.checks.index(check), ERR_BITS - 1)
        bad = self.tmp("oob")
        self.line(f"const bool {bad} = ({v.expr} < 0) | ({v.expr} >= {size});")
        self.line(f"err |= static_cast<int>({bad}) << {bit};")
        return bad

    def piecewise(self, branches, dt) -> ScalarExpr:
        """``[(cond, body_fn), ...]``: the first true condition's body gives the value
        (``cond``: an ``index.Cond``)."""
        t = self.ctype(dt)
        name = self.tmp()
        self.line(f"{t} {name};")
        self.defined(name)
        for i, (cond, fn) in enumerate(branches):
            last = i == len(branches) - 1
            if i == 0:
                self.line(f"if ({cond.c()}) {{" if not (last and cond.always) else "{")
            elif last and cond.always:
                self.line("} else {")
            else:
                self.line(f"}} else if ({cond.c()}) {{")
            self.push()
            self.branches += 1
            v = self.cast(fn(self), dt)
            self.branches -= 1
            self.line(f"{name} = {v.expr};")
            self.pop()
        self.line("}")
        return ScalarExpr(name, dt)


def _in_bounds(buf, ix: IndexExpr) -> bool:
    """Is ``buf[ix]`` inside the elements ``buf`` spans for every value of ix's loops?"""
    try:
        lo, hi = ix.rng()
        if any(s <= 0 for s in buf.sizes):
            return False
        last = buf.offset + sum((s - 1) * abs(st) for s, st in zip(buf.sizes, buf.strides))
        return bool(0 <= lo and hi <= last)
    except TypeError:              # a size that is not a number: no proof
        return False
