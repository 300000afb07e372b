"""Metadata rules: pointwise, reductions, linear algebra, normalisation, convolution."""
from __future__ import annotations

import math

import torch

from .metainfo import (MetaInfo, NoRule, _broadcast, _device, _dim, _float_dtype, _grad,
                       _like, _promote)


# -- pointwise ---------------------------------------------------------------------------

def _unary_same(x, *args, **kwargs):
    if not isinstance(x, (MetaInfo, torch.Tensor)):
        raise NoRule()
    return _like(x)


def _unary_float(x, *args, **kwargs):
    if not isinstance(x, (MetaInfo, torch.Tensor)):
        raise NoRule()
    return _like(x, dtype=_float_dtype(x.dtype))


def _inplace(x, *args, **kwargs):
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, (MetaInfo, torch.Tensor)):
            _broadcast(x.shape, a.shape)
    return x


def _binary(op_kind):
    def rule(a, b, *rest, alpha=None, out=None, rounding_mode=None):
        if out is not None or rest:
            raise NoRule()
        ta, tb = isinstance(a, (MetaInfo, torch.Tensor)), isinstance(b, (MetaInfo, torch.Tensor))
        if not (ta or tb):
            raise NoRule()
        shape = _broadcast(a.shape if ta else (), b.shape if tb else ())
        dtype = _promote(a, b)
        if op_kind == "compare":
            return MetaInfo(shape, torch.bool, _device(a, b), False)
        if op_kind == "truediv" and rounding_mode is None:
            dtype = _float_dtype(dtype)
        grad = _grad(a, b) and (dtype.is_floating_point or dtype.is_complex)
        return MetaInfo(shape, dtype, _device(a, b), grad)
    return rule


def _where(cond, a=None, b=None):
    if a is None:
        raise NoRule()
    shape = _broadcast(*[v.shape if isinstance(v, (MetaInfo, torch.Tensor)) else ()
                         for v in (cond, a, b)])
    dtype = _promote(a, b)
    return MetaInfo(shape, dtype, _device(a, b, cond), _grad(a, b))


def _masked_fill(x, mask, value):
    _broadcast(x.shape, mask.shape)
    return _like(x)


def _clamp(x, min=None, max=None):
    return _like(x)


def _dropout(x, p=0.5, training=True, inplace=False):
    return x if inplace else _like(x)


def _softmax(x, dim=None, *args, dtype=None, _stacklevel=3):
    if dim is None:
        raise NoRule()
    _dim(dim, x.dim())
    return _like(x, dtype=dtype or _float_dtype(x.dtype))


# -- reductions ----------------------------------------------------------------------------

def _reduce(kind):
    def rule(x, dim=None, keepdim=False, *, dtype=None, correction=None, unbiased=None):
        if isinstance(dim, bool):          # x.var(False): unbiased passed positionally
            raise NoRule()
        if dim is None or dim == () or dim == []:
            dims = list(range(x.dim()))
        else:
            dims = [dim] if isinstance(dim, int) else list(dim)
            dims = [_dim(d, x.dim()) for d in dims]
        shape = [1 if i in dims else s for i, s in enumerate(x.shape)] if keepdim else \
            [s for i, s in enumerate(x.shape) if i not in dims]
        if kind == "bool":
            return MetaInfo(shape, torch.bool, x.device, False)
        if kind == "sum":
            out = dtype or (torch.int64 if not (x.dtype.is_floating_point or x.dtype.is_complex)
                            else x.dtype)
        elif kind == "mean":
            if not (x.dtype.is_floating_point or x.dtype.is_complex) and dtype is None:
                raise RuntimeError("mean(): could not infer output dtype. Input dtype must be "
                                   "either a floating point or complex dtype.")
            out = dtype or x.dtype
        else:
            out = x.dtype
        return MetaInfo(shape, out, x.device, _grad(x) and out.is_floating_point)
    return rule


def _minmax(x, dim=None, keepdim=False):
    if dim is None:
        return MetaInfo((), x.dtype, x.device, _grad(x))
    if not isinstance(dim, int):
        raise NoRule()
    d = _dim(dim, x.dim())
    shape = [1 if i == d else s for i, s in enumerate(x.shape)] if keepdim else \
        [s for i, s in enumerate(x.shape) if i != d]
    values = MetaInfo(shape, x.dtype, x.device, _grad(x))
    indices = MetaInfo(shape, torch.int64, x.device, False)
    return values, indices


def _arg(x, dim=None, keepdim=False):
    if dim is None:
        return MetaInfo((), torch.int64, x.device, False)
    d = _dim(dim, x.dim())
    shape = [1 if i == d else s for i, s in enumerate(x.shape)] if keepdim else \
        [s for i, s in enumerate(x.shape) if i != d]
    return MetaInfo(shape, torch.int64, x.device, False)


# -- linear algebra ------------------------------------------------------------------------

def _linear(x, weight, bias=None):
    if x.dtype != weight.dtype or (bias is not None and bias.dtype != x.dtype):
        raise NoRule()   # eager raises a dtype error: let fake tensors produce it exactly
    if weight.dim() != 2 or x.dim() == 0 or x.shape[-1] != weight.shape[1]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied "
                           f"({math.prod(x.shape[:-1])}x{x.shape[-1] if x.dim() else 0} and "
                           f"{weight.shape[1] if weight.dim() == 2 else '?'}x{weight.shape[0]})")
    shape = tuple(x.shape[:-1]) + (weight.shape[0],)
    if bias is not None:
        _broadcast(shape, bias.shape)
    return MetaInfo(shape, _promote(x, weight), x.device, _grad(x, weight, bias))


def _matmul(a, b):
    if not (isinstance(a, (MetaInfo, torch.Tensor)) and isinstance(b, (MetaInfo, torch.Tensor))):
        raise NoRule()
    if a.dim() == 0 or b.dim() == 0:
        raise RuntimeError("both arguments to matmul need to be at least 1D")
    if a.dtype != b.dtype:
        raise NoRule()   # eager raises a dtype error: let fake tensors produce it exactly
    sa, sb = list(a.shape), list(b.shape)
    if a.dim() == 1 and b.dim() == 1:
        if sa[0] != sb[0]:
            raise RuntimeError("inconsistent tensor size")
        return MetaInfo((), a.dtype, a.device, _grad(a, b))
    a1, b1 = a.dim() == 1, b.dim() == 1
    if a1:
        sa = [1] + sa
    if b1:
        sb = sb + [1]
    if sa[-1] != sb[-2]:
        raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({sa[-2]}x{sa[-1]} and "
                           f"{sb[-2]}x{sb[-1]})")
    batch = _broadcast(sa[:-2], sb[:-2])
    shape = list(batch) + [sa[-2], sb[-1]]
    if a1:
        shape.pop(-2)
    if b1:
        shape.pop(-1)
    return MetaInfo(shape, a.dtype, a.device, _grad(a, b))


def _bmm(a, b):
    if a.dim() != 3 or b.dim() != 3 or a.shape[0] != b.shape[0] or a.shape[2] != b.shape[1]:
        raise RuntimeError("bmm: shapes do not match")
    return MetaInfo((a.shape[0], a.shape[1], b.shape[2]), a.dtype, a.device, _grad(a, b))


def _mm(a, b):
    if a.dim() != 2 or b.dim() != 2:
        raise NoRule()
    return _matmul(a, b)


def _addmm(bias, a, b, *, beta=1, alpha=1):
    out = _mm(a, b)
    _broadcast(out.shape, bias.shape)
    out.requires_grad = _grad(bias, a, b)
    return out


def _sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if q.dim() < 2 or k.shape[-1] != q.shape[-1]:
        raise NoRule()
    shape = tuple(q.shape[:-1]) + (v.shape[-1],)
    return MetaInfo(shape, q.dtype, q.device, _grad(q, k, v, attn_mask))


def _layer_norm(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    if tuple(x.shape[-len(normalized_shape):]) != tuple(normalized_shape):
        raise RuntimeError(f"Given normalized_shape={list(normalized_shape)}, expected input "
                           f"with shape [*, {', '.join(map(str, normalized_shape))}], but got "
                           f"input of size{list(x.shape)}")
    return _like(x, grad=_grad(x, weight, bias))


def _embedding(ids, weight, *args, **kwargs):
    if ids.dtype not in (torch.int64, torch.int32):
        raise NoRule()
    return MetaInfo(tuple(ids.shape) + (weight.shape[1],), weight.dtype, weight.device, _grad(weight))


def _batch_norm(x, running_mean, running_var, weight=None, bias=None, training=False,
                momentum=0.1, eps=1e-5):
    return _like(x, grad=_grad(x, weight, bias))


def _group_norm(x, num_groups, weight=None, bias=None, eps=1e-5):
    return _like(x, grad=_grad(x, weight, bias))


def _conv(n):
    def rule(x, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
        if x.dim() not in (n + 1, n + 2) or weight.dim() != n + 2:
            raise NoRule()
        batched = x.dim() == n + 2
        spatial = list(x.shape[-n:])
        k = list(weight.shape[2:])
        st, dl = _tuple(stride, n), _tuple(dilation, n)
        if padding == "valid":
            pd = [0] * n
        elif padding == "same":
            pd = None
        else:
            pd = _tuple(padding, n)
        if x.shape[-n - 1] != weight.shape[1] * groups:
            raise RuntimeError("conv: input channels do not match weight")
        out = spatial[:] if pd is None else [
            (spatial[i] + 2 * pd[i] - dl[i] * (k[i] - 1) - 1) // st[i] + 1 for i in range(n)]
        if any(o <= 0 for o in out):
            raise RuntimeError("conv: output size is too small")
        shape = ([x.shape[0]] if batched else []) + [weight.shape[0]] + out
        return MetaInfo(shape, _promote(x, weight), x.device, _grad(x, weight, bias))
    return rule


def _tuple(v, n):
    return list(v) if isinstance(v, (tuple, list)) else [v] * n


def _cross_entropy(x, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                   reduction="mean", label_smoothing=0.0):
    if size_average is not None or reduce is not None:
        raise NoRule()
    if reduction == "none":
        shape = target.shape if target.dtype in (torch.int64, torch.int32) else x.shape[:1] + x.shape[2:]
    else:
        shape = ()
    return MetaInfo(shape, x.dtype, x.device, _grad(x, weight))
