"""MetaInfo: tensor metadata without a tensor, and the helpers metadata rules share
(broadcasting, type promotion, requires_grad). See meta.py for why."""
from __future__ import annotations

import math

import torch


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
            # torch's channels-last rules (and its error for other formats), answered by a
            # meta tensor of the same sizes and strides: the flags depend on nothing else
            return torch.empty_strided(self.shape, self._stride, dtype=self.dtype,
                                       device="meta").is_contiguous(memory_format=memory_format)
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


# -- helpers ---------------------------------------------------------------------------

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
    # Compares sizes pairwise instead of collecting them in a set: symbolic sizes (SymInt)
    # are not hashable, and each comparison is then one ShapeEnv decision (a symbol >= 2 is
    # never 1; two symbols that must broadcast are guarded equal), as in PyTorch's kernels.
    out = []
    for dims in _zip_right(shapes):
        size = 1
        for d in dims:
            if d == 1:
                continue
            if size == 1:
                size = d
            elif d != size:
                raise RuntimeError(f"The size of tensor a must match the size of tensor b "
                                   f"(shapes {[tuple(s) for s in shapes]})")
        out.append(size)
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
