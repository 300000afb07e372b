"""Render scheduled loop IR as Triton kernels: the second renderer of the same IR as cpp.py.

The IR bodies are closures that call an emitter (``k.load``, ``k.op``, ``k.cast``,
``k.piecewise``...). ``TritonEmitter`` implements that interface by writing Triton
statements instead of C++ ones, translating each C++ op template (``"m::exp({0})"``,
``"{0} ? {1} : {2}"``) into its Triton spelling. So a lowering written once runs on both.

The C++ loop nest maps onto a Triton program like this:

  outer loops  ->  the x axis: one program owns XBLOCK consecutive (flattened) outer
                   positions; outer variables ``x0, x1..`` are div/mod of ``xindex``
  a member's inner loops / reduction loop
               ->  the r axis: RBLOCK lanes over the member's flattened inner (or reduction)
                   space, ``[XBLOCK, RBLOCK]`` tiles. *Persistent* when every member's r
                   extent fits one tile (the whole row stays in registers, one pass),
                   otherwise *looped* (``for r0 in range(0, R, RBLOCK)`` with a tile-wide
                   accumulator reduced at the end)

A reduction result read only inside its kernel stays in a register (``[XBLOCK, 1]``); a
value with inner dims that a later member of the same kernel reads goes through global
memory with a barrier (the same program wrote the whole slice). bf16/fp16 are computed in
fp32 (loaded, upcast, stored rounded), as eager's kernels do internally.
"""
from __future__ import annotations

import math
import re

import torch

from ..index import FloorDiv, Indirect, Ix, Mod, Var, _DivMod
from ..ir import ComputedBuffer, CVal, Reduction, Unlowerable

TL = {
    torch.float32: "tl.float32", torch.float64: "tl.float64", torch.float16: "tl.float16",
    torch.bfloat16: "tl.bfloat16", torch.int64: "tl.int64", torch.int32: "tl.int32",
    torch.int16: "tl.int16", torch.int8: "tl.int8", torch.uint8: "tl.uint8", torch.bool: "tl.int1",
}
SIG = {
    torch.float32: "fp32", torch.float64: "fp64", torch.float16: "fp16", torch.bfloat16: "bf16",
    torch.int64: "i64", torch.int32: "i32", torch.int16: "i16", torch.int8: "i8",
    torch.uint8: "u8", torch.bool: "i1",
}
HALF = (torch.float16, torch.bfloat16)
# The dtypes the GPU lowering accepts beyond the C++ ones (see ir.extra_dtypes).
EXTRA_DTYPES = {torch.float16: "half", torch.bfloat16: "bfloat16"}

# Helpers every kernel module starts with. Why our own max/min: tl.maximum drops NaNs, eager
# propagates them (relu(nan) = nan).
PRELUDE = '''import triton
import triton.language as tl
from triton.language.extra import libdevice


@triton.jit
def t_max(a, b):
    return tl.where((a != a) | (a > b), a, b)


@triton.jit
def t_min(a, b):
    return tl.where((a != a) | (a < b), a, b)


@triton.jit
def t_or(a, b):
    return a | b


@triton.jit
def t_and(a, b):
    return a & b


@triton.jit
def t_mul(a, b):
    return a * b


@triton.jit
def t_remainder(a, b):
    r = a % b
    return tl.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)


@triton.jit
def t_ifloordiv(a, b):
    q = a // b
    return tl.where(((a % b) != 0) & ((a < 0) != (b < 0)), q - 1, q)


@triton.jit
def t_sign(a):
    return (a > 0).to(a.dtype) - (a < 0).to(a.dtype)


@triton.jit
def t_argmax_combine(v1, i1, v2, i2):
    pick2 = (v2 > v1) | ((v2 != v2) & (v1 == v1)) | ((v2 == v1) & (i2 < i1)) | ((v2 != v2) & (v1 != v1) & (i2 < i1))
    return tl.where(pick2, v2, v1), tl.where(pick2, i2, i1)


@triton.jit
def t_argmin_combine(v1, i1, v2, i2):
    pick2 = (v2 < v1) | ((v2 != v2) & (v1 == v1)) | ((v2 == v1) & (i2 < i1)) | ((v2 != v2) & (v1 != v1) & (i2 < i1))
    return tl.where(pick2, v2, v1), tl.where(pick2, i2, i1)
'''

# The interpreter (TRITON_INTERPRET=1, used by CPU-only tests) has no libdevice: a few
# stand-ins, correct but not fast.
INTERPRET_SHIM = '''

class libdevice:
    tanh = staticmethod(lambda x: 2.0 / (1.0 + tl.exp(-2.0 * x)) - 1.0)
    log1p = staticmethod(lambda x: tl.log(1.0 + x))
    expm1 = staticmethod(lambda x: tl.exp(x) - 1.0)
    pow = staticmethod(lambda a, b: tl.exp(b * tl.log(a)))
    trunc = staticmethod(lambda x: tl.where(x < 0, tl.ceil(x), tl.floor(x)))
    nearbyint = staticmethod(lambda x: tl.floor(x + 0.5))
    fmod = staticmethod(lambda a, b: a % b)
    log10 = staticmethod(lambda x: tl.log(x) * 0.4342944819032518)


# Loop bounds of shape-generic kernels are int64 arguments; the interpreter holds a scalar
# argument as a one-element array, which Python's range() rejects under numpy 2.
def range(*bounds, _range=range):
    return _range(*(int(b.handle.data.reshape(-1)[0]) if hasattr(b, "handle") else b for b in bounds))
'''

# C++ math function (m::name) -> Triton
MATH = {
    "exp": "tl.exp", "exp2": "tl.exp2", "log": "tl.log", "log2": "tl.log2", "log10": "libdevice.log10",
    "log1p": "libdevice.log1p", "expm1": "libdevice.expm1", "sqrt": "tl.sqrt_rn", "sin": "tl.sin",
    "cos": "tl.cos", "tan": "libdevice.tan", "tanh": "libdevice.tanh", "sinh": "libdevice.sinh",
    "cosh": "libdevice.cosh", "asin": "libdevice.asin", "acos": "libdevice.acos",
    "atan": "libdevice.atan", "asinh": "libdevice.asinh", "acosh": "libdevice.acosh",
    "atanh": "libdevice.atanh", "erf": "tl.erf", "erfc": "libdevice.erfc",
    "lgamma": "libdevice.lgamma", "floor": "tl.floor", "ceil": "tl.ceil",
    "trunc": "libdevice.trunc", "nearbyint": "libdevice.nearbyint", "fabs": "tl.abs",
    "abs": "tl.abs", "pow": "libdevice.pow", "atan2": "libdevice.atan2", "fmod": "libdevice.fmod",
    "isnan": "t_isnan", "max": "t_max",
}
_TERNARY = re.compile(r"^(.*?) \? (.*) : (.*)$")


def phys(dt):
    """The dtype a value is computed in (half types in fp32)."""
    return torch.float32 if dt in HALF else dt


def translate(tpl: str, cdt) -> str:
    """A C++ op template of lowerings.py -> the Triton expression template."""
    isf = cdt.is_floating_point
    isb = cdt == torch.bool
    one, zero = ("1.0", "0.0") if isf else (("True", "False") if isb else ("1", "0"))
    s = tpl.replace("({T})1", one).replace("({T})0", zero)
    if s == "false":
        return "({0} != {0})"
    if s == "m::max({0}, " + zero + ")":           # relu, NaN-propagating
        return "tl.where({0} < 0, " + zero + ", {0})"
    m = _TERNARY.match(s)
    if m:
        s = f"tl.where({m.group(1)}, {m.group(2)}, {m.group(3)})"
    if s.startswith("!"):
        s = f"({s[1:]} == 0)"
    s = s.replace("&&", "&").replace("||", "|")
    if not isf and not isb:
        s = s.replace(" / ", " // ")

    def fn(name):
        if name in ("t_max", "t_min"):
            return ("t_or" if name == "t_max" else "t_and") if isb else name
        if name in ("t_floor", "t_ceil", "t_round", "t_trunc"):
            if not isf:
                return ""
            return {"t_floor": "tl.floor", "t_ceil": "tl.ceil", "t_round": "libdevice.nearbyint",
                    "t_trunc": "libdevice.trunc"}[name]
        if name == "t_sign":
            return "" if isb else "t_sign"
        if name == "t_not":
            return "t_lnot" if isb else "t_bnot"
        if name == "t_pow":
            if not isf:
                raise Unlowerable("integer pow on the GPU")
            return "libdevice.pow"
        if name == "t_fmod":
            return "libdevice.fmod" if isf else "t_imod"
        if name == "t_remainder":
            return "t_remainder"
        if name == "t_floordiv":
            return "t_ffloordiv" if isf else "t_ifloordiv"
        raise Unlowerable(f"no Triton spelling for {name}")
    s = re.sub(r"\bm::(\w+)\(", lambda mm: MATH.get(mm.group(1), "?" + mm.group(1)) + "(", s)
    if "?" in s:
        raise Unlowerable(f"no Triton spelling for {tpl}")
    s = re.sub(r"\b(t_\w+)\(", lambda mm: fn(mm.group(1)) + "(", s)
    # a few helpers that are simple enough to inline
    s = re.sub(r"\bt_isnan\(([^()]*)\)", r"(\1 != \1)", s)
    s = re.sub(r"\bt_bnot\(([^()]*)\)", r"(~\1)", s)
    s = re.sub(r"\bt_lnot\(([^()]*)\)", r"(\1 == 0)", s)
    s = re.sub(r"\bt_imod\(([^(),]*), ([^()]*)\)", r"(\1 % \2)", s)
    s = re.sub(r"\bt_ffloordiv\(([^(),]*), ([^()]*)\)", r"tl.floor(\1 / \2)", s)
    return s


def translate_cond(cond: str) -> str:
    """A C++ condition built by lowerings from ``Ix.c()`` strings -> Triton."""
    if cond.strip() == "true":
        return "True"
    parts = [p.strip() for p in cond.split("&&")]
    parts = [re.sub(r"\) / (\d+)\)", r") // \1)", p) for p in parts]
    return " & ".join(f"({p})" for p in parts)


def literal(v, dt) -> str:
    if dt == torch.bool or isinstance(v, bool):
        return "True" if v else "False"
    if dt.is_floating_point:
        v = float(v)
        if math.isnan(v):
            return 'float("nan")'
        if math.isinf(v):
            return 'float("-inf")' if v < 0 else 'float("inf")'
        return repr(v)
    return str(int(v))


class TritonEmitter:
    """The emitter interface of codegen/emit.py, writing Triton. Values are Triton variables
    of shape [XBLOCK] (1-D kernels), [XBLOCK, 1] (x level) or [XBLOCK, RBLOCK] (r level)."""

    def __init__(self, two_d: bool):
        self.lines: list[str] = []
        self.scopes: list[dict] = [{}]
        self.depth = 1
        self.load_hook = None
        self.names = [0]
        self.loads: list = []
        self.two_d = two_d
        self.rlevel: set = set()        # names of variables that are [XBLOCK, RBLOCK]
        self.consts: dict = {}          # expr -> python value for constant CVals
        self.alias: dict = {}           # IR var name -> Triton variable
        self.xvars: set = set()
        self.masks: list = []           # piecewise conditions in force (for loads)
        self.rmask = None               # the current r mask variable (None outside r scopes)
        self.param = None               # buf -> kernel parameter name (set by the renderer)
        self.xlevel_ind: set = set()    # indirect indices of x level
        self.xb = 1

    # -- plumbing -----------------------------------------------------------------------
    def tmp(self, prefix="t"):
        self.names[0] += 1
        return f"{prefix}{self.names[0]}"

    def line(self, s: str):
        self.lines.append("    " * self.depth + s)

    def push(self):
        self.scopes.append({})

    def pop(self):
        self.scopes.pop()

    def _cse(self, expr: str, r: bool, prefix="t") -> str:
        key = expr
        for sc in reversed(self.scopes):
            if key in sc:
                return sc[key]
        name = self.tmp(prefix)
        self.line(f"{name} = {expr}")
        self.scopes[-1][key] = name
        if r:
            self.rlevel.add(name)
        return name

    def is_r(self, expr: str) -> bool:
        return any(tok in self.rlevel for tok in re.findall(r"[A-Za-z_]\w*", expr))

    # -- index rendering ----------------------------------------------------------------
    def ix(self, ix) -> str:
        ix = Ix.of(ix)
        parts = []
        for a, c in ix.terms:
            s = self._atom(a)
            parts.append(s if c == 1 else f"{c}*{s}")
        if ix.const or not parts:
            parts.append(str(ix.const))
        return " + ".join(parts).replace("+ -", "- ")

    def _atom(self, a) -> str:
        if isinstance(a, Var):
            return self.alias.get(a.name, a.name)
        if isinstance(a, Indirect):
            return a.name
        if isinstance(a, FloorDiv):
            return f"(({self.ix(a.e)}) // {a.d})"
        if isinstance(a, Mod):
            return f"(({self.ix(a.e)}) % {a.d})"
        raise Unlowerable(f"index atom {a!r}")

    def _levels(self, ix):
        """(has an x-level term, has an r-level term)."""
        hx = hr = False
        for a, _ in Ix.of(ix).terms:
            if isinstance(a, _DivMod):
                x, r = self._levels(a.e)
            else:
                name = self.alias.get(a.name, a.name)
                r = name in self.rlevel
                x = name in self.xvars or (isinstance(a, Indirect) and name in self.xlevel_ind)
                if r and isinstance(a, Indirect):
                    x = True
            hx, hr = hx or x, hr or r
        return hx, hr

    def _shaped(self, ix_s: str, hx: bool, hr: bool, want_r: bool) -> str:
        """Add zero tensors so the index has the full shape of its level."""
        add = []
        if not hx:
            add.append("xz")
        if want_r and not hr:
            add.append("rz")
        return ix_s if not add else f"{ix_s} + {' + '.join(add)}"

    # -- the operations bodies use -------------------------------------------------------
    def load(self, buf, ix: Ix) -> CVal:
        self.loads.append((buf, ix))
        if self.load_hook is not None:
            hooked = self.load_hook(buf, ix)
            if hooked is not None:
                return hooked
        ix = Ix.of(ix) - buf.offset        # kernel pointers already point at the tensor's data
        s = self.ix(ix)
        hx, hr = self._levels(ix)
        want_r = self.two_d and (hr or any(self.is_r(m) for m in self.masks))
        masks = ["xmask"] + ([self.rmask] if (want_r and self.rmask) else []) + list(self.masks)
        idx = self._shaped(s, hx, hr, want_r)
        mask = " & ".join(masks)
        expr = f"tl.load({self.param(buf)} + ({idx}), mask={mask}, other=0)"
        if buf.dtype in HALF:
            expr += ".to(tl.float32)"
        return CVal(self._cse(expr, want_r), buf.dtype)

    def op(self, template: str, rdt, vals, cdt=None) -> CVal:
        cdt = cdt or rdt
        tpl = translate(template, cdt)
        exprs = [v.expr for v in vals]
        expr = tpl.format(*exprs)
        if all(v.expr in self.consts for v in vals):
            try:
                value = eval(expr, {"float": float, "True": True, "False": False})  # noqa: S307 - our own literal text
                return self.const(value, rdt)
            except Exception:  # noqa: BLE001 - not a plain Python expression: emit it
                pass
        return CVal(self._cse(expr, any(self.is_r(e) for e in exprs)), rdt)

    def cast(self, v: CVal, dt) -> CVal:
        if v.dtype == dt:
            return v
        if v.expr in self.consts:
            return self.const(self.consts[v.expr], dt)
        r = self.is_r(v.expr)
        if dt == torch.bool:
            return CVal(self._cse(f"({v.expr} != 0)", r), dt)
        src, dst = phys(v.dtype), phys(dt)
        expr = v.expr if src == dst else f"{v.expr}.to({TL[dst]})"
        if dt in HALF and v.dtype not in HALF:
            expr = f"{v.expr}.to({TL[dt]}).to(tl.float32)"     # round as eager's cast does
        elif dt in HALF and v.dtype in HALF and dt != v.dtype:
            expr = f"{v.expr}.to({TL[dt]}).to(tl.float32)"
        if expr == v.expr:
            return CVal(v.expr, dt)
        return CVal(self._cse(expr, r), dt)

    def const(self, v, dt=None) -> CVal:
        if dt is None:
            dt = torch.bool if isinstance(v, bool) else (torch.int64 if isinstance(v, int) else torch.float64)
        if dt == torch.bool:
            v = bool(v)
        elif dt.is_floating_point:
            v = float(v)
        else:
            v = int(v)
        s = literal(v, dt)
        self.consts[s] = v
        return CVal(s, dt)

    def index(self, ix) -> CVal:
        ix = Ix.of(ix)
        hx, hr = self._levels(ix)
        want_r = self.two_d and hr
        s = self._shaped(self.ix(ix), hx, hr, want_r)
        return CVal(self._cse(f"({s}).to(tl.int64)", want_r), torch.int64)

    def indirect(self, v: CVal, size: int) -> Ix:
        r = self.is_r(v.expr)
        name = self.tmp("ind")
        self.line(f"{name} = {v.expr}.to(tl.int64)" if v.expr not in self.consts else
                  f"{name} = tl.full([1], {v.expr}, tl.int64)")
        self.line(f"{name} = tl.where({name} < 0, {name} + {size}, {name})")
        # out of range: read row 0 instead of faulting (eager raises a device assert)
        self.line(f"{name} = tl.where(({name} >= 0) & ({name} < {size}), {name}, 0)")
        if r:
            self.rlevel.add(name)
        else:
            self.xlevel_ind.add(name)
        return Ix.of(Indirect(name, 0, max(size - 1, 0)))

    def piecewise(self, branches, dt) -> CVal:
        """``[(cond, body_fn), ...]``: the first true condition's body gives the value. Every
        branch is computed, then selected. Why each branch's loads are masked by "my
        condition and no earlier one": C++ evaluates only the taken branch, but here every
        branch runs on every lane, and a branch's index is only in bounds on its own range
        (a ``cat``'s second piece reads ``x - 768``: negative where the first piece holds)."""
        conds, vals = [], []
        earlier = None                  # name of "an earlier condition holds", once there is one
        for cond, fn in branches:
            if len(conds) >= 2:
                earlier = self._cond(f"({earlier} | {conds[-1]})")
            elif conds:
                earlier = conds[0]
            c = translate_cond(cond)
            cname = None if c == "True" else self._cond(c)
            if earlier is None:
                mask = cname
            elif cname is None:
                mask = self._cond(f"(~{earlier})")
            else:
                mask = self._cond(f"({cname} & ~{earlier})")
            if mask is not None:
                self.masks.append(mask)
            self.push()
            v = self.cast(fn(self), dt)
            self.pop()
            if mask is not None:
                self.masks.pop()
            conds.append(cname)
            vals.append(v)
            if cname is None:
                break
        out = vals[-1].expr if conds[-1] is None else literal(0, dt)
        start = len(vals) - 1 if conds[-1] is None else len(vals)
        for i in range(start - 1, -1, -1):
            out = f"tl.where({conds[i]}, {vals[i].expr}, {out})"
        r = self.is_r(out)
        return CVal(self._cse(out, r), dt)

    def _cond(self, c: str) -> str:
        """A condition as a named temporary, at r level when it involves r values."""
        name = self._cse(c, self.is_r(c) if self.two_d else False, "c")
        if not self.is_r(name) and self.two_d and self.is_r(c):
            self.rlevel.add(name)
        return name


# --- kernels --------------------------------------------------------------------------------

class KernelPlan:
    """One Triton kernel: members of a scheduler group under an outer iteration space."""

    def __init__(self, outer, members):
        self.outer = tuple(outer)
        self.members = list(members)
        self.local: set = set()       # members kept in registers (x level, read only here)
        self.barrier_after: set = set()  # members a later member reads back from memory


class KernelCode:
    def __init__(self):
        self.name = ""
        self.body = ""                # source with the name left as {name}
        self.params: list = []        # Buffers, in order
        self.grid = 1
        self.num_warps = 4
        self.xblock = 1
        self.rblock = 0
        self.persistent = True
        self.summary = ""
        self.xnumel = 1               # outer positions: the grid is ceil(xnumel / xblock)
        self.nsizes = 0               # trailing int64 size parameters ds0.. (shape-generic)

    def source(self, name):
        return self.body.replace("KERNEL_NAME", name)


def _np2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def member_extent(m: ComputedBuffer, ov):
    """(inner Vars, reduction sizes) of ``m`` under outer vars ``ov``."""
    from ..schedule import member_index
    _, inner = member_index(m, ov, f"i_{m.name}_")
    rs = tuple(m.body.rsizes) if isinstance(m.body, Reduction) else ()
    return inner, rs


def r_extent(m, ov) -> int:
    inner, rs = member_extent(m, ov)
    if inner and rs:
        raise Unlowerable("reduction with inner dims")
    n = 1
    for v in inner:
        n *= v.size
    for s in rs:
        n *= s
    return n if (inner or rs) else 0


def extents(plan: KernelPlan):
    """(outer positions X, every member's r extent): what the block choice depends on."""
    ov = [Var(f"x{d}", s) for d, s in enumerate(plan.outer)]
    X = 1
    for s in plan.outer:
        X *= s
    return X, tuple(r_extent(m, ov) for m in plan.members)


def choose_blocks(plan: KernelPlan, ov, r_contiguous: bool):
    """Launch parameters from sizes: (two_d, persistent, XBLOCK, RBLOCK, num_warps)."""
    X, exts = extents(plan)
    return blocks_for(X, max(exts) if exts else 0, r_contiguous)


def generic_blocks(X: int, R: int, r_symbolic: bool, r_contiguous: bool):
    """Launch parameters for a shape-generic kernel (backend/gpu/dynamic.py), fixed once for
    every size: ``X``/``R`` are the largest samples. A reduced extent that changes with the
    sizes cannot be held in one persistent tile (the tile is a compile-time constant), so
    such a kernel loops over it, with a tile sized for the samples."""
    if R == 0 or not r_symbolic:
        return blocks_for(X, R, r_contiguous)
    if r_contiguous or X < 64:
        rb = min(2048, max(16, _np2(R)))
        xb = max(1, min(_np2(X), max(1, 4096 // rb), 64))
        work = xb * rb
        return True, False, xb, rb, (8 if work >= 4096 else (4 if work >= 1024 else 2))
    two_d, _, xb, rb, nw = blocks_for(X, 1 << 20, False)      # the column-reduction split
    return two_d, False, xb, rb, nw


def blocks_for(X: int, R: int, r_contiguous: bool):
    if R == 0:
        xb = min(1024, _np2(X))
        nw = 4 if xb >= 512 else (2 if xb >= 128 else 1)
        return False, True, xb, 0, nw
    if R <= 2048:
        rb = max(2, _np2(R))
        xb = max(1, min(_np2(X), max(1, 4096 // rb), 64))
        if X >= 4096 and xb * rb < 1024:
            xb = max(1, min(_np2(X), 1024 // rb))
        work = xb * rb
        nw = 8 if work >= 4096 else (4 if work >= 1024 else 2)
        if rb >= 1024 and nw < 8:
            nw = 8
        return True, True, xb, rb, nw
    if r_contiguous or X < 64:
        return True, False, 1, 2048, 8
    # A column reduction (the reduced dim is not the contiguous one): x spans contiguous
    # columns for coalesced loads, but a wide XBLOCK leaves few programs: a bias gradient
    # over (8192, 768) ran as 12 programs on a 132-SM GPU (0.3 ms each in GPT training).
    # Narrow XBLOCK until there are about two programs per SM, keeping >= 8 columns (32 B
    # rows of fp32) per load and a 4096-element tile.
    xb = 64
    while xb > 8 and -(-X // xb) < 2 * GPU_SMS:
        xb //= 2
    return True, False, xb, 4096 // xb, 8


GPU_SMS = 132      # an H100/H200; only sets how far column reductions split their columns


def render_kernel(plan: KernelPlan, r_contiguous: bool = True, blocks=None, nsizes: int = 0) -> KernelCode:
    """``blocks``: launch parameters fixed by the caller (as choose_blocks returns them);
    ``nsizes`` > 0: a shape-generic rendering (gpu/dynamic.py) whose kernel takes the size
    symbols ``ds0..`` as int64 arguments (the sizes in its text become expressions in them)."""
    from ..schedule import member_index
    kc = KernelCode()
    ov = [Var(f"x{d}", s) for d, s in enumerate(plan.outer)]
    two_d, persistent, XB, RB, nw = blocks or choose_blocks(plan, ov, r_contiguous)
    X = 1
    for s in plan.outer:
        X *= s
    kc.grid = max(1, -(-X // XB))
    kc.xnumel = X
    kc.nsizes = nsizes
    kc.num_warps, kc.xblock, kc.rblock, kc.persistent = nw, XB, RB, persistent
    k = TritonEmitter(two_d)
    k.xb = XB
    params: dict = {}

    def pname(buf):
        target = buf.target if isinstance(buf, ComputedBuffer) and buf.kind == "alias" else buf
        if target not in params:
            params[target] = f"p{len(params)}"    # positional: identical kernels dedupe
        return params[target]
    k.param = pname
    # generic kernels index in int64: no int32 bound holds for every size they may see
    big = bool(nsizes) or _needs_int64(plan)
    pid = "tl.program_id(0).to(tl.int64)" if big else "tl.program_id(0)"
    if two_d:
        k.line(f"xindex = {pid} * {XB} + tl.arange(0, {XB})[:, None]")
        k.line(f"xz = tl.zeros([{XB}, 1], tl.int32)")
        k.line(f"rbase = tl.arange(0, {RB})[None, :]")
        k.line(f"rz = tl.zeros([1, {RB}], tl.int32)")
        k.rlevel.update({"rbase", "rz"})
    else:
        k.line(f"xindex = {pid} * {XB} + tl.arange(0, {XB})")
        k.line(f"xz = tl.zeros([{XB}], tl.int32)")
    k.line(f"xmask = xindex < {X}")
    k.xvars = {"xindex", "xz"}
    stride = 1
    defs = []
    order = _x_order(plan, ov) if not two_d else list(range(len(ov)))
    for pos in range(len(order) - 1, -1, -1):
        v = ov[order[pos]]
        e = "xindex" if stride == 1 else f"(xindex // {stride})"
        if pos > 0:
            e = f"{e} % {v.size}"
        defs.append(f"{v.name} = {e}")
        k.xvars.add(v.name)
        stride *= v.size
    for line in reversed(defs):
        k.line(line)
    locals_here: dict = {}

    def hook(buf, ix):
        if buf in locals_here:
            return locals_here[buf]
        return None
    k.load_hook = hook
    rscope = {"defs": {}, "masks": {}}

    def r_vars(sizes, names, scope_key):
        """Define the IR vars ``names`` (row-major over ``sizes``) from rindex in this scope."""
        canon = rscope["defs"].get(tuple(sizes))
        if canon is None:
            canon = []
            st = 1
            lines = []
            for j in range(len(sizes) - 1, -1, -1):
                nm = k.tmp("rv")
                e = "rindex" if st == 1 else f"(rindex // {st})"
                if j > 0:
                    e = f"{e} % {sizes[j]}"
                lines.append(f"{nm} = {e}")
                canon.append(nm)
                st *= sizes[j]
            for line in reversed(lines):
                k.line(line)
            canon = list(reversed(canon))
            rscope["defs"][tuple(sizes)] = canon
            k.rlevel.update(canon)
        for n, c in zip(names, canon):
            k.alias[n] = c
            k.line(f"{n} = {c}")      # conditions of piecewise bodies name the IR vars
            k.rlevel.add(n)
        ext = 1
        for s in sizes:
            ext *= s
        mk = rscope["masks"].get(ext)
        if mk is None:
            mk = k.tmp("rmask")
            k.line(f"{mk} = rindex < {ext}")
            k.rlevel.add(mk)
            rscope["masks"][ext] = mk
        k.rmask = mk

    if two_d and persistent:
        k.line("rindex = rbase")
        k.rlevel.add("rindex")
    summary = []
    for j, m in enumerate(plan.members):
        tag = f"m{j}"
        idx, inner = member_index(m, ov, f"i_{tag}_")
        red = m.body if isinstance(m.body, Reduction) else None
        t_store = TL[m.dtype]
        ext = r_extent(m, ov)
        summary.append(f"{m.name}={m.origin or 'pointwise'}" + (f"[r{ext}]" if ext else ""))
        if ext == 0:
            # x level: one value per outer position
            k.rmask = None
            v = k.cast(m.body.fn(k, idx), m.dtype)
            _finish_x(k, m, idx, v, plan, locals_here, pname, tag=tag)
            continue
        looped = not persistent
        if looped:
            k.line(f"for r0 in range(0, {ext}, {RB}):")
            k.depth += 1
            k.push()
            k.line("rindex = r0 + rbase")
            k.rlevel.add("rindex")
            rscope = {"defs": {}, "masks": {}}
        if red is None:
            r_vars([v.size for v in inner], [v.name for v in inner], None)
            v = k.cast(m.body.fn(k, idx), m.dtype)
            _store(k, m, idx, v, pname, True)
        else:
            rv = [Var(f"r_{tag}_{d}", s) for d, s in enumerate(red.rsizes)]
            r_vars(list(red.rsizes), [x.name for x in rv], None)
            acc_dt = _acc_dtype(red)
            init = _init(red.rtype, acc_dt)
            val = k.cast(red.fn(k, idx, [Ix.of(x) for x in rv]), red.acc_dtype)
            vexpr = _as_acc(val.expr, red.acc_dtype, acc_dt, k)
            full = f"xmask & {k.rmask}"
            arg = red.rtype in ("argmax", "argmin")
            if arg:
                flat = Ix()
                mul = 1
                for x in reversed(rv):
                    flat = flat + Ix.of(x) * mul
                    mul *= x.size
                iexpr = k._shaped(k.ix(flat), False, True, True)
            acc = f"acc_{tag}"
            if not looped:
                masked = f"tl.where({full}, {vexpr}, {init})"
                if arg:
                    k.line(f"{acc}_v = {masked}")
                    k.line(f"{acc}_i = tl.broadcast_to(({iexpr}).to(tl.int64), [{XB}, {RB}])")
                res = _reduce_expr(red.rtype, masked, acc)
            else:
                if arg:
                    # running (value, index) per lane, combined across lanes at the end
                    k.scopes[0].setdefault("__accs__", [])
                    pre = [f"{acc}_v = tl.full([{XB}, {RB}], {init}, {TL[acc_dt]})",
                           f"{acc}_i = tl.zeros([{XB}, {RB}], tl.int64)"]
                    _insert_before_loop(k, pre)
                    comb = f"t_{red.rtype}_combine"
                    k.line(f"{acc}_nv, {acc}_ni = {comb}({acc}_v, {acc}_i, tl.where({full}, {vexpr}, {init}), "
                           f"({iexpr}).to(tl.int64))")
                    k.line(f"{acc}_v = tl.where({full}, {acc}_nv, {acc}_v)")
                    k.line(f"{acc}_i = tl.where({full}, {acc}_ni, {acc}_i)")
                else:
                    _insert_before_loop(k, [f"{acc} = tl.full([{XB}, {RB}], {init}, {TL[acc_dt]})"])
                    k.line(f"{acc} = {_combine(red.rtype, acc, f'tl.where({full}, {vexpr}, {init})')}")
                res = _reduce_expr(red.rtype, acc, acc)
            if looped:
                k.pop()
                k.depth -= 1
                k.rmask = None
            name = f"v_{tag}"
            k.line(f"{name} = {res}")
            out_dt = m.dtype
            if out_dt == torch.bool:
                k.line(f"{name} = {name} != 0")
            elif phys(out_dt) != acc_dt and not arg:
                k.line(f"{name} = {name}.to({TL[phys(out_dt)]})")
            if out_dt in HALF:
                k.line(f"{name} = {name}.to({TL[out_dt]}).to(tl.float32)")
            k.rmask = None
            _finish_x(k, m, idx, CVal(name, m.dtype), plan, locals_here, pname, named=True, tag=tag)
            continue
        if looped:
            k.pop()
            k.depth -= 1
            k.rmask = None
        if m in plan.barrier_after:
            k.line("tl.debug_barrier()")
    kc.params = list(params)
    sizes = [f"ds{i}" for i in range(nsizes)]
    sig = ", ".join([params[b] for b in kc.params] + sizes)
    if sizes:
        # Why: the JIT specialises integer arguments by value (== 1, divisible by 16); a
        # kernel compiled at one size must not carry such an assumption to the others
        head = [f"@triton.jit(do_not_specialize={sizes!r})", f"def KERNEL_NAME({sig}):"]
    else:
        head = [f"@triton.jit", f"def KERNEL_NAME({sig}):"]
    kc.body = "\n".join(head + k.lines) + "\n"
    kc.summary = ", ".join(summary)
    del t_store
    return kc


def _x_order(plan: KernelPlan, ov) -> list:
    """Outer dims from slowest to fastest varying along xindex: the memory order of the
    first buffer the kernel writes. Why: a cast into a transposed layout (a weight for a
    matmul) iterated in logical order writes (and reads) with a stride of a whole row."""
    from ..schedule import member_index
    for m in plan.members:
        if m.kind not in ("py", "alias"):
            continue
        idx, _ = member_index(m, ov, "o")
        st = {}
        for i, s in zip(idx, m.strides):
            for a, c in i.terms:
                if isinstance(a, Var) and a.name.startswith("x"):
                    st[a.name] = abs(s)
        d_stride = [st.get(v.name, 0) for v in ov]
        return sorted(range(len(ov)), key=lambda d: (-d_stride[d], d))
    return list(range(len(ov)))


def _insert_before_loop(k: TritonEmitter, lines):
    """Accumulator initialisations go just before the innermost open ``for``."""
    for i in range(len(k.lines) - 1, -1, -1):
        if k.lines[i].lstrip().startswith("for r0 in range("):
            ind = k.lines[i][:len(k.lines[i]) - len(k.lines[i].lstrip())]
            k.lines[i:i] = [ind + ln for ln in lines]
            return
    raise AssertionError("no loop open")


def _finish_x(k, m, idx, v: CVal, plan, locals_here, pname, named=False, tag="m"):
    """An x-level member value: keep it in a register for later members, store it if needed."""
    name = v.expr
    if not named:
        if v.expr in k.consts:
            shape = f"[{k.xb}, 1]" if k.two_d else f"[{k.xb}]"
            name = f"v_{tag}"
            k.line(f"{name} = tl.full({shape}, {v.expr}, {TL[phys(m.dtype)]})")
        elif not re.fullmatch(r"[A-Za-z_]\w*", v.expr):
            name = f"v_{tag}"
            k.line(f"{name} = {v.expr}")
    locals_here[m] = CVal(name, m.dtype)
    if m not in plan.local:
        _store(k, m, idx, CVal(name, m.dtype), pname, False)


def _store(k: TritonEmitter, m, idx, v: CVal, pname, r_level: bool):
    ix = m.index(idx)
    target = m.target if m.kind == "alias" else m
    ix = Ix.of(ix) - target.offset
    hx, hr = k._levels(ix)
    want_r = k.two_d and r_level
    s = k._shaped(k.ix(ix), hx, hr, want_r)
    mask = "xmask" + (f" & {k.rmask}" if want_r and k.rmask else "")
    val = v.expr
    dt = m.dtype
    if val in k.consts:
        val = f"tl.full({'[1, 1]' if k.two_d else '[1]'}, {val}, {TL[phys(dt)]})"
    val = f"{val}.to({TL[dt]})"
    k.line(f"tl.store({pname(m)} + ({s}), {val}, {mask})")


def _acc_dtype(red: Reduction):
    dt = red.acc_dtype
    if dt in HALF or dt == torch.float64 and red.rtype in ("sum", "prod"):
        # fp64 was chosen for long C++ sums in one accumulator; tiles of partial sums
        # reduced as a tree are accurate in fp32 (eager's CUDA sums do the same).
        return torch.float32 if dt in HALF else dt
    if dt == torch.bool:
        return torch.int32
    return dt


def _as_acc(expr, dt, acc_dt, k):
    if phys(dt) == acc_dt:
        return expr
    if expr in k.consts:
        return expr
    return f"{expr}.to({TL[acc_dt]})"


def _init(rtype, dt) -> str:
    if rtype == "sum":
        return "0" if not dt.is_floating_point else "0.0"
    if rtype == "prod":
        return "1" if not dt.is_floating_point else "1.0"
    if dt.is_floating_point:
        return 'float("-inf")' if rtype in ("max", "argmax") else 'float("inf")'
    info = torch.iinfo(dt)
    return str(info.min) if rtype in ("max", "argmax") else str(info.max)


def _combine(rtype, a, b) -> str:
    if rtype == "sum":
        return f"{a} + {b}"
    if rtype == "prod":
        return f"{a} * {b}"
    return f"t_{rtype}({a}, {b})"


def _reduce_expr(rtype, tile, acc) -> str:
    if rtype == "sum":
        return f"tl.sum({tile}, 1)[:, None]"
    if rtype == "prod":
        return f"tl.reduce({tile}, 1, t_mul)[:, None]"
    if rtype in ("max", "min"):
        return f"tl.reduce({tile}, 1, t_{rtype})[:, None]"
    # argmax / argmin: the tile is {acc}_v with indices {acc}_i
    return f"tl.reduce(({acc}_v, {acc}_i), 1, t_{rtype}_combine)[1][:, None]"


def _needs_int64(plan: KernelPlan) -> bool:
    lim = 2 ** 31 - 1
    X = 1
    for s in plan.outer:
        X *= s
    if X * 2048 > lim:
        return True
    from ..schedule import _reads
    bufs = set(plan.members)
    for m in plan.members:
        bufs |= _reads(m)
    for b in bufs:
        span = b.offset
        for s, st in zip(b.sizes, b.strides):
            span += (s - 1) * abs(st)
        if span > lim or b.numel > lim:
            return True
    return False
