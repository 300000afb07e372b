"""Tensor metadata without tensors: the fast path of static capture.

Capture needs each operation's result shape, dtype, device and requires_grad, not its
values. PyTorch's fake and meta tensors answer that for every operator, but the first use
in a process imports PyTorch's compiler packages (about 2.5 s on this machine), which
would dwarf compiling a small model. So capture first asks the rules here, written for the
operations common models use; an operation without a rule switches that capture to fake
tensors (``graph.py``), so coverage never depends on this table. A differential test
(tests/capture/test_meta_rules.py) checks every rule against real execution on the zoo.

``MetaInfo`` answers the tensor metadata API the interpreter and user code read
(``shape``, ``size()``, ``dim()``, ``stride()``, ``is_contiguous()``, ...).
"""
from __future__ import annotations

import math
import operator

import torch
import torch.nn.functional as F


class MetaInfo:
    __slots__ = ("shape", "dtype", "device", "requires_grad", "_stride")

    def __init__(self, shape, dtype, device, requires_grad=False, stride=None):
        self.shape = torch.Size(shape)
        self.dtype = dtype
        self.device = device
        self.requires_grad = requires_grad
        self._stride = tuple(stride) if stride is not None else contiguous_strides(self.shape)

    @staticmethod
    def of(t: torch.Tensor) -> "MetaInfo":
        return MetaInfo(t.shape, t.dtype, t.device, t.requires_grad, t.stride())

    def __repr__(self):
        return f"MetaInfo({tuple(self.shape)}, {self.dtype}, {self.device})"

    # -- the tensor metadata API -----------------------------------------------------
    ndim = property(lambda self: len(self.shape))
    is_cuda = property(lambda self: self.device.type == "cuda")
    is_cpu = property(lambda self: self.device.type == "cpu")
    is_meta = property(lambda self: False)
    is_sparse = is_quantized = is_mkldnn = is_nested = is_mps = is_xpu = is_meta
    layout = property(lambda self: torch.strided)
    is_leaf = property(lambda self: not self.requires_grad)

    def dim(self):
        return len(self.shape)

    ndimension = dim

    def size(self, d=None):
        return self.shape if d is None else self.shape[d]

    def stride(self, d=None):
        return self._stride if d is None else self._stride[d]

    def numel(self):
        return math.prod(self.shape)

    nelement = numel

    def is_contiguous(self, memory_format=torch.contiguous_format):
        if memory_format != torch.contiguous_format:
            raise NoRule()
        expected = 1
        for size, stride in zip(reversed(self.shape), reversed(self._stride)):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def is_floating_point(self):
        return self.dtype.is_floating_point

    def is_complex(self):
        return self.dtype.is_complex

    def is_signed(self):
        return self.dtype.is_signed

    def element_size(self):
        return self.dtype.itemsize

    def get_device(self):
        return -1 if self.device.type == "cpu" else self.device.index

    def storage_offset(self):
        raise NoRule()

    def is_inference(self):
        return False

    def has_names(self):
        return False

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d tensor")
        return self.shape[0]

    def type(self, dtype=None):
        if dtype is not None:
            raise NoRule()
        return torch.empty((), dtype=self.dtype).type()


class NoRule(Exception):
    """No metadata rule for this call: capture switches to fake tensors."""


def contiguous_strides(shape) -> tuple:
    strides, acc = [], 1
    for size in reversed(shape):
        strides.append(acc)
        acc *= max(size, 1)
    return tuple(reversed(strides))


def is_meta(v) -> bool:
    return isinstance(v, MetaInfo)


def infer(kind: str, target, args: tuple, kwargs: dict):
    """The result of ``target(*args, **kwargs)`` with MetaInfo in place of tensors."""
    if kind == "call_method":
        rule = METHOD_RULES.get(target)
        if rule is None:
            raise NoRule()
        return rule(*args, **kwargs)
    rule = FUNCTION_RULES.get(target)
    if rule is None:
        raise NoRule()
    return rule(*args, **kwargs)


# -- helpers ---------------------------------------------------------------------------

def _tensors(values):
    return [v for v in values if isinstance(v, (MetaInfo, torch.Tensor))]


def _grad(*values) -> bool:
    return torch.is_grad_enabled() and any(getattr(v, "requires_grad", False) for v in values
                                           if isinstance(v, (MetaInfo, torch.Tensor)))


def _proxy(v):
    """A stand-in for type promotion: zero-dim tensors promote like scalars."""
    if isinstance(v, (MetaInfo, torch.Tensor)):
        return torch.empty((1,) if v.dim() else (), dtype=v.dtype)
    if isinstance(v, (bool, int, float, complex)):
        return v
    raise NoRule()


def _promote(a, b) -> torch.dtype:
    return torch.result_type(_proxy(a), _proxy(b))


def _broadcast(*shapes) -> tuple:
    out = []
    for dims in _zip_right(shapes):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            raise RuntimeError(f"The size of tensor a must match the size of tensor b "
                               f"(shapes {[tuple(s) for s in shapes]})")
        out.append(sizes.pop() if sizes else 1)
    return tuple(out)


def _zip_right(shapes):
    n = max((len(s) for s in shapes), default=0)
    padded = [(1,) * (n - len(s)) + tuple(s) for s in shapes]
    return list(zip(*padded))


def _vgrad(x) -> bool:
    """A view shares its base's requires_grad, even when made under no_grad."""
    return bool(getattr(x, "requires_grad", False))


def _device(*values):
    for v in values:
        if isinstance(v, (MetaInfo, torch.Tensor)) and v.dim() > 0:
            return v.device
    for v in values:
        if isinstance(v, (MetaInfo, torch.Tensor)):
            return v.device
    return torch.device("cpu")


def _dim(d: int, ndim: int) -> int:
    n = max(ndim, 1)
    if not -n <= d < n:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-n}, {n - 1}], "
                         f"but got {d})")
    return d % n


def _sizes(args) -> tuple:
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        return tuple(args[0])
    return tuple(args)


def _float_dtype(dtype):
    return dtype if (dtype.is_floating_point or dtype.is_complex) else torch.get_default_dtype()


def _like(x, shape=None, dtype=None, grad=None, stride=None):
    return MetaInfo(x.shape if shape is None else shape, dtype or x.dtype, x.device,
                    _grad(x) if grad is None else grad, stride)


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


# -- the tables ----------------------------------------------------------------------------

_UNARY_SAME_NAMES = ["relu", "neg", "abs", "clone", "square", "floor", "ceil",
                     "round", "sign", "trunc", "frac", "hardtanh", "relu6", "leaky_relu",
                     "elu", "selu", "celu", "hardswish", "hardsigmoid", "bitwise_not",
                     "nan_to_num", "positive"]
_UNARY_FLOAT_NAMES = ["sigmoid", "tanh", "exp", "exp2", "expm1", "log", "log2", "log10",
                      "log1p", "sqrt", "rsqrt", "sin", "cos", "tan", "asin", "acos", "atan",
                      "sinh", "cosh", "erf", "erfc", "erfinv", "reciprocal", "gelu", "silu",
                      "mish", "softplus", "logsigmoid", "tanhshrink", "softsign", "lgamma",
                      "digamma"]
_BINARY = {"add": "arith", "sub": "arith", "mul": "arith", "div": "truediv",
           "true_divide": "truediv", "floor_divide": "arith", "remainder": "arith",
           "fmod": "arith", "pow": "arith", "maximum": "arith", "minimum": "arith",
           "atan2": "truediv", "bitwise_and": "arith", "bitwise_or": "arith",
           "bitwise_xor": "arith", "eq": "compare", "ne": "compare", "lt": "compare",
           "le": "compare", "gt": "compare", "ge": "compare", "logical_and": "compare",
           "logical_or": "compare", "logical_xor": "compare", "rsub": "arith"}
_OPERATORS = {operator.add: "arith", operator.sub: "arith", operator.mul: "arith",
              operator.truediv: "truediv", operator.floordiv: "arith", operator.mod: "arith",
              operator.pow: "arith", operator.and_: "arith", operator.or_: "arith",
              operator.xor: "arith", operator.lt: "compare", operator.le: "compare",
              operator.gt: "compare", operator.ge: "compare", operator.eq: "compare",
              operator.ne: "compare"}
_INPLACE_OPERATORS = [operator.iadd, operator.isub, operator.imul, operator.itruediv]

FUNCTION_RULES: dict = {}
METHOD_RULES: dict = {}


def _register():
    fr, mr = FUNCTION_RULES, METHOD_RULES
    for name in _UNARY_SAME_NAMES:
        rule = _unary_same
        for ns in (torch, F, torch.special):
            fn = getattr(ns, name, None)
            if fn is not None:
                fr[fn] = rule
        mr[name] = rule
        mr[name + "_"] = _inplace
    for name in _UNARY_FLOAT_NAMES:
        for ns in (torch, F, torch.special):
            fn = getattr(ns, name, None)
            if fn is not None:
                fr[fn] = _unary_float
        mr[name] = _unary_float
        mr[name + "_"] = _inplace
    fr[F.relu] = fr[torch.relu] = _unary_same
    fr[F.dropout] = fr[torch.dropout] = _dropout
    mr["contiguous"] = lambda x, *a, **k: x if x.is_contiguous() else _like(x)
    mr["detach"] = lambda x: _like(x, grad=False, stride=x.stride())
    for name, kind in _BINARY.items():
        fn = getattr(torch, name, None)
        if fn is not None:
            fr[fn] = _binary(kind)
        mr[name] = _binary(kind)
        mr[name + "_"] = _inplace
    for op, kind in _OPERATORS.items():
        fr[op] = _binary(kind)
    for op in _INPLACE_OPERATORS:
        fr[op] = _inplace_operator
    fr[operator.neg] = _unary_same
    fr[operator.matmul] = fr[torch.matmul] = mr["matmul"] = _matmul
    fr[torch.mm] = mr["mm"] = _mm
    fr[torch.bmm] = mr["bmm"] = _bmm
    fr[torch.addmm] = mr["addmm"] = _addmm
    fr[F.linear] = _linear
    fr[F.conv1d] = fr[torch.conv1d] = _conv(1)
    fr[F.conv2d] = fr[torch.conv2d] = _conv(2)
    fr[F.cross_entropy] = _cross_entropy
    fr[F.scaled_dot_product_attention] = _sdpa
    fr[F.layer_norm] = _layer_norm
    fr[F.embedding] = _embedding
    fr[F.batch_norm] = _batch_norm
    fr[F.group_norm] = _group_norm
    for fn in (F.softmax, F.log_softmax, torch.softmax, torch.log_softmax):
        fr[fn] = _softmax
    mr["softmax"] = mr["log_softmax"] = _softmax
    fr[torch.where] = mr["where"] = _where
    mr["masked_fill"] = _masked_fill
    mr["masked_fill_"] = lambda x, mask, value: _inplace(x, mask)
    fr[torch.masked_fill] = _masked_fill
    fr[torch.clamp] = mr["clamp"] = mr["clip"] = fr[torch.clip] = _clamp
    mr["clamp_"] = mr["clamp_min_"] = mr["clamp_max_"] = lambda x, *a, **k: x
    mr["clamp_min"] = mr["clamp_max"] = lambda x, v: _like(x)
    for name, kind in (("sum", "sum"), ("mean", "mean"), ("amax", "same"), ("amin", "same"),
                       ("prod", "sum"), ("var", "mean"), ("std", "mean"), ("any", "bool"),
                       ("all", "bool"), ("logsumexp", "mean")):
        fr[getattr(torch, name)] = mr[name] = _reduce(kind)
    fr[torch.max] = mr["max"] = _minmax_dispatch(torch.return_types.max)
    fr[torch.min] = mr["min"] = _minmax_dispatch(torch.return_types.min)
    fr[torch.argmax] = mr["argmax"] = fr[torch.argmin] = mr["argmin"] = _arg
    mr["view"] = _view_method
    fr[torch.reshape] = mr["reshape"] = _view
    fr[torch.permute] = mr["permute"] = _permute
    fr[torch.transpose] = mr["transpose"] = _transpose
    fr[torch.t] = mr["t"] = _t
    fr[torch.unsqueeze] = mr["unsqueeze"] = _unsqueeze
    fr[torch.squeeze] = mr["squeeze"] = _squeeze
    fr[torch.flatten] = mr["flatten"] = _flatten
    mr["expand"] = _expand
    mr["expand_as"] = lambda x, other: _expand(x, *other.shape)
    mr["view_as"] = lambda x, other: _view_method(x, *other.shape)
    mr["reshape_as"] = lambda x, other: _view(x, *other.shape)
    fr[torch.split] = mr["split"] = _split
    fr[torch.chunk] = mr["chunk"] = _chunk
    fr[torch.unbind] = mr["unbind"] = _unbind
    fr[torch.cat] = fr[torch.concat] = _cat
    fr[torch.stack] = _stack
    fr[operator.getitem] = mr["__getitem__"] = _getitem
    mr["to"] = _to
    mr["type_as"] = _type_as
    for name, dtype in (("float", torch.float32), ("double", torch.float64),
                        ("half", torch.float16), ("bfloat16", torch.bfloat16),
                        ("long", torch.int64), ("int", torch.int32), ("bool", torch.bool)):
        mr[name] = _as(dtype)
    for name in ("zeros", "ones", "empty", "rand", "randn"):
        fr[getattr(torch, name)] = _factory
        fr[getattr(torch, name + "_like")] = mr.setdefault(name + "_like", _like_factory)
        mr["new_" + name] = _new_factory
    fr[torch.full] = _full
    fr[torch.full_like] = _full_like
    mr["new_full"] = _new_full
    fr[torch.arange] = _arange
    fr[torch.tril] = fr[torch.triu] = mr["tril"] = mr["triu"] = _tri
    mr["tril_"] = mr["triu_"] = lambda x, *a: x
    fr[torch.cumsum] = mr["cumsum"] = _cumsum
    mr["repeat"] = _repeat
    for name in ("copy_", "fill_", "zero_", "normal_", "uniform_", "add_", "mul_", "sub_",
                 "div_", "masked_fill_"):
        mr.setdefault(name, _inplace)


def _inplace_operator(a, b):
    if not isinstance(a, (MetaInfo, torch.Tensor)):
        raise NoRule()
    return _inplace(a, b)


def _minmax_dispatch(result_type):
    def rule(x, *args, **kwargs):
        if args and isinstance(args[0], (MetaInfo, torch.Tensor)):
            return _binary("arith")(x, args[0])
        out = _minmax(x, *args, **kwargs)
        return result_type(out) if isinstance(out, tuple) else out
    return rule


_register()
