"""The loop-level IR: buffers, pointwise and reduction bodies, extern (ATen) calls.

A lowered value (``LoopValue``) is a *function from an index to a scalar*: ``tv.load(k, idx)``
emits C++ for one element through the kernel emitter ``k``. Views only change the index
function, so they cost nothing; pointwise ops compose loaders, so chains fuse by
construction. A value becomes memory (a ``Buffer``) only when it must: a reduction result,
a graph output, an extern's argument, or a value read by many consumers. Bodies are closures
over the emitter, so the same body can be probed (which buffers does it read, at which
index?) by the scheduler and rendered by codegen.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .index import IndexExpr, flat_index

# dtype -> C type: the dtypes C++ kernels compute with (a target may admit more to its own
# lowering: LowerOptions.extra_dtypes, the GPU's bf16/fp16).
CTYPES = {
    torch.float32: "float", torch.float64: "double", torch.int64: "int64_t",
    torch.int32: "int32_t", torch.int16: "int16_t", torch.int8: "int8_t",
    torch.uint8: "uint8_t", torch.bool: "bool",
}


@dataclass(frozen=True)
class IndexCheck:
    """How an op that reads indices from a tensor treats them, as eager does: whether a
    negative index counts from the end, and the error eager raises for one out of range
    (the kernel flags it, the wrapper raises this). Messages hold no sizes: shape-generic
    wrappers (dynamic.py) must read the same at every size."""
    wrap_negative: bool
    error: str                 # "IndexError" | "RuntimeError"
    message: str


# A C++ segment returns its failed checks as bits of an ``int``: bit n for its n-th check,
# the 31st and later sharing the last bit.
ERR_BITS = 31


def failed_check(err: int, checks: tuple):
    """The check a segment's returned ``err`` names: the lowest bit set, i.e. the one emitted
    first, as eager raises the first failing op's error. ``checks``: (error, message) pairs.
    None where the bit is shared by checks that raise different errors."""
    bit = (err & -err).bit_length() - 1
    if bit < ERR_BITS - 1:
        return checks[bit] if bit < len(checks) else None
    errors = {error for error, _ in checks[bit:]}
    return checks[bit] if len(errors) == 1 else None


class Unlowerable(Exception):
    """This op cannot become loop IR here; the caller runs it as an ATen call instead."""


@dataclass(eq=False)
class Buffer:
    name: str
    sizes: tuple
    strides: tuple
    offset: int
    dtype: torch.dtype
    # where its memory comes from: "input" (graph argument), "const", "py" (allocated by the
    # Python wrapper), "internal" (the C++ arena), "local" (a scalar in a register), "alias"
    # (writes straight into an input: a mutation copy-back). Decided by the scheduler.
    kind: str = "py"
    input_index: int = -1
    # storage offset of the real tensor behind an input/extern buffer. Indexing uses offset
    # 0 because data_ptr() already points at the tensor's first element.
    base_offset: int = 0

    @property
    def numel(self):
        n = 1
        for s in self.sizes:
            n *= s
        return n

    def index(self, idx) -> IndexExpr:
        return flat_index(idx, self.strides, self.offset)

    @property
    def cname(self):
        """The C++ pointer this buffer is addressed through."""
        return self.name

    def __repr__(self):
        return self.name


@dataclass(eq=False)
class Pointwise:
    fn: object                      # fn(k, idx) -> ScalarExpr


@dataclass(eq=False)
class Reduction:
    rsizes: tuple
    rtype: str                      # sum | prod | max | min | argmax | argmin
    fn: object                      # fn(k, idx, ridx) -> ScalarExpr
    acc_dtype: torch.dtype


@dataclass(eq=False)
class ComputedBuffer(Buffer):
    body: object = None             # Pointwise | Reduction
    origin: str = ""                # the ATen op it came from (for reports)
    target: "Buffer" = None         # for copy-backs: the input written
    # for copy-backs: the buffer they copy element for element (the pass write_in_place may
    # then compute it straight into the input, or have its extern write the input), else None
    source: "Buffer" = None
    # (sizes, strides): a value stored in a permuted layout, computed over its dims in memory
    # order (``sizes``/``strides`` above: that order, contiguous) and read through this view
    # of the same memory, which is also how the wrapper allocates it (LowerCtx.store)
    view_layout: tuple = None

    @property
    def cname(self):
        return self.target.name if self.target is not None else self.name

    @property
    def is_reduction(self):
        return isinstance(self.body, Reduction)


@dataclass(eq=False)
class ExternCall:
    """A call into ATen from the wrapper: a tuned library op (``extern``) or a fallback."""
    name: str
    op: object
    args: tuple
    kwargs: dict
    outputs: list                   # Buffers (from traced metadata), or None entries
    fallback: bool                  # True: an op the IR does not cover
    multi: bool = False             # the op returns a tuple


@dataclass(frozen=True)
class PackedWeight:
    """An extern's argument: graph input ``input_index`` (a parameter's weight matrix, N x K
    as nn.Linear stores it, or K x N: ``stored_kn``) packed for MKL's GEMM at ``rows`` rows,
    by a cache the wrapper calls on every call (runtime/packed_weights.py: packed once,
    again when the weight changes)."""
    input_index: int
    rows: int
    stored_kn: bool = False


class LoopValue:
    """A lowered tensor value: sizes, dtype and a loader; maybe backed by a buffer."""
    __slots__ = ("sizes", "dtype", "load", "strided", "cost")

    def __init__(self, sizes, dtype, load, strided=None, cost=1):
        self.sizes = tuple(int(s) for s in sizes)
        self.dtype = dtype
        self.load = load
        # (buffer, strides, offset) when this value is a zero-copy strided view of a buffer
        self.strided = strided
        self.cost = cost

    @staticmethod
    def of_buffer(buf: Buffer) -> "LoopValue":
        return LoopValue.view_of(buf, buf.sizes, buf.strides, buf.offset)

    @staticmethod
    def view_of(buf: Buffer, sizes, strides, offset) -> "LoopValue":
        strides = tuple(strides)

        def load(k, idx):
            return k.load(buf, flat_index(idx, strides, offset))
        return LoopValue(sizes, buf.dtype, load, (buf, strides, offset), 0)

    @property
    def numel(self):
        n = 1
        for s in self.sizes:
            n *= s
        return n

    @property
    def buffer(self):
        """The buffer when this value is exactly that buffer (same layout)."""
        if self.strided is None:
            return None
        b, st, off = self.strided
        if tuple(b.sizes) == self.sizes and tuple(b.strides) == st and b.offset == off:
            return b
        return None

    @property
    def storage_buffer(self):
        """The buffer when this value is all of its memory in the layout it is allocated in:
        the buffer itself, or the view a buffer computed in memory order is read through."""
        b = self.buffer
        if b is None and self.strided is not None:
            b, st, off = self.strided
            if getattr(b, "view_layout", None) != (tuple(self.sizes), tuple(st)) or off != 0:
                return None
        return b


class ScalarExpr:
    """A C++ scalar expression (usually a temporary's name) and its dtype."""
    __slots__ = ("expr", "dtype")

    def __init__(self, expr: str, dtype):
        self.expr, self.dtype = expr, dtype

    def __repr__(self):
        return self.expr


@dataclass
class LoweredGraph:
    """Everything codegen needs: buffers in creation order, externs, inputs and outputs."""
    steps: list = field(default_factory=list)      # ComputedBuffer | ExternCall, topological
    inputs: list = field(default_factory=list)     # Buffer per graph input (None: non-tensor)
    outputs: list = field(default_factory=list)    # LoopValue | python value
    copy_backs: list = field(default_factory=list)  # ComputedBuffer(kind="alias")
    constants: dict = field(default_factory=dict)  # name -> tensor
    fallbacks: list = field(default_factory=list)  # op names run as ATen fallbacks
    externs: list = field(default_factory=list)    # op names run as extern library calls
    notes: list = field(default_factory=list)
