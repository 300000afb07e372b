"""ATen FX graph -> loop IR. One registered lowering per ATen op (``@register(op)``).

A lowering receives the lowering context, the FX node (for traced metadata: the exact output
shape and dtype) and the node's arguments with tensors replaced by ``TV`` values. It returns
a ``TV`` (or a tuple of them). It raises ``Unlowerable`` for a case it does not handle; the
node then runs as an ATen fallback call, so a gap costs speed, never correctness.
"""
from __future__ import annotations

import contextvars
import math
import operator

import torch
import torch.fx as fx
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from ..index import Ix, Indirect, contiguous_strides, flat_index, unflatten
from ..ir import (CTYPES, Buffer, ComputedBuffer, CVal, ExternCall, LoweredGraph, Pointwise,
                  Reduction, TV, Unlowerable, new_contiguous)

aten = torch.ops.aten
prims = torch.ops.prims
LOWERINGS: dict = {}

# Matmuls with at most this many multiply-adds are generated as loops inside the kernel
# file; bigger ones call ATen (oneDNN/MKL). Why 2**17: an ATen mm call costs ~5 us of
# dispatch on this machine, about what our plain vectorised loop needs for ~130k MACs; above
# that the tuned library's blocking wins.
SMALL_MATMUL_MACS = 1 << 17
# When lowering a shape-generic graph (backend/dynamic.py), sizes seen while lowering are
# samples of a range: thresholds on work assume the run-time sizes may be this many times
# bigger, so a matmul that grows past the library's break-even point is not inlined.
DYN_SCALE = contextvars.ContextVar("tempa_dyn_scale", default=1)
# ... and the choices made from magnitudes are recorded while lowering at the example sizes
# and replayed at the other sizes, so every rendering makes the same choices.
SIZE_CHOICES = contextvars.ContextVar("tempa_size_choices", default=None)


class SizeChoices:
    """A log of size-driven choices: ``record`` appends, ``replay`` returns them in order."""

    def __init__(self):
        self.log: list = []
        self.pos = 0
        self.replay = False

    def __call__(self, what: str, value: bool) -> bool:
        if not self.replay:
            self.log.append((what, value))
            return value
        if self.pos >= len(self.log) or self.log[self.pos][0] != what:
            raise Unlowerable("size-driven choices differ between sizes")
        self.pos += 1
        return self.log[self.pos - 1][1]


def size_choice(what: str, value: bool) -> bool:
    log = SIZE_CHOICES.get()
    return value if log is None else log(what, value)
# A pointwise value read by several consumers is recomputed in each (inlined) unless its
# expression is bigger than this many ops; then it is stored once.
INLINE_COST = 12


def register(*ops):
    def deco(fn):
        for op in ops:
            if isinstance(op, torch._ops.OpOverloadPacket):
                for name in op.overloads():
                    LOWERINGS[getattr(op, name)] = fn
            else:
                LOWERINGS[op] = fn
        return fn
    return deco


def _tm(node):
    tm = node.meta.get("tm")
    if tm is None:
        raise Unlowerable("no traced metadata")
    return tm


class LowerCtx:
    def __init__(self):
        self.g = LoweredGraph()
        self.n = 0

    def name(self, prefix="buf"):
        self.n += 1
        return f"{prefix}{self.n}"

    # -- making memory ------------------------------------------------------------------
    def realize(self, tv: TV, origin="") -> TV:
        if tv.buffer is not None:
            return tv
        buf = ComputedBuffer(self.name(), tv.sizes, contiguous_strides(tv.sizes), 0, tv.dtype,
                             body=Pointwise(tv.load), origin=origin)
        self.g.steps.append(buf)
        return TV.of_buffer(buf)

    def strided_or_realize(self, tv: TV, origin="") -> TV:
        return tv if tv.strided is not None else self.realize(tv, origin)

    def reduction(self, sizes, rsizes, rtype, fn, dtype, acc_dtype=None, origin="") -> TV:
        buf = ComputedBuffer(self.name(), tuple(sizes), contiguous_strides(sizes), 0, dtype,
                             body=Reduction(tuple(rsizes), rtype, fn, acc_dtype or dtype),
                             origin=origin)
        self.g.steps.append(buf)
        return TV.of_buffer(buf)

    def extern(self, node: fx.Node, args, kwargs, fallback: bool):
        """Run ``node.target`` through ATen from the wrapper; tensor args become buffers.

        Why the traced strides: ATen picks output layouts from input layouts (attention's
        output follows its inputs' strides), and we index outputs with the strides seen at
        trace time, so each argument must have exactly the traced layout at run time.
        """
        def prep(a, meta):
            if isinstance(a, TV):
                want = getattr(meta, "stride", None)
                if a.strided is not None and (want is None or tuple(a.strided[1]) == tuple(want)
                                              and a.strided[2] == meta.offset):
                    return a
                if want is None or meta.offset != 0:
                    return self.realize(a, f"input of {node.target}")
                buf = ComputedBuffer(self.name(), a.sizes, tuple(want), 0, a.dtype,
                                     body=Pointwise(a.load), origin=f"input of {node.target}")
                self.g.steps.append(buf)
                return TV.of_buffer(buf)
            if isinstance(a, (list, tuple)):
                ms = meta if isinstance(meta, (list, tuple)) and len(meta) == len(a) else [None] * len(a)
                return type(a)(prep(x, m) for x, m in zip(a, ms))
            return a
        arg_metas = fx.node.map_arg(node.args, lambda n: n.meta.get("tm"))
        kw_metas = fx.node.map_arg(node.kwargs, lambda n: n.meta.get("tm"))
        args = tuple(prep(a, m) for a, m in zip(args, arg_metas))
        kwargs = {k: prep(v, kw_metas.get(k)) for k, v in kwargs.items()}
        tm = node.meta.get("tm")
        multi = tm is None
        if multi:
            metas = [u.meta.get("tm") for u in sorted(node.users, key=lambda u: u.args[1])] if False else None
            outs_meta = _multi_metas(node)
        else:
            outs_meta = [tm]
        outs = []
        for m in outs_meta:
            if m is None:
                outs.append(None)
                continue
            outs.append(Buffer(self.name(), m.shape, m.stride, 0, m.dtype, base_offset=m.offset))
        name = str(node.target)
        call = ExternCall(name, node.target, args, kwargs, outs, fallback, multi)
        self.g.steps.append(call)
        (self.g.fallbacks if fallback else self.g.externs).append(name)
        tvs = [TV.of_buffer(b) if b is not None else None for b in outs]
        return tuple(tvs) if multi else tvs[0]


def _multi_metas(node):
    n = 0
    by_index = {}
    for u in node.users:
        if u.op == "call_function" and u.target is operator.getitem:
            by_index[u.args[1]] = u.meta.get("tm")
            n = max(n, u.args[1] + 1)
    return [by_index.get(i) for i in range(n)]


# --- helpers ------------------------------------------------------------------------------

def ctype(dt):
    t = CTYPES.get(dt)
    if t is None:
        raise Unlowerable(f"dtype {dt}")
    return t


def literal(v, dt) -> str:
    t = ctype(dt)
    if isinstance(v, bool) or dt == torch.bool:
        return "true" if v else "false"
    if isinstance(v, float) or dt.is_floating_point:
        v = float(v)
        if math.isnan(v):
            return f'static_cast<{t}>(__builtin_nan(""))'
        if math.isinf(v):
            return f"static_cast<{t}>({'-' if v < 0 else ''}__builtin_inf())"
        if not dt.is_floating_point:
            return f"static_cast<{t}>({v!r})"
        return f"static_cast<{t}>({v!r})"
    return f"static_cast<{t}>({int(v)}LL)"


def bcast(tv: TV, sizes):
    """Loader of ``tv`` broadcast to ``sizes`` (numpy rules)."""
    sizes = tuple(sizes)
    if tv.sizes == sizes:
        return tv.load
    nd, m = len(sizes), len(tv.sizes)
    if m > nd:
        raise Unlowerable("bad broadcast")
    own = tv.sizes

    def load(k, idx):
        sub = list(idx[nd - m:])
        for d in range(m):
            if own[d] == 1 and sizes[nd - m + d] != 1:
                sub[d] = Ix()
        return tv.load(k, sub)
    return load


def scalar_loader(v):
    def load(k, idx):
        return k.const(v)
    return load


def promote(*args):
    dummies = []
    for a in args:
        if isinstance(a, TV):
            dummies.append(torch.empty([1] * len(a.sizes), dtype=a.dtype))
        elif isinstance(a, (bool, int, float)):
            dummies.append(a)
    return elementwise_dtypes(*dummies, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[1]


def pointwise(node, template, args, compute=None, result=None):
    """A pointwise op: ``template`` is C++ with {0},{1}.. for the (cast) inputs, {T} its type."""
    tm = _tm(node)
    sizes, odt = tm.shape, tm.dtype
    ctype(odt)
    cdt = compute or odt
    rdt = result or cdt
    loaders = [bcast(a, sizes) if isinstance(a, TV) else scalar_loader(a) for a in args]
    cost = 1 + sum(a.cost for a in args if isinstance(a, TV))

    def fn(k, idx):
        vals = [k.cast(l(k, idx), cdt) for l in loaders]
        return k.cast(k.op(template, rdt, vals, cdt), odt)
    return TV(sizes, odt, fn, cost=cost)


def _unary(template, compute_float=True):
    def low(ctx, node, x, *rest):
        tm = _tm(node)
        cdt = tm.dtype if compute_float or True else None
        return pointwise(node, template, [x], compute=tm.dtype)
    return low


# --- pointwise ----------------------------------------------------------------------------

UNARY = {
    aten.neg.default: "-{0}", aten.abs.default: "m::abs({0})", aten.exp.default: "m::exp({0})",
    aten.exp2.default: "m::exp2({0})", aten.log.default: "m::log({0})",
    aten.log2.default: "m::log2({0})", aten.log10.default: "m::log10({0})",
    aten.log1p.default: "m::log1p({0})", aten.expm1.default: "m::expm1({0})",
    aten.sqrt.default: "m::sqrt({0})", aten.rsqrt.default: "({T})1 / m::sqrt({0})",
    aten.sin.default: "m::sin({0})", aten.cos.default: "m::cos({0})",
    aten.tan.default: "m::tan({0})", aten.tanh.default: "m::tanh({0})",
    aten.sinh.default: "m::sinh({0})", aten.cosh.default: "m::cosh({0})",
    aten.asin.default: "m::asin({0})", aten.acos.default: "m::acos({0})",
    aten.atan.default: "m::atan({0})", aten.asinh.default: "m::asinh({0})",
    aten.acosh.default: "m::acosh({0})", aten.atanh.default: "m::atanh({0})",
    aten.erf.default: "m::erf({0})", aten.erfc.default: "m::erfc({0})",
    aten.sigmoid.default: "({T})1 / (({T})1 + m::exp(-{0}))",
    aten.relu.default: "m::max({0}, ({T})0)", aten.floor.default: "t_floor({0})",
    aten.ceil.default: "t_ceil({0})", aten.round.default: "t_round({0})",
    aten.trunc.default: "t_trunc({0})", aten.sign.default: "t_sign({0})",
    aten.reciprocal.default: "({T})1 / {0}", aten.lgamma.default: "m::lgamma({0})",
    aten.bitwise_not.default: "t_not({0})", aten.logical_not.default: "!{0}",
}
FLOAT_ONLY = {aten.exp.default, aten.log.default, aten.sqrt.default, aten.rsqrt.default,
              aten.sin.default, aten.cos.default, aten.tanh.default, aten.sigmoid.default}

for _op, _tpl in UNARY.items():
    def _mk(tpl, op):
        def low(ctx, node, x):
            tm = _tm(node)
            if op is aten.logical_not.default:
                return pointwise(node, tpl, [x], compute=torch.bool)
            return pointwise(node, tpl, [x], compute=tm.dtype)
        return low
    LOWERINGS[_op] = _mk(_tpl, _op)

BINARY = {
    aten.mul.Tensor: "{0} * {1}", aten.mul.Scalar: "{0} * {1}",
    aten.div.Tensor: "{0} / {1}", aten.div.Scalar: "{0} / {1}",
    aten.maximum.default: "t_max({0}, {1})", aten.minimum.default: "t_min({0}, {1})",
    aten.pow.Tensor_Tensor: "t_pow({0}, {1})", aten.atan2.default: "m::atan2({0}, {1})",
    aten.fmod.Tensor: "t_fmod({0}, {1})", aten.fmod.Scalar: "t_fmod({0}, {1})",
    aten.remainder.Tensor: "t_remainder({0}, {1})", aten.remainder.Scalar: "t_remainder({0}, {1})",
    aten.bitwise_and.Tensor: "{0} & {1}", aten.bitwise_or.Tensor: "{0} | {1}",
    aten.bitwise_xor.Tensor: "{0} ^ {1}", aten.bitwise_and.Scalar: "{0} & {1}",
    aten.bitwise_or.Scalar: "{0} | {1}", aten.bitwise_xor.Scalar: "{0} ^ {1}",
    aten.floor_divide.default: "t_floordiv({0}, {1})",
}
COMPARE = {
    aten.eq.Tensor: "{0} == {1}", aten.eq.Scalar: "{0} == {1}", aten.ne.Tensor: "{0} != {1}",
    aten.ne.Scalar: "{0} != {1}", aten.lt.Tensor: "{0} < {1}", aten.lt.Scalar: "{0} < {1}",
    aten.le.Tensor: "{0} <= {1}", aten.le.Scalar: "{0} <= {1}", aten.gt.Tensor: "{0} > {1}",
    aten.gt.Scalar: "{0} > {1}", aten.ge.Tensor: "{0} >= {1}", aten.ge.Scalar: "{0} >= {1}",
}
LOGICAL = {aten.logical_and.default: "{0} && {1}", aten.logical_or.default: "{0} || {1}",
           aten.logical_xor.default: "{0} != {1}"}

for _op, _tpl in BINARY.items():
    def _mk(tpl):
        def low(ctx, node, a, b):
            return pointwise(node, tpl, [a, b])
        return low
    LOWERINGS[_op] = _mk(_tpl)
for _op, _tpl in COMPARE.items():
    def _mk(tpl):
        def low(ctx, node, a, b):
            return pointwise(node, tpl, [a, b], compute=promote(a, b), result=torch.bool)
        return low
    LOWERINGS[_op] = _mk(_tpl)
for _op, _tpl in LOGICAL.items():
    def _mk(tpl):
        def low(ctx, node, a, b):
            return pointwise(node, tpl, [a, b], compute=torch.bool)
        return low
    LOWERINGS[_op] = _mk(_tpl)


@register(aten.add.Tensor, aten.add.Scalar)
def _add(ctx, node, a, b, alpha=1):
    if alpha != 1:
        return pointwise(node, "{0} + {1} * {2}", [a, b, alpha])
    return pointwise(node, "{0} + {1}", [a, b])


@register(aten.sub.Tensor, aten.sub.Scalar)
def _sub(ctx, node, a, b, alpha=1):
    if alpha != 1:
        return pointwise(node, "{0} - {1} * {2}", [a, b, alpha])
    return pointwise(node, "{0} - {1}", [a, b])


@register(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(ctx, node, a, b, alpha=1):
    return pointwise(node, "{1} - {0} * {2}", [a, b, alpha])


@register(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(ctx, node, a, b, rounding_mode=None):
    tm = _tm(node)
    if rounding_mode is None:
        return pointwise(node, "{0} / {1}", [a, b])
    if rounding_mode == "trunc":
        tpl = "t_trunc({0} / {1})" if tm.dtype.is_floating_point else "{0} / {1}"
        return pointwise(node, tpl, [a, b])
    return pointwise(node, "t_floordiv({0}, {1})", [a, b])


@register(aten.pow.Tensor_Scalar)
def _pow(ctx, node, a, e):
    if e == 2:
        return pointwise(node, "{0} * {0}", [a])
    if e == 1:
        return pointwise(node, "{0}", [a])
    if e == 0.5 and _tm(node).dtype.is_floating_point:
        return pointwise(node, "m::sqrt({0})", [a])
    return pointwise(node, "t_pow({0}, {1})", [a, e])


@register(aten.pow.Scalar)
def _pow_s(ctx, node, a, e):
    return pointwise(node, "t_pow({0}, {1})", [a, e])


@register(aten.clamp.default, aten.clamp.Tensor)
def _clamp(ctx, node, x, min=None, max=None):
    out = x
    tpl, args = "{0}", [x]
    if min is not None:
        tpl = f"t_max({tpl}, {{{len(args)}}})"
        args.append(min)
    if max is not None:
        tpl = f"t_min({tpl}, {{{len(args)}}})"
        args.append(max)
    return pointwise(node, tpl, args)


@register(aten.where.self)
def _where(ctx, node, c, a, b):
    tm = _tm(node)
    loaders = [bcast(c, tm.shape)] + [bcast(v, tm.shape) if isinstance(v, TV) else scalar_loader(v) for v in (a, b)]
    dt = tm.dtype

    def fn(k, idx):
        cv = k.cast(loaders[0](k, idx), torch.bool)
        av = k.cast(loaders[1](k, idx), dt)
        bv = k.cast(loaders[2](k, idx), dt)
        return k.op("{0} ? {1} : {2}", dt, [cv, av, bv], dt)
    return TV(tm.shape, dt, fn, cost=1 + sum(v.cost for v in (c, a, b) if isinstance(v, TV)))


@register(aten.isnan.default)
def _isnan(ctx, node, x):
    if not x.dtype.is_floating_point:
        return pointwise(node, "false", [x], compute=x.dtype, result=torch.bool)
    return pointwise(node, "m::isnan({0})", [x], compute=x.dtype, result=torch.bool)


@register(aten.threshold_backward.default)
def _thr_bw(ctx, node, grad, x, threshold):
    return pointwise(node, "({1} <= {2}) ? ({T})0 : {0}", [grad, x, threshold])


@register(aten.to.dtype, aten.to.dtype_layout, aten.to.other, aten.to.device)
def _to(ctx, node, x, *args, **kw):
    tm = _tm(node)
    return pointwise(node, "{0}", [x], compute=tm.dtype)


@register(aten._to_copy.default, prims.convert_element_type.default)
def _to_copy(ctx, node, x, dtype=None, **kw):
    tm = _tm(node)
    if kw.get("device") not in (None, torch.device("cpu")) or kw.get("layout") not in (None, torch.strided):
        raise Unlowerable("device/layout change")
    return pointwise(node, "{0}", [x], compute=tm.dtype)


@register(aten.clone.default, aten.alias.default, aten.detach.default, aten.lift_fresh_copy.default,
          aten.contiguous.default)
def _identity(ctx, node, x, **kw):
    return x


@register(aten.copy.default)
def _copy(ctx, node, dst, src, non_blocking=False):
    return pointwise(node, "{0}", [src], compute=_tm(node).dtype)


# --- constants and factories ----------------------------------------------------------------

def _fill(node, value):
    tm = _tm(node)
    dt = tm.dtype

    def fn(k, idx):
        return k.const(value, dt)
    return TV(tm.shape, dt, fn)


@register(aten.full.default, aten.full_like.default, aten.new_full.default)
def _full(ctx, node, *args, **kw):
    if node.target is aten.full.default:
        value = args[1]
    elif node.target is aten.full_like.default:
        value = args[1]
    else:
        value = args[2]
    if isinstance(value, TV):
        raise Unlowerable("tensor fill value")
    return _fill(node, value)


@register(aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default, aten.empty_like.default,
          aten.empty.memory_format, aten.new_empty.default, aten.empty_strided.default)
def _zeros(ctx, node, *args, **kw):
    return _fill(node, 0)


@register(aten.ones.default, aten.ones_like.default, aten.new_ones.default)
def _ones(ctx, node, *args, **kw):
    return _fill(node, 1)


@register(aten.fill.Scalar)
def _fill_s(ctx, node, x, v):
    return _fill(node, v)


@register(aten.scalar_tensor.default)
def _scalar_tensor(ctx, node, v, **kw):
    return _fill(node, v)


@register(aten.arange.start_step, aten.arange.default, aten.arange.start)
def _arange(ctx, node, *args, **kw):
    tm = _tm(node)
    nums = [a for a in args if isinstance(a, (int, float))]
    if len(nums) == 1:
        start, step = 0, 1
    elif len(nums) == 2:
        start, step = nums[0], 1
    else:
        start, step = nums[0], nums[2]
    dt = tm.dtype
    cdt = torch.float64 if dt.is_floating_point else torch.int64

    def fn(k, idx):
        i = k.index(idx[0])
        return k.cast(k.op("{1} + {0} * {2}", cdt, [k.cast(i, cdt), k.const(start, cdt), k.const(step, cdt)], cdt), dt)
    return TV(tm.shape, dt, fn)


# --- views ----------------------------------------------------------------------------------

def _view_of(x: TV, sizes, remap, cost_extra=0):
    """A view: new sizes and an index remap out-idx -> in-idx. Keeps strided-ness if affine."""
    sizes = tuple(int(s) for s in sizes)

    def load(k, idx):
        return x.load(k, remap(idx))
    strided = None
    if x.strided is not None:
        from ..index import Var
        b, st, off = x.strided
        probe = [Ix.of(Var(f"_p{d}", s)) for d, s in enumerate(sizes)]
        src = remap(probe)
        flat = flat_index(src, st, off)
        # affine in the probe vars with no div/mod: representable as strides
        coefs = {a.name: c for a, c in flat.terms if isinstance(a, Var)}
        if all(isinstance(a, Var) for a, _ in flat.terms):
            new_st = tuple(coefs.get(f"_p{d}", 0) for d in range(len(sizes)))
            strided = (b, new_st, flat.const)
            return TV.view_of(b, sizes, new_st, flat.const)
    return TV(sizes, x.dtype, load, strided, x.cost)


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.view_copy.default,
          aten._reshape_alias.default)
def _reshape(ctx, node, x, sizes, *rest):
    tm = _tm(node)
    new = tm.shape
    if tuple(new) == x.sizes:
        return x

    def remap(idx):
        flat = flat_index(idx, contiguous_strides(new))
        return unflatten(flat, x.sizes)
    return _view_of(x, new, remap)


@register(aten.permute.default, aten.permute_copy.default)
def _permute(ctx, node, x, dims):
    nd = len(x.sizes)
    dims = [d % nd for d in dims] if nd else []
    sizes = [x.sizes[d] for d in dims]
    inv = [0] * nd
    for i, d in enumerate(dims):
        inv[d] = i
    return _view_of(x, sizes, lambda idx: [idx[inv[d]] for d in range(nd)])


@register(aten.t.default)
def _t(ctx, node, x):
    if len(x.sizes) < 2:
        return x
    return _permute(ctx, node, x, [1, 0])


@register(aten.transpose.int)
def _transpose(ctx, node, x, a, b):
    nd = len(x.sizes)
    if nd == 0:
        return x
    dims = list(range(nd))
    a, b = a % nd, b % nd
    dims[a], dims[b] = dims[b], dims[a]
    return _permute(ctx, node, x, dims)


@register(aten.expand.default, aten.expand_copy.default)
def _expand(ctx, node, x, sizes, implicit=False):
    tm = _tm(node)
    out = tm.shape
    load = bcast(x, out)
    nd, m = len(out), len(x.sizes)

    def remap(idx):
        sub = list(idx[nd - m:])
        for d in range(m):
            if x.sizes[d] == 1 and out[nd - m + d] != 1:
                sub[d] = Ix()
        return sub
    return _view_of(x, out, remap)


@register(aten.unsqueeze.default)
def _unsqueeze(ctx, node, x, dim):
    tm = _tm(node)
    dim = dim % (len(x.sizes) + 1)
    return _view_of(x, tm.shape, lambda idx: list(idx[:dim]) + list(idx[dim + 1:]))


@register(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def _squeeze(ctx, node, x, dims=None):
    tm = _tm(node)
    nd = len(x.sizes)
    if dims is None:
        dims = [d for d in range(nd) if x.sizes[d] == 1]
    elif isinstance(dims, int):
        dims = [dims]
    dims = {d % nd for d in dims if x.sizes[d % nd] == 1} if nd else set()
    keep = [d for d in range(nd) if d not in dims]

    def remap(idx):
        out = [Ix()] * nd
        for j, d in enumerate(keep):
            out[d] = idx[j]
        return out
    return _view_of(x, tm.shape, remap)


@register(aten.slice.Tensor)
def _slice(ctx, node, x, dim=0, start=None, end=None, step=1):
    tm = _tm(node)
    nd = len(x.sizes)
    dim = dim % nd
    size = x.sizes[dim]
    start = 0 if start is None else start
    start = start + size if start < 0 else start
    start = min(max(start, 0), size)

    def remap(idx):
        out = list(idx)
        out[dim] = Ix.of(idx[dim]) * step + start
        return out
    return _view_of(x, tm.shape, remap)


@register(aten.select.int)
def _select(ctx, node, x, dim, index):
    tm = _tm(node)
    nd = len(x.sizes)
    dim = dim % nd
    index = index + x.sizes[dim] if index < 0 else index
    return _view_of(x, tm.shape, lambda idx: list(idx[:dim]) + [Ix(const=index)] + list(idx[dim:]))


@register(aten.as_strided.default)
def _as_strided(ctx, node, x, size, stride, storage_offset=None):
    if x.buffer is None:
        raise Unlowerable("as_strided of a computed value")
    b = x.buffer
    off = b.offset if storage_offset is None else storage_offset
    return TV.view_of(b, tuple(size), tuple(stride), off)


@register(aten.split.Tensor, aten.split_with_sizes.default, aten.unbind.int)
def _split(ctx, node, x, sizes_or_size=None, dim=0):
    metas = _multi_metas(node)
    if node.target is aten.unbind.int:
        dim = sizes_or_size if sizes_or_size is not None else 0
    nd = len(x.sizes)
    dim = dim % nd
    outs, start = [], 0
    for m in metas:
        if m is None:
            raise Unlowerable("unused split piece")
        if node.target is aten.unbind.int:
            s0 = start

            def remap(idx, s0=s0):
                return list(idx[:dim]) + [Ix(const=s0)] + list(idx[dim:])
            outs.append(_view_of(x, m.shape, remap))
            start += 1
        else:
            s0 = start

            def remap(idx, s0=s0):
                out = list(idx)
                out[dim] = Ix.of(idx[dim]) + s0
                return out
            outs.append(_view_of(x, m.shape, remap))
            start += m.shape[dim]
    return tuple(outs)


@register(aten.cat.default)
def _cat(ctx, node, tensors, dim=0):
    tm = _tm(node)
    tensors = [t for t in tensors if not (len(t.sizes) == 1 and t.sizes[0] == 0)]
    nd = len(tm.shape)
    dim = dim % nd
    bounds, acc = [], 0
    for t in tensors:
        acc += t.sizes[dim]
        bounds.append(acc)
    dt = tm.dtype

    def fn(k, idx):
        i = idx[dim]
        branches = []
        lo = 0
        for t, hi in zip(tensors, bounds):
            def br(k, t=t, lo=lo):
                sub = list(idx)
                sub[dim] = Ix.of(i) - lo
                return k.cast(bcast(t, tuple(sub_sz(t, tm.shape, dim)))(k, sub) if False else t.load(k, sub), dt)
            branches.append((f"({Ix.of(i).c()}) < {hi}", br))
            lo = hi
        return k.piecewise(branches, dt)
    return TV(tm.shape, dt, fn, cost=2 + sum(t.cost for t in tensors))


def sub_sz(t, shape, dim):
    return shape


@register(aten.constant_pad_nd.default)
def _pad(ctx, node, x, pad, value=0):
    tm = _tm(node)
    nd = len(x.sizes)
    dt = tm.dtype
    lows = [0] * nd
    for i in range(len(pad) // 2):
        lows[nd - 1 - i] = pad[2 * i]

    def fn(k, idx):
        src = [Ix.of(i) - lo for i, lo in zip(idx, lows)]
        conds = []
        for d in range(nd):
            if lows[d] or x.sizes[d] != tm.shape[d]:
                e = src[d].c()
                conds.append(f"({e}) >= 0 && ({e}) < {x.sizes[d]}")
        if not conds:
            return k.cast(x.load(k, src), dt)
        return k.piecewise([(" && ".join(conds), lambda k: k.cast(x.load(k, src), dt)),
                            ("true", lambda k: k.const(value, dt))], dt)
    return TV(tm.shape, dt, fn, cost=2 + x.cost)


@register(aten.slice_scatter.default)
def _slice_scatter(ctx, node, base, src, dim=0, start=None, end=None, step=1):
    tm = _tm(node)
    nd = len(tm.shape)
    dim = dim % nd
    size = tm.shape[dim]
    start = 0 if start is None else (start + size if start < 0 else start)
    end = size if end is None else (end + size if end < 0 else min(end, size))
    dt = tm.dtype

    def fn(k, idx):
        i = Ix.of(idx[dim])
        cond = f"({i.c()}) >= {start} && ({i.c()}) < {end}" + (f" && (({i.c()}) - {start}) % {step} == 0" if step != 1 else "")

        def from_src(k):
            sub = list(idx)
            sub[dim] = (i - start).floordiv(step) if step != 1 else i - start
            return k.cast(src.load(k, sub), dt)
        return k.piecewise([(cond, from_src), ("true", lambda k: k.cast(base.load(k, list(idx)), dt))], dt)
    return TV(tm.shape, dt, fn, cost=2 + base.cost + src.cost)


@register(aten.select_scatter.default)
def _select_scatter(ctx, node, base, src, dim, index):
    tm = _tm(node)
    nd = len(tm.shape)
    dim = dim % nd
    index = index + tm.shape[dim] if index < 0 else index
    dt = tm.dtype

    def fn(k, idx):
        i = Ix.of(idx[dim])

        def from_src(k):
            return k.cast(src.load(k, list(idx[:dim]) + list(idx[dim + 1:])), dt)
        return k.piecewise([(f"({i.c()}) == {index}", from_src),
                            ("true", lambda k: k.cast(base.load(k, list(idx)), dt))], dt)
    return TV(tm.shape, dt, fn, cost=2 + base.cost + src.cost)


# --- indexing -------------------------------------------------------------------------------

@register(aten.embedding.default)
def _embedding(ctx, node, weight, indices, padding_idx=-1, *rest):
    tm = _tm(node)
    ni = len(indices.sizes)
    rows = weight.sizes[0]

    def fn(k, idx):
        row = k.indirect(indices.load(k, list(idx[:ni])), rows)
        return weight.load(k, [row] + list(idx[ni:]))
    return TV(tm.shape, tm.dtype, fn, cost=2)


@register(aten.index_select.default)
def _index_select(ctx, node, x, dim, index):
    tm = _tm(node)
    nd = len(x.sizes)
    dim = dim % nd if nd else 0

    def fn(k, idx):
        j = k.indirect(index.load(k, [idx[dim]] if index.sizes else []), x.sizes[dim])
        sub = list(idx)
        sub[dim] = j
        return x.load(k, sub)
    return TV(tm.shape, tm.dtype, fn, cost=2)


@register(aten.gather.default)
def _gather(ctx, node, x, dim, index, sparse_grad=False):
    tm = _tm(node)
    nd = len(x.sizes)
    if nd == 0:
        raise Unlowerable("0-d gather")
    dim = dim % nd

    def fn(k, idx):
        j = k.indirect(index.load(k, list(idx)), x.sizes[dim])
        sub = list(idx)
        sub[dim] = j
        return x.load(k, sub)
    return TV(tm.shape, tm.dtype, fn, cost=2)


@register(aten.index.Tensor)
def _index(ctx, node, x, indices):
    tm = _tm(node)
    tens = [(d, t) for d, t in enumerate(indices) if t is not None]
    if len(tens) != 1 or tens[0][1].dtype not in (torch.int64, torch.int32):
        raise Unlowerable("advanced indexing beyond one integer index tensor")
    d, it = tens[0]
    ni = len(it.sizes)

    def fn(k, idx):
        j = k.indirect(it.load(k, list(idx[d:d + ni])), x.sizes[d])
        sub = list(idx[:d]) + [j] + list(idx[d + ni:])
        return x.load(k, sub)
    return TV(tm.shape, tm.dtype, fn, cost=2)


# --- reductions -----------------------------------------------------------------------------

def _norm_dims(dims, nd):
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(nd))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({d % nd for d in dims}) if nd else []


def _reduce(ctx, node, x, dims, keepdim, rtype, out_dtype, pre=None, origin=""):
    """Reduction of ``x`` over ``dims``; ``pre(k, v)`` maps each loaded element first."""
    nd = len(x.sizes)
    dims = _norm_dims(dims, nd)
    rsizes = [x.sizes[d] for d in dims]
    kept = [d for d in range(nd) if d not in dims]
    out_sizes = [1 if d in dims else x.sizes[d] for d in range(nd)] if keepdim else [x.sizes[d] for d in kept]
    acc = out_dtype
    if rtype in ("sum", "prod") and out_dtype == torch.float32 and \
            size_choice("f64 accumulator", math.prod(rsizes) * DYN_SCALE.get() > 4096):
        acc = torch.float64   # why: a long float sum in one accumulator drifts (eager sums pairwise)
    if rtype in ("argmax", "argmin"):
        acc = x.dtype

    def fn(k, idx, ridx):
        src = [None] * nd
        it_r = iter(ridx)
        if keepdim:
            for d in range(nd):
                src[d] = next(it_r) if d in dims else idx[d]
        else:
            it_o = iter(idx)
            for d in range(nd):
                src[d] = next(it_r) if d in dims else next(it_o)
        v = x.load(k, src)
        if pre is not None:
            v = pre(k, v, idx)
        return v
    return ctx.reduction(out_sizes, rsizes, rtype, fn, out_dtype, acc, origin)


@register(aten.sum.dim_IntList, aten.sum.default, prims.sum.default)
def _sum(ctx, node, x, dims=None, keepdim=False, dtype=None, output_dtype=None):
    tm = _tm(node)
    dt = tm.dtype
    return _reduce(ctx, node, x, dims, keepdim, "sum", dt, pre=lambda k, v, idx: k.cast(v, dt), origin="sum")


@register(aten.prod.dim_int, aten.prod.default)
def _prod(ctx, node, x, dims=None, keepdim=False, dtype=None):
    tm = _tm(node)
    dt = tm.dtype
    if isinstance(dims, torch.dtype):
        dims = None
    return _reduce(ctx, node, x, dims, keepdim, "prod", dt, pre=lambda k, v, idx: k.cast(v, dt), origin="prod")


@register(aten.mean.dim, aten.mean.default)
def _mean(ctx, node, x, dims=None, keepdim=False, dtype=None):
    tm = _tm(node)
    dt = tm.dtype
    if isinstance(dims, torch.dtype):
        dims = None
    nd = len(x.sizes)
    n = math.prod(x.sizes[d] for d in _norm_dims(dims, nd)) if nd else 1
    s = _reduce(ctx, node, x, dims, keepdim, "sum", dt, pre=lambda k, v, idx: k.cast(v, dt), origin="mean")

    def fn(k, idx):
        return k.op("{0} / {1}", dt, [s.load(k, idx), k.const(n, dt)], dt)
    return TV(s.sizes, dt, fn)


@register(aten.amax.default, aten.amin.default, prims.amax.default, prims.amin.default,
          aten.max.default, aten.min.default)
def _amax(ctx, node, x, dims=None, keepdim=False):
    tm = _tm(node)
    rt = "max" if node.target in (aten.amax.default, prims.amax.default, aten.max.default) else "min"
    if x.numel == 0:
        raise Unlowerable("empty max")
    return _reduce(ctx, node, x, dims, keepdim, rt, tm.dtype, origin=rt)


@register(aten.any.dim, aten.any.dims, aten.any.default)
def _any(ctx, node, x, dims=None, keepdim=False):
    tm = _tm(node)
    return _reduce(ctx, node, x, dims, keepdim, "max", torch.bool,
                   pre=lambda k, v, idx: k.cast(v, torch.bool), origin="any")


@register(aten.all.dim, aten.all.dims, aten.all.default)
def _all(ctx, node, x, dims=None, keepdim=False):
    return _reduce(ctx, node, x, dims, keepdim, "min", torch.bool,
                   pre=lambda k, v, idx: k.cast(v, torch.bool), origin="all")


@register(aten.argmax.default, aten.argmin.default)
def _argmax(ctx, node, x, dim=None, keepdim=False):
    if dim is None:
        flat = TV((x.numel,), x.dtype, lambda k, idx: x.load(k, unflatten(Ix.of(idx[0]), x.sizes)), cost=x.cost)
        x, dim = flat, 0
        keepdim_eff = False
    else:
        keepdim_eff = keepdim
    if x.numel == 0:
        raise Unlowerable("empty argmax")
    rt = "argmax" if node.target is aten.argmax.default else "argmin"
    r = _reduce(ctx, node, x, [dim], keepdim_eff, rt, torch.int64, origin=rt)
    tm = _tm(node)
    if r.sizes != tuple(tm.shape):
        return _view_of(r, tm.shape, lambda idx: unflatten(flat_index(idx, contiguous_strides(tm.shape)), r.sizes))
    return r


def _var(ctx, node, x, dims, correction, keepdim, want_mean):
    nd = len(x.sizes)
    dl = _norm_dims(dims, nd)
    n = math.prod(x.sizes[d] for d in dl) if nd else 1
    dt = x.dtype if x.dtype.is_floating_point else torch.float32
    ctype(dt)
    s = _reduce(ctx, node, x, dims, keepdim, "sum", dt, pre=lambda k, v, idx: k.cast(v, dt), origin="var(mean)")

    def mean_fn(k, idx):
        return k.op("{0} / {1}", dt, [s.load(k, idx), k.const(n, dt)], dt)
    mean = TV(s.sizes, dt, mean_fn)

    def sq(k, v, idx):
        d = k.op("{0} - {1}", dt, [k.cast(v, dt), mean_fn(k, idx)], dt)
        return k.op("{0} * {0}", dt, [d], dt)
    ss = _reduce(ctx, node, x, dims, keepdim, "sum", dt, pre=sq, origin="var")
    denom = max(n - (1 if correction is None else correction), 0)

    def var_fn(k, idx):
        return k.op("{0} / {1}", dt, [ss.load(k, idx), k.const(denom, dt)], dt)
    var = TV(s.sizes, dt, var_fn)
    return (var, mean) if want_mean else var


@register(aten.var.correction, aten.var.dim)
def _var_l(ctx, node, x, dims=None, unbiased=None, keepdim=False, correction=None):
    if node.target is aten.var.dim:
        correction = 1 if unbiased in (None, True) else 0
    elif correction is None:
        correction = 1
    return _var(ctx, node, x, dims, correction, keepdim, False)


@register(aten.var_mean.correction, aten.var_mean.dim)
def _var_mean(ctx, node, x, dims=None, correction=None, keepdim=False):
    if node.target is aten.var_mean.dim:
        correction = 1 if correction in (None, True) else 0
    return _var(ctx, node, x, dims, 1 if correction is None else correction, keepdim, True)


@register(prims.var.default)
def _pvar(ctx, node, x, dims, correction=1.0, output_dtype=None):
    return _var(ctx, node, x, dims, correction, False, False)


@register(prims.broadcast_in_dim.default)
def _bid(ctx, node, x, shape, bdims):
    def remap(idx):
        return [Ix() if x.sizes[j] == 1 and shape[d] != 1 else idx[d] for j, d in enumerate(bdims)]
    return _view_of(x, shape, remap)


@register(prims.div.default)
def _pdiv(ctx, node, a, b):
    tm = _tm(node)
    if tm.dtype.is_floating_point:
        return pointwise(node, "{0} / {1}", [a, b])
    return pointwise(node, "{0} / {1}", [a, b])


# --- matmul: small ones are loops in the kernel file, big ones call ATen ---------------------

def _mm_tv(ctx, node, a, b, batch):
    """out[..., i, j] = sum_k a[..., i, k] * b[..., k, j] as a reduction."""
    *bs, m, kk = a.sizes
    n = b.sizes[-1]
    dt = a.dtype
    if dt not in (torch.float32, torch.float64) or b.dtype != dt:
        raise Unlowerable("integer matmul")
    a = ctx.strided_or_realize(a, "matmul operand")
    b = ctx.strided_or_realize(b, "matmul operand")
    out = tuple(bs) + (m, n)

    def fn(k, idx, ridx):
        r = ridx[0]
        av = a.load(k, list(idx[:-2]) + [idx[-2], r])
        bv = b.load(k, list(idx[:-2]) + [r, idx[-1]])
        return k.op("{0} * {1}", dt, [av, bv], dt)
    return ctx.reduction(out, (kk,), "sum", fn, dt, dt, origin="matmul")


def _small(macs):
    return size_choice("inline matmul", macs * DYN_SCALE.get() <= SMALL_MATMUL_MACS)


@register(aten.mm.default)
def _mm(ctx, node, a, b):
    m, k = a.sizes
    n = b.sizes[1]
    if not _small(m * n * k) or k == 0:
        return ctx.extern(node, (a, b), {}, fallback=False)
    return _mm_tv(ctx, node, a, b, False)


@register(aten.bmm.default)
def _bmm(ctx, node, a, b):
    bsz, m, k = a.sizes
    n = b.sizes[2]
    if not _small(bsz * m * n * k) or k == 0:
        return ctx.extern(node, (a, b), {}, fallback=False)
    return _mm_tv(ctx, node, a, b, True)


@register(aten.addmm.default)
def _addmm(ctx, node, bias, a, b, beta=1, alpha=1):
    m, k = a.sizes
    n = b.sizes[1]
    if not _small(m * n * k) or k == 0:
        return ctx.extern(node, (bias, a, b), {"beta": beta, "alpha": alpha}, fallback=False)
    mm = _mm_tv(ctx, node, a, b, False)
    tm = _tm(node)
    args = [mm, bias]
    tpl = "{0} + {1}"
    if alpha != 1 or beta != 1:
        tpl = "{0} * {2} + {1} * {3}"
        args += [alpha, beta]
    return pointwise(node, tpl, args)


EXTERN_OPS = [aten.convolution.default, aten.convolution_backward.default,
              aten._scaled_dot_product_flash_attention_for_cpu.default,
              aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
              aten.baddbmm.default, aten.embedding_dense_backward.default]


def lower_graph(gm: fx.GraphModule, num_outputs: int, mutated: list) -> LoweredGraph:
    """Lower a functional ATen graph whose outputs are (user outputs..., new values of the
    inputs in ``mutated``..., [saved tensors...])."""
    ctx = LowerCtx()
    g = ctx.g
    env: dict = {}
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, n in enumerate(phs):
        tm = n.meta.get("tm")
        if tm is None:
            env[n] = n.meta.get("value")
            g.inputs.append(None)
            continue
        b = Buffer(f"in{i}", tm.shape, tm.stride, 0, tm.dtype, kind="input", input_index=i,
                   base_offset=tm.offset)
        g.inputs.append(b)
        env[n] = TV.of_buffer(b)
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            t = getattr(gm, n.target)
            b = Buffer(n.target, tuple(t.shape), tuple(t.stride()), 0, t.dtype, kind="const",
                       base_offset=t.storage_offset())
            g.constants[n.target] = t
            env[n] = TV.of_buffer(b)
        elif n.op == "call_function":
            args = fx.node.map_arg(n.args, lambda a: env[a])
            kwargs = fx.node.map_arg(n.kwargs, lambda a: env[a])
            if n.target is operator.getitem:
                env[n] = args[0][args[1]]
                continue
            env[n] = _lower_node(ctx, n, args, kwargs)
            v = env[n]
            if isinstance(v, TV) and v.cost > INLINE_COST and (len(n.users) > 1 or v.cost > 4 * INLINE_COST):
                env[n] = ctx.realize(v, str(n.target))
        elif n.op == "output":
            outs = list(n.args[0])
            vals = [env[o] if isinstance(o, fx.Node) else o for o in outs]
            # Outputs must be memory the wrapper can hand out, in the layout seen at trace
            # time: a backward graph indexes its saved inputs with the traced strides.
            vals = [_as_traced(ctx, v, o.meta.get("tm") if isinstance(o, fx.Node) else None)
                    for v, o in zip(vals, outs)]
            g.outputs = vals[:num_outputs] + vals[num_outputs + len(mutated):]
            for inp, v in zip(mutated, vals[num_outputs:num_outputs + len(mutated)]):
                dst = g.inputs[inp]
                src = v if isinstance(v, TV) else None
                if src is None:
                    raise Unlowerable("non-tensor mutation")
                if _reads_other_elements(src, dst):
                    src = ctx.realize(src, "mutation source")
                cb = ComputedBuffer(ctx.name("copyback"), dst.sizes, dst.strides, dst.offset, dst.dtype,
                                    kind="alias", body=Pointwise(src.load),
                                    origin="copy-back", target=dst)
                cb.input_index = inp
                g.copy_backs.append(cb)
    return g


def _as_traced(ctx, v, tm):
    if not isinstance(v, TV):
        return v
    if tm is not None and v.strided is not None and tuple(v.strided[1]) == tuple(tm.stride) \
            and v.strided[2] == tm.offset:
        return v
    if tm is None or tm.offset != 0 or 0 in tm.stride and v.numel > 1 \
            or tuple(tm.stride) == contiguous_strides(tm.shape):
        if v.strided is not None and tm is None:
            return v
        return ctx.realize(v, "output")
    buf = ComputedBuffer(ctx.name(), v.sizes, tuple(tm.stride), 0, v.dtype,
                         body=Pointwise(v.load), origin="output")
    ctx.g.steps.append(buf)
    return TV.of_buffer(buf)


def _reads_other_elements(src: TV, dst: Buffer) -> bool:
    """Would writing ``dst`` in place while computing ``src`` clobber values still needed?"""
    from ..codegen.emit import Emitter
    from ..index import Var
    idx = [Ix.of(Var(f"_c{d}", s)) if s != 1 else Ix() for d, s in enumerate(src.sizes)]
    k = Emitter()
    src.load(k, idx)
    own = dst.index(idx)
    return any(b is dst and ix != own for b, ix in k.loads) or src.sizes != tuple(dst.sizes)


def _has_bad_dtype(args):
    bad = []

    def visit(a):
        if isinstance(a, TV) and a.dtype not in CTYPES:
            bad.append(a.dtype)
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x)
    visit(args)
    return bool(bad)


def _lower_node(ctx: LowerCtx, n: fx.Node, args, kwargs):
    fn = LOWERINGS.get(n.target)
    tm = n.meta.get("tm")
    if n.target in EXTERN_OPS:
        return ctx.extern(n, args, kwargs, fallback=False)
    if fn is not None and not _has_bad_dtype(args) and (tm is None or tm.dtype in CTYPES):
        try:
            v = fn(ctx, n, *args, **kwargs)
            if isinstance(v, TV) and tm is not None and tuple(v.sizes) != tuple(tm.shape):
                raise Unlowerable(f"shape mismatch {v.sizes} vs {tm.shape}")
            return v
        except Unlowerable:
            pass
    return ctx.extern(n, args, kwargs, fallback=True)
