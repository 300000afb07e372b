"""Pointwise lowerings (unary, binary, comparisons, casts) and constant factories."""
from __future__ import annotations

import torch

from ..ir import LoopValue, Unlowerable
from .core import (aten, bcast, identity, square, LOWERINGS, pointwise, prims, promote, register,
                   scalar_loader, _traced_meta)


# --- pointwise ----------------------------------------------------------------------------

# ATen op -> the loop-IR op (backend/ops.py) it is
UNARY = {getattr(aten, name).default: name for name in (
    "neg", "abs", "exp", "exp2", "log", "log2", "log10", "log1p", "expm1", "sqrt", "rsqrt",
    "sin", "cos", "tan", "tanh", "sinh", "cosh", "asin", "acos", "atan", "asinh", "acosh",
    "atanh", "erf", "erfc", "sigmoid", "relu", "floor", "ceil", "round", "trunc", "sign",
    "reciprocal", "lgamma", "bitwise_not", "logical_not")}

for _op, _name in UNARY.items():
    def _mk(name):
        def low(ctx, node, x):
            return pointwise(node, name, [x], compute=torch.bool if name == "logical_not" else _traced_meta(node).dtype)
        return low
    LOWERINGS[_op] = _mk(_name)

BINARY = {
    aten.mul.Tensor: "mul", aten.mul.Scalar: "mul", aten.div.Tensor: "div", aten.div.Scalar: "div",
    aten.maximum.default: "maximum", aten.minimum.default: "minimum",
    aten.pow.Tensor_Tensor: "pow", aten.atan2.default: "atan2",
    aten.fmod.Tensor: "fmod", aten.fmod.Scalar: "fmod",
    aten.remainder.Tensor: "remainder", aten.remainder.Scalar: "remainder",
    aten.bitwise_and.Tensor: "bitwise_and", aten.bitwise_or.Tensor: "bitwise_or",
    aten.bitwise_xor.Tensor: "bitwise_xor", aten.bitwise_and.Scalar: "bitwise_and",
    aten.bitwise_or.Scalar: "bitwise_or", aten.bitwise_xor.Scalar: "bitwise_xor",
    # the same ops as Python's operators (``a | b``: hardtanh_backward's decomposition)
    **{getattr(getattr(aten, f"__{name}__"), overload): f"bitwise_{name}"
       for name in ("and", "or", "xor") for overload in ("Tensor", "Scalar")},
    aten.floor_divide.default: "floordiv", prims.div.default: "div",
}
COMPARE = {getattr(getattr(aten, name), overload): name
           for name in ("eq", "ne", "lt", "le", "gt", "ge") for overload in ("Tensor", "Scalar")}
LOGICAL = {getattr(aten, name).default: name for name in ("logical_and", "logical_or", "logical_xor")}

for _op, _name in BINARY.items():
    def _mk(name):
        def low(ctx, node, a, b):
            return pointwise(node, name, [a, b])
        return low
    LOWERINGS[_op] = _mk(_name)
for _op, _name in COMPARE.items():
    def _mk(name):
        def low(ctx, node, a, b):
            return pointwise(node, name, [a, b], compute=promote(a, b))
        return low
    LOWERINGS[_op] = _mk(_name)
for _op, _name in LOGICAL.items():
    def _mk(name):
        def low(ctx, node, a, b):
            return pointwise(node, name, [a, b], compute=torch.bool)
        return low
    LOWERINGS[_op] = _mk(_name)


def _plus_scaled(k, vals, dt):
    """a + b * alpha"""
    a, b, alpha = vals
    return k.op("add", [a, k.op("mul", [b, alpha], dt)], dt)


def _minus_scaled(k, vals, dt):
    """a - b * alpha"""
    a, b, alpha = vals
    return k.op("sub", [a, k.op("mul", [b, alpha], dt)], dt)


@register(aten.add.Tensor, aten.add.Scalar)
def _add(ctx, node, a, b, alpha=1):
    if alpha != 1:
        return pointwise(node, _plus_scaled, [a, b, alpha])
    return pointwise(node, "add", [a, b])


@register(aten.sub.Tensor, aten.sub.Scalar)
def _sub(ctx, node, a, b, alpha=1):
    if alpha != 1:
        return pointwise(node, _minus_scaled, [a, b, alpha])
    return pointwise(node, "sub", [a, b])


@register(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(ctx, node, a, b, alpha=1):
    return pointwise(node, _minus_scaled, [b, a, alpha])


def _trunc_div(k, vals, dt):
    return k.op("trunc", [k.op("div", vals, dt)], dt)


@register(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(ctx, node, a, b, rounding_mode=None):
    tm = _traced_meta(node)
    if rounding_mode is None:
        return pointwise(node, "div", [a, b])
    if rounding_mode == "trunc":
        return pointwise(node, _trunc_div if tm.dtype.is_floating_point else "div", [a, b])
    return pointwise(node, "floordiv", [a, b])


def _cube(k, vals, dt):
    """(x * x) * x, the order of ATen's pow(x, 3)."""
    return k.op("mul", [square(k, vals[0], dt), vals[0]], dt)


def _inverse_square(k, vals, dt):
    """1 / (x * x), ATen's pow(x, -2)."""
    return k.op("div", [k.const(1, dt), square(k, vals[0], dt)], dt)


# The exponents ATen's CPU pow(tensor, scalar) computes without pow (PowKernel.cpp:
# pow_tensor_scalar_kernel and its optimized kernel), with the same operations. Why not pow:
# libmvec's vector powf takes a slow path for a negative base, so GPT-2's GELU,
# x + 0.044715 * x ** 3, ran at ~15 ns an element (2.9 ms for 64 x 3072) where x * x * x
# takes 0.1 ms.
_FLOAT_POW = {3: _cube, -2: _inverse_square, -1: "reciprocal", -0.5: "rsqrt", 0.5: "sqrt"}


@register(aten.pow.Tensor_Scalar)
def _pow(ctx, node, a, e):
    if e == 2:
        return pointwise(node, lambda k, vals, dt: square(k, vals[0], dt), [a])
    if e == 1:
        return pointwise(node, identity, [a])
    if not isinstance(e, bool) and e in _FLOAT_POW and _traced_meta(node).dtype.is_floating_point:
        return pointwise(node, _FLOAT_POW[e], [a])
    return pointwise(node, "pow", [a, e])


@register(aten.conj_physical.default)
def _conj_physical(ctx, node, x):
    """A real tensor's conjugate is its values (tanh's and other formulas' backward call it
    on real gradients; it ran as an ATen fallback call)."""
    if x.dtype.is_complex:
        raise Unlowerable("conj_physical of a complex tensor")
    return pointwise(node, identity, [x])


@register(aten.pow.Scalar)
def _pow_s(ctx, node, a, e):
    return pointwise(node, "pow", [a, e])


@register(aten.clamp.default, aten.clamp.Tensor)
def _clamp(ctx, node, x, min=None, max=None):
    bounds = [op for op, v in (("maximum", min), ("minimum", max)) if v is not None]

    def clamped(k, vals, dt):
        v = vals[0]
        for op, bound in zip(bounds, vals[1:]):
            v = k.op(op, [v, bound], dt)
        return v
    return pointwise(node, clamped, [x] + [v for v in (min, max) if v is not None])


@register(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def _where(ctx, node, c, a, b):
    tm = _traced_meta(node)
    loaders = [bcast(c, tm.shape)] + [bcast(v, tm.shape) if isinstance(v, LoopValue) else scalar_loader(v)
                                      for v in (a, b)]
    dt = tm.dtype

    def fn(k, idx):
        cv = k.cast(loaders[0](k, idx), torch.bool)
        av = k.cast(loaders[1](k, idx), dt)
        bv = k.cast(loaders[2](k, idx), dt)
        return k.op("where", [cv, av, bv], dt)
    return LoopValue(tm.shape, dt, fn, cost=1 + sum(v.cost for v in (c, a, b) if isinstance(v, LoopValue)))


@register(aten.isnan.default)
def _isnan(ctx, node, x):
    if not x.dtype.is_floating_point:
        return _fill(node, False)
    return pointwise(node, "isnan", [x], compute=x.dtype)


@register(aten.threshold_backward.default)
def _thr_bw(ctx, node, grad, x, threshold):
    def below_is_zero(k, vals, dt):
        g, v, t = vals
        return k.op("where", [k.op("le", [v, t], dt), k.const(0, dt), g], dt)
    return pointwise(node, below_is_zero, [grad, x, threshold])


@register(aten.to.dtype, aten.to.dtype_layout, aten.to.other, aten.to.device)
def _to(ctx, node, x, *args, **kw):
    tm = _traced_meta(node)
    return pointwise(node, identity, [x], compute=tm.dtype)


@register(aten._to_copy.default, prims.convert_element_type.default)
def _to_copy(ctx, node, x, dtype=None, **kw):
    tm = _traced_meta(node)
    if kw.get("layout") not in (None, torch.strided) or not _same_device(node, kw.get("device")):
        raise Unlowerable("device/layout change")
    return pointwise(node, identity, [x], compute=tm.dtype)


def _same_device(node, device) -> bool:
    """``_to_copy(x, device=d)`` where x already lives on d (autocast's casts on CUDA name
    the device) is a plain cast, not a transfer."""
    if device is None:
        return True
    tm = node.args[0].meta.get("traced_meta") if isinstance(node.args[0], torch.fx.Node) else None
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
    return pointwise(node, identity, [src], compute=_traced_meta(node).dtype)


# --- constants and factories ----------------------------------------------------------------

def _fill(node, value):
    tm = _traced_meta(node)
    dt = tm.dtype

    def fn(k, idx):
        return k.const(value, dt)
    return LoopValue(tm.shape, dt, fn)


@register(aten.full.default, aten.full_like.default, aten.new_full.default)
def _full(ctx, node, *args, **kw):
    if node.target is aten.full.default:
        value = args[1]
    elif node.target is aten.full_like.default:
        value = args[1]
    else:
        value = args[2]
    if isinstance(value, LoopValue):
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
    tm = _traced_meta(node)
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
        return k.cast(k.op("add", [k.const(start, cdt), k.op("mul", [k.cast(i, cdt), k.const(step, cdt)], cdt)], cdt), dt)
    return LoopValue(tm.shape, dt, fn)
