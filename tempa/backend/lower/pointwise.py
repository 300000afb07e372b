"""Pointwise lowerings (unary, binary, comparisons, casts) and constant factories."""
from __future__ import annotations

import torch

from ..ir import TV, Unlowerable
from .core import aten, bcast, LOWERINGS, pointwise, prims, promote, register, scalar_loader, _tm


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
    tpl, args = "{0}", [x]
    if min is not None:
        tpl = f"t_max({tpl}, {{{len(args)}}})"
        args.append(min)
    if max is not None:
        tpl = f"t_min({tpl}, {{{len(args)}}})"
        args.append(max)
    return pointwise(node, tpl, args)


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
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
    if kw.get("layout") not in (None, torch.strided) or not _same_device(node, kw.get("device")):
        raise Unlowerable("device/layout change")
    return pointwise(node, "{0}", [x], compute=tm.dtype)


def _same_device(node, device) -> bool:
    """``_to_copy(x, device=d)`` where x already lives on d (autocast's casts on CUDA name
    the device) is a plain cast, not a transfer."""
    if device is None:
        return True
    tm = node.args[0].meta.get("tm") if isinstance(node.args[0], torch.fx.Node) else None
    here = tm.device if tm is not None and tm.device is not None else torch.device("cpu")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None and here.type == "cuda":
        return True
    return device == here


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


@register(prims.div.default)
def _pdiv(ctx, node, a, b):
    tm = _tm(node)
    if tm.dtype.is_floating_point:
        return pointwise(node, "{0} / {1}", [a, b])
    return pointwise(node, "{0} / {1}", [a, b])
