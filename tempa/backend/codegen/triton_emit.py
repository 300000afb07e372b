"""The Triton side of the emitter interface: IR bodies written once for C++ also render Triton.

The IR bodies are closures that call an emitter (``k.load``, ``k.op``, ``k.cast``,
``k.piecewise``...). ``TritonEmitter`` implements that interface by writing Triton
statements instead of C++ ones; each named op (backend/ops.py) is spelled from
``TRITON_OPS``, beside the C++ table ``CPP_OPS`` of codegen/emit.py. Also here: the dtype
tables, the prelude every kernel module starts with (helpers such as ``t_max``), and the
shim that lets the same module run under Triton's CPU interpreter. Kernels themselves: codegen/triton.py.
"""
from __future__ import annotations

import math
import re

import torch

from ..index import FloorDiv, Indirect, IndexExpr, Mod, Var, _DivMod
from ..ir import ScalarExpr, Unlowerable
from ..ops import result_dtype, spelling

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
# The dtypes the GPU lowering accepts beyond the C++ ones (LowerOptions.extra_dtypes).
EXTRA_DTYPES = frozenset({torch.float16, torch.bfloat16})

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


# Floats: ATen's div_floor_floating, which rounds by the exact remainder: 3.0 // 0.3 is 9,
# floor(3.0 / 0.3) is 10; and x // inf is 0 or -1, not floor(+-0.0). 0.0 * q: copysign(0, q).
@triton.jit
def t_ffloordiv(a, b):
    mod = libdevice.fmod(a, b)
    div = (a - mod) / b
    div = tl.where((mod != 0) & ((b < 0) != (mod < 0)), div - 1.0, div)
    fl = tl.floor(div)
    fl = tl.where(div - fl > 0.5, fl + 1.0, fl)
    fl = tl.where(div == 0, 0.0 * (a / b), fl)
    return tl.where(b == 0, a / b, fl)


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

def _kinds(float_: str, int_: str | None = "same", bool_: str | None = "same") -> dict:
    """A spelling that depends on the kind of dtype computed in: ``int_`` defaults to the
    float spelling, ``bool_`` to the integer one; None: Triton has no spelling for that kind."""
    int_ = float_ if int_ == "same" else int_
    return {"float": float_, "int": int_, "bool": int_ if bool_ == "same" else bool_}


# Every op of backend/ops.py in Triton: {0}, {1}.. the arguments, {one} / {zero} the
# constants of the dtype computed in. Why our own t_max/t_min/relu: tl.maximum drops NaNs,
# eager propagates them. Integer rounding is the identity, as in the C++ prelude.
TRITON_OPS = {
    "neg": "-{0}", "abs": "tl.abs({0})", "exp": "tl.exp({0})", "exp2": "tl.exp2({0})",
    "log": "tl.log({0})", "log2": "tl.log2({0})", "log10": "libdevice.log10({0})",
    "log1p": "libdevice.log1p({0})", "expm1": "libdevice.expm1({0})", "sqrt": "tl.sqrt_rn({0})",
    "rsqrt": "{one} / tl.sqrt_rn({0})", "sin": "tl.sin({0})", "cos": "tl.cos({0})",
    "tan": "libdevice.tan({0})", "tanh": "libdevice.tanh({0})", "sinh": "libdevice.sinh({0})",
    "cosh": "libdevice.cosh({0})", "asin": "libdevice.asin({0})", "acos": "libdevice.acos({0})",
    "atan": "libdevice.atan({0})", "asinh": "libdevice.asinh({0})",
    "acosh": "libdevice.acosh({0})", "atanh": "libdevice.atanh({0})", "erf": "tl.erf({0})",
    "erfc": "libdevice.erfc({0})", "lgamma": "libdevice.lgamma({0})",
    "sigmoid": "{one} / ({one} + tl.exp(-{0}))", "relu": "tl.where({0} < 0, {zero}, {0})",
    "floor": _kinds("tl.floor({0})", "({0})"), "ceil": _kinds("tl.ceil({0})", "({0})"),
    "round": _kinds("libdevice.nearbyint({0})", "({0})"),
    "trunc": _kinds("libdevice.trunc({0})", "({0})"),
    "sign": _kinds("t_sign({0})", bool_="({0})"), "reciprocal": _kinds("1.0 / {0}", "1 // {0}"),
    "bitwise_not": _kinds("(~{0})", bool_="({0} == 0)"), "logical_not": "({0} == 0)",
    "isnan": "({0} != {0})",
    "add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}",
    "div": _kinds("{0} / {1}", "{0} // {1}", "{0} / {1}"),
    "maximum": _kinds("t_max({0}, {1})", bool_="t_or({0}, {1})"),
    "minimum": _kinds("t_min({0}, {1})", bool_="t_and({0}, {1})"),
    "pow": _kinds("libdevice.pow({0}, {1})", None), "atan2": "libdevice.atan2({0}, {1})",
    "fmod": _kinds("libdevice.fmod({0}, {1})", "({0} % {1})"),
    "remainder": "t_remainder({0}, {1})",
    "floordiv": _kinds("t_ffloordiv({0}, {1})", "t_ifloordiv({0}, {1})"),
    "bitwise_and": "{0} & {1}", "bitwise_or": "{0} | {1}", "bitwise_xor": "{0} ^ {1}",
    "eq": "{0} == {1}", "ne": "{0} != {1}", "lt": "{0} < {1}", "le": "{0} <= {1}",
    "gt": "{0} > {1}", "ge": "{0} >= {1}",
    "logical_and": "{0} & {1}", "logical_or": "{0} | {1}", "logical_xor": "{0} != {1}",
    "where": "tl.where({0}, {1}, {2})",
}


def phys(dt):
    """The dtype a value is computed in (half types in fp32)."""
    return torch.float32 if dt in HALF else dt


def _kind(dt) -> str:
    return "bool" if dt == torch.bool else ("float" if dt.is_floating_point else "int")


# Where fp64 needs another spelling: tl.sqrt_rn takes fp32 only ("Expected dtype ['fp32']
# but got fp64": an Adam step's bias correction ran as ATen); libdevice's sqrt is the
# correctly rounded fp64 one.
FP64_OPS = {"sqrt": "libdevice.sqrt({0})", "rsqrt": "{one} / libdevice.sqrt({0})"}


def spell(name: str, nargs: int, dtype) -> str:
    """The Triton expression template of op ``name`` computed in ``dtype``."""
    spelled = spelling(TRITON_OPS, name, nargs, "Triton")
    if dtype == torch.float64 and name in FP64_OPS:
        spelled = FP64_OPS[name]
    kind = _kind(dtype)
    if isinstance(spelled, dict):
        spelled = spelled[kind]
        if spelled is None:
            raise Unlowerable(f"no Triton spelling for {name} on {dtype}")
    one, zero = {"float": ("1.0", "0.0"), "bool": ("True", "False"), "int": ("1", "0")}[kind]
    return spelled.replace("{one}", one).replace("{zero}", zero)


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
        ix = IndexExpr.of(ix)
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
        for a, _ in IndexExpr.of(ix).terms:
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
    def load(self, buf, ix: IndexExpr) -> ScalarExpr:
        self.loads.append((buf, ix))
        if self.load_hook is not None:
            hooked = self.load_hook(buf, ix)
            if hooked is not None:
                return hooked
        ix = IndexExpr.of(ix) - buf.offset        # kernel pointers already point at the tensor's data
        s = self.ix(ix)
        hx, hr = self._levels(ix)
        want_r = self.two_d and (hr or any(self.is_r(m) for m in self.masks))
        masks = ["xmask"] + ([self.rmask] if (want_r and self.rmask) else []) + list(self.masks)
        idx = self._shaped(s, hx, hr, want_r)
        mask = " & ".join(masks)
        expr = f"tl.load({self.param(buf)} + ({idx}), mask={mask}, other=0)"
        if buf.dtype in HALF:
            expr += ".to(tl.float32)"
        return ScalarExpr(self._cse(expr, want_r), buf.dtype)

    def op(self, name: str, vals, dtype) -> ScalarExpr:
        tpl = spell(name, len(vals), dtype)
        rdt = result_dtype(name, dtype)
        exprs = [v.expr for v in vals]
        expr = tpl.format(*exprs)
        if all(v.expr in self.consts for v in vals):
            try:
                value = eval(expr, {"float": float, "True": True, "False": False})  # noqa: S307 - our own literal text
                return self.const(value, rdt)
            except Exception:  # noqa: BLE001 - not a plain Python expression: emit it
                pass
        if dtype == torch.float64:
            # Triton makes a Python float literal an fp32 constant: 0.1 would lose its low
            # bits in fp64 arithmetic, and libdevice.pow(0.999, t) has no fp32/fp64 overload
            # (an Adam step's bias correction failed to compile). fp64 operands as fp64.
            exprs = [f"tl.full([1], {v.expr}, tl.float64)"
                     if v.expr in self.consts and isinstance(self.consts[v.expr], float) else v.expr
                     for v in vals]
            expr = tpl.format(*exprs)
        return ScalarExpr(self._cse(expr, any(self.is_r(e) for e in exprs)), rdt)

    def cast(self, v: ScalarExpr, dt) -> ScalarExpr:
        if v.dtype == dt:
            return v
        if v.expr in self.consts:
            return self.const(self.consts[v.expr], dt)
        r = self.is_r(v.expr)
        if dt == torch.bool:
            return ScalarExpr(self._cse(f"({v.expr} != 0)", r), dt)
        src, dst = phys(v.dtype), phys(dt)
        expr = v.expr if src == dst else f"{v.expr}.to({TL[dst]})"
        if dt in HALF and v.dtype not in HALF:
            expr = f"{v.expr}.to({TL[dt]}).to(tl.float32)"     # round as eager's cast does
        elif dt in HALF and v.dtype in HALF and dt != v.dtype:
            expr = f"{v.expr}.to({TL[dt]}).to(tl.float32)"
        if expr == v.expr:
            return ScalarExpr(v.expr, dt)
        return ScalarExpr(self._cse(expr, r), dt)

    def const(self, v, dt=None) -> ScalarExpr:
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
        return ScalarExpr(s, dt)

    def index(self, ix) -> ScalarExpr:
        ix = IndexExpr.of(ix)
        hx, hr = self._levels(ix)
        want_r = self.two_d and hr
        s = self._shaped(self.ix(ix), hx, hr, want_r)
        return ScalarExpr(self._cse(f"({s}).to(tl.int64)", want_r), torch.int64)

    def indirect(self, v: ScalarExpr, size: int, check) -> IndexExpr:
        r = self.is_r(v.expr)
        name = self.tmp("ind")
        self.line(f"{name} = {v.expr}.to(tl.int64)" if v.expr not in self.consts else
                  f"{name} = tl.full([1], {v.expr}, tl.int64)")
        if check.wrap_negative:
            self.line(f"{name} = tl.where({name} < 0, {name} + {size}, {name})")
        # out of range: read row 0 instead of faulting (eager raises a device assert)
        self.line(f"{name} = tl.where(({name} >= 0) & ({name} < {size}), {name}, 0)")
        if r:
            self.rlevel.add(name)
        else:
            self.xlevel_ind.add(name)
        return IndexExpr.of(Indirect(name, 0, max(size - 1, 0)))

    def flag_out_of_range(self, v: ScalarExpr, size: int, check) -> str:
        """Not checked on the GPU (as ``indirect``: eager raises a device assert there)."""
        return "False"

    def piecewise(self, branches, dt) -> ScalarExpr:
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
            c = " & ".join(f"({p})" for p in cond.parts(self.ix)) or "True"
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
        return ScalarExpr(self._cse(out, r), dt)

    def _cond(self, c: str) -> str:
        """A condition as a named temporary, at r level when it involves r values."""
        name = self._cse(c, self.is_r(c) if self.two_d else False, "c")
        if not self.is_r(name) and self.two_d and self.is_r(c):
            self.rlevel.add(name)
        return name
