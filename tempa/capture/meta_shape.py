"""Metadata rules: views and shapes, conversions, factories."""
from __future__ import annotations

import math

import torch

from .metainfo import MetaInfo, NoRule, contiguous_strides, _dim, _grad, _like, _sizes, _vgrad


# -- views and shapes ------------------------------------------------------------------------

def _view(x, *size, _grad_fn=None):
    shape = list(_sizes(size))
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        raise NoRule()
    numel = x.numel()
    if shape.count(-1) > 1:
        raise RuntimeError("only one dimension can be inferred")
    if -1 in shape:
        known = math.prod(s for s in shape if s != -1)
        if known == 0 or numel % known:
            raise RuntimeError(f"shape '{list(_sizes(size))}' is invalid for input of size {numel}")
        shape[shape.index(-1)] = numel // known
    if math.prod(shape) != numel:
        raise RuntimeError(f"shape '{list(_sizes(size))}' is invalid for input of size {numel}")
    # view, and reshape of a contiguous tensor, are views; otherwise reshape copies.
    return MetaInfo(shape, x.dtype, x.device, _vgrad(x) if x.is_contiguous() else _grad(x))


def _view_method(x, *size):
    out = _view(x, *size)
    strides = view_strides(x.shape, x.stride(), out.shape)
    if strides is None:
        raise NoRule()   # not viewable: fake tensors raise eager's exact error
    return MetaInfo(out.shape, x.dtype, x.device, _vgrad(x), strides)


def view_strides(old_shape, old_strides, new_shape):
    """The strides of ``view(new_shape)`` of a tensor with these sizes and strides, or None
    when no view is possible (the algorithm of ATen's computeStride)."""
    if math.prod(old_shape) == 0 or not old_shape:
        return contiguous_strides(new_shape)
    new_strides = [0] * len(new_shape)
    view_d = len(new_shape) - 1
    chunk_base_stride = old_strides[-1]
    tensor_numel = view_numel = 1
    for tensor_d in range(len(old_shape) - 1, -1, -1):
        tensor_numel *= old_shape[tensor_d]
        if tensor_d == 0 or (old_shape[tensor_d - 1] != 1 and
                             old_strides[tensor_d - 1] != tensor_numel * chunk_base_stride):
            while view_d >= 0 and (view_numel < tensor_numel or new_shape[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base_stride
                view_numel *= new_shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride = old_strides[tensor_d - 1]
                tensor_numel = view_numel = 1
    if view_d != -1:
        return None
    return tuple(new_strides)


def _permute(x, *dims):
    dims = [_dim(d, x.dim()) for d in _sizes(dims)]
    if sorted(dims) != list(range(x.dim())):
        raise RuntimeError("permute(): dims don't match")
    return MetaInfo([x.shape[d] for d in dims], x.dtype, x.device, _vgrad(x),
                    [x.stride()[d] for d in dims])


def _transpose(x, d0, d1):
    if x.dim() == 0:
        return _like(x)
    order = list(range(x.dim()))
    a, b = _dim(d0, x.dim()), _dim(d1, x.dim())
    order[a], order[b] = order[b], order[a]
    return _permute(x, *order)


def _t(x):
    if x.dim() > 2:
        raise RuntimeError("t() expects a tensor with <= 2 dimensions")
    return _transpose(x, 0, 1) if x.dim() == 2 else _like(x)


def _unsqueeze(x, d):
    d = _dim(d, x.dim() + 1)
    shape = list(x.shape)
    strides = list(x.stride())
    shape.insert(d, 1)
    strides.insert(d, strides[d] * shape[d + 1] if d < len(strides) else 1)
    return MetaInfo(shape, x.dtype, x.device, _vgrad(x), strides)


def _squeeze(x, dim=None):
    if dim is None:
        keep = [i for i, s in enumerate(x.shape) if s != 1]
    else:
        dims = {_dim(d, x.dim()) for d in ([dim] if isinstance(dim, int) else dim)}
        keep = [i for i, s in enumerate(x.shape) if not (i in dims and s == 1)]
    return MetaInfo([x.shape[i] for i in keep], x.dtype, x.device, _vgrad(x),
                    [x.stride()[i] for i in keep])


def _flatten(x, start_dim=0, end_dim=-1):
    if x.dim() == 0:
        return _like(x, shape=(1,))
    s, e = _dim(start_dim, x.dim()), _dim(end_dim, x.dim())
    shape = list(x.shape[:s]) + [math.prod(x.shape[s:e + 1])] + list(x.shape[e + 1:])
    return MetaInfo(shape, x.dtype, x.device, _vgrad(x) if x.is_contiguous() else _grad(x))


def _expand(x, *sizes):
    sizes = list(_sizes(sizes))
    if len(sizes) < x.dim():
        raise RuntimeError("expand: the number of sizes provided must be >= the tensor's dims")
    lead = len(sizes) - x.dim()
    shape, strides = [], []
    for i, s in enumerate(sizes):
        if i < lead:
            shape.append(s)
            strides.append(0)
            continue
        own = x.shape[i - lead]
        if s == -1:
            s = own
        if own != s and own != 1:
            raise RuntimeError(f"The expanded size of the tensor ({s}) must match the existing "
                               f"size ({own}) at non-singleton dimension {i}")
        shape.append(s)
        strides.append(x.stride()[i - lead] if own == s else 0)
    return MetaInfo(shape, x.dtype, x.device, _vgrad(x), strides)


def _split(x, split_size, dim=0):
    d = _dim(dim, x.dim())
    n = x.shape[d]
    if isinstance(split_size, int):
        if split_size <= 0:
            raise NoRule()
        sizes = [min(split_size, n - i) for i in range(0, n, split_size)] or [0]
    else:
        sizes = list(split_size)
        if sum(sizes) != n:
            raise RuntimeError("split_with_sizes expects split_sizes to sum exactly to "
                               f"{n} (input tensor's size at dimension {d}), but got {sizes}")
    return tuple(_narrow_to(x, d, s) for s in sizes)


def _narrow_to(x, d, size):
    shape = list(x.shape)
    shape[d] = size
    return MetaInfo(shape, x.dtype, x.device, _vgrad(x), x.stride())


def _chunk(x, chunks, dim=0):
    d = _dim(dim, x.dim())
    n = x.shape[d]
    size = -(-n // chunks) if chunks > 0 else 0
    return _split(x, max(size, 1), d)


def _unbind(x, dim=0):
    d = _dim(dim, x.dim())
    shape = [s for i, s in enumerate(x.shape) if i != d]
    strides = [s for i, s in enumerate(x.stride()) if i != d]
    return tuple(MetaInfo(shape, x.dtype, x.device, _vgrad(x), strides) for _ in range(x.shape[d]))


def _cat(tensors, dim=0):
    tensors = [t for t in tensors if not (t.dim() == 1 and t.shape[0] == 0)] or list(tensors)
    first = tensors[0]
    d = _dim(dim, first.dim())
    for t in tensors[1:]:
        if t.dim() != first.dim() or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape))
                                         if i != d):
            raise RuntimeError("Sizes of tensors must match except in dimension "
                               f"{d}")
    shape = list(first.shape)
    shape[d] = sum(t.shape[d] for t in tensors)
    dtype = first.dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    return MetaInfo(shape, dtype, first.device, _grad(*tensors))


def _stack(tensors, dim=0):
    first = tensors[0]
    if any(t.shape != first.shape for t in tensors):
        raise RuntimeError("stack expects each tensor to be equal size")
    shape = list(first.shape)
    shape.insert(_dim(dim, first.dim() + 1), len(tensors))
    return MetaInfo(shape, first.dtype, first.device, _grad(*tensors))


def _getitem(x, index):
    if not isinstance(x, (MetaInfo, torch.Tensor)):
        raise NoRule()
    items = list(index) if isinstance(index, tuple) else [index]
    if any(not (i is None or i is Ellipsis or isinstance(i, slice) or type(i) is int)
           for i in items):
        raise NoRule()   # advanced indexing (tensors, lists, bools): fake tensors know it
    if any(isinstance(i, slice) and not all(type(v) in (int, type(None))
                                            for v in (i.start, i.stop, i.step)) for i in items):
        raise NoRule()
    n_real = sum(1 for i in items if i is not None and i is not Ellipsis)
    if n_real > x.dim():
        raise IndexError(f"too many indices for tensor of dimension {x.dim()}")
    if Ellipsis in items:
        at = items.index(Ellipsis)
        items = items[:at] + [slice(None)] * (x.dim() - n_real) + items[at + 1:]
    else:
        items = items + [slice(None)] * (x.dim() - n_real)
    shape, strides, d = [], [], 0
    for i in items:
        if i is None:
            shape.append(1)
            strides.append(0)
            continue
        size, stride = x.shape[d], x.stride()[d]
        if type(i) is int:
            if not -size <= i < size:
                raise IndexError(f"index {i} is out of bounds for dimension {d} with size {size}")
        else:
            if i.step is not None and i.step <= 0:
                raise ValueError("step must be greater than zero")
            start, stop, step = i.indices(size)
            shape.append(len(range(start, stop, step)))
            strides.append(stride * step)
        d += 1
    return MetaInfo(shape, x.dtype, x.device, _vgrad(x), strides)


def _to(x, *args, **kwargs):
    dtype, device = kwargs.get("dtype"), kwargs.get("device")
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, (str, torch.device)):
            device = torch.device(a)
        elif isinstance(a, (MetaInfo, torch.Tensor)):
            dtype, device = a.dtype, a.device
        elif isinstance(a, bool) or a is None:
            continue
        else:
            raise NoRule()
    device = torch.device(device) if device is not None else x.device
    if device.type == "cuda" and device.index is None:
        raise NoRule()
    dtype = dtype or x.dtype
    if dtype == x.dtype and device == x.device:
        return x          # .to() of a tensor that already matches returns it unchanged
    return MetaInfo(x.shape, dtype, device, _grad(x) and dtype.is_floating_point)


def _as(dtype):
    def rule(x, *a, **k):
        if x.dtype == dtype:
            return x      # x.float() of a float tensor is x itself
        return MetaInfo(x.shape, dtype, x.device, _grad(x) and dtype.is_floating_point)
    return rule


def _type_as(x, other):
    return _to(x, other.dtype)


# -- factories ------------------------------------------------------------------------------

def _factory(*size, dtype=None, device=None, requires_grad=False, layout=None,
             pin_memory=False, generator=None, memory_format=None, out=None):
    if out is not None or layout not in (None, torch.strided):
        raise NoRule()
    shape = _sizes(size)
    if not all(type(s) is int for s in shape):
        raise NoRule()
    return MetaInfo(shape, dtype or torch.get_default_dtype(), _as_device(device), requires_grad)


def _full(size, fill_value, *, dtype=None, device=None, requires_grad=False, layout=None,
          pin_memory=False, out=None):
    if dtype is None:
        if isinstance(fill_value, bool):
            dtype = torch.bool
        elif isinstance(fill_value, int):
            dtype = torch.int64
        elif isinstance(fill_value, float):
            dtype = torch.get_default_dtype()
        else:
            raise NoRule()
    return _factory(size, dtype=dtype, device=device, requires_grad=requires_grad, out=out)


def _as_device(device):
    if device is None:
        return torch.device("cpu")
    d = torch.device(device)
    if d.type == "cuda" and d.index is None:
        d = torch.device("cuda", torch.cuda.current_device())
    return d


def _arange(*args, dtype=None, device=None, requires_grad=False, layout=None, out=None,
            pin_memory=False):
    if out is not None or not args or len(args) > 3:
        raise NoRule()
    if not all(type(a) in (int, float) for a in args):
        raise NoRule()
    start, end, step = (0, args[0], 1) if len(args) == 1 else (args[0], args[1], args[2] if len(args) == 3 else 1)
    n = max(math.ceil((end - start) / step), 0)
    if dtype is None:
        dtype = torch.int64 if all(type(a) is int for a in args) else torch.get_default_dtype()
    return MetaInfo((n,), dtype, _as_device(device), requires_grad)


def _like_factory(x, *args, dtype=None, device=None, requires_grad=False, layout=None,
                  pin_memory=False, memory_format=None):
    if args:
        raise NoRule()
    return MetaInfo(x.shape, dtype or x.dtype, _as_device(device) if device is not None else x.device,
                    requires_grad)


def _full_like(x, fill_value, *, dtype=None, device=None, requires_grad=False, layout=None,
               pin_memory=False, memory_format=None):
    return _like_factory(x, dtype=dtype, device=device, requires_grad=requires_grad)


def _new_factory(x, *size, dtype=None, device=None, requires_grad=False, layout=None,
                 pin_memory=False):
    return MetaInfo(_sizes(size), dtype or x.dtype,
                    _as_device(device) if device is not None else x.device, requires_grad)


def _new_full(x, size, fill_value, *, dtype=None, device=None, requires_grad=False,
              layout=None, pin_memory=False):
    return _new_factory(x, size, dtype=dtype, device=device, requires_grad=requires_grad)


def _tri(x, diagonal=0):
    return _like(x)


def _cumsum(x, dim, *, dtype=None):
    _dim(dim, x.dim())
    out = dtype or (x.dtype if x.dtype.is_floating_point or x.dtype.is_complex else torch.int64)
    return MetaInfo(x.shape, out, x.device, _grad(x))


def _repeat(x, *sizes):
    sizes = _sizes(sizes)
    if len(sizes) < x.dim():
        raise RuntimeError("Number of dimensions of repeat dims can not be smaller than number "
                           "of dimensions of tensor")
    own = (1,) * (len(sizes) - x.dim()) + tuple(x.shape)
    return MetaInfo([a * b for a, b in zip(own, sizes)], x.dtype, x.device, _grad(x))
