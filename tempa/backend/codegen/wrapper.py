"""Render the Python wrapper: the per-call code that allocates, calls kernels and externs.

The wrapper is source text exec'd once, so a call does no graph walking: it is a straight
line of ``torch.empty`` calls, one ctypes call per C++ segment, ATen calls for externs, and
the return. Outputs are allocated fresh on every call, so two threads can call at once.
"""
from __future__ import annotations

import re

import torch

from ..ir import Buffer, ComputedBuffer, ExternCall, LoopValue, PackedWeight
from ..schedule import Schedule

_DTYPE_NAMES = {dt: str(dt).replace("torch.", "") for dt in [
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]}


class WrapperGen:
    def __init__(self, num_inputs: int):
        self.lines: list[str] = []
        self.consts: list = []          # objects the source cannot spell
        self.defined: set = set()
        self.num_inputs = num_inputs
        self.serializable = True
        self.ops: dict = {}             # op -> local name bound once in make()
        self.reshaped: dict = {}        # buffer -> the shape it is allocated with
        self.packed: dict = {}          # PackedWeight -> its cache's local name in make()

    def const(self, v) -> str:
        """A Python expression for a constant argument."""
        if v is None or isinstance(v, (bool, int, str)):
            return repr(v)
        if isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                return f"float({str(v)!r})"
            return repr(v)
        if isinstance(v, torch.dtype) and v in _DTYPE_NAMES:
            return f"torch.{_DTYPE_NAMES[v]}"
        if isinstance(v, torch.device):
            return f"torch.device({str(v)!r})"
        if isinstance(v, torch.memory_format):
            return f"torch.{str(v).replace('torch.', '')}"
        if isinstance(v, torch.layout):
            return f"torch.{str(v).replace('torch.', '')}"
        if isinstance(v, (list, tuple)):
            inner = ", ".join(self.const(x) for x in v)
            return f"[{inner}]" if isinstance(v, list) else f"({inner}{',' if len(v) == 1 else ''})"
        self.serializable = False
        self.consts.append(v)
        return f"_K[{len(self.consts) - 1}]"

    def tensor(self, tv) -> str:
        if isinstance(tv, (list, tuple)):
            inner = ", ".join(self.tensor(x) for x in tv)
            return f"[{inner}]" if isinstance(tv, list) else f"({inner}{',' if len(tv) == 1 else ''})"
        if isinstance(tv, PackedWeight):
            return self.packed_weight(tv)
        if not isinstance(tv, LoopValue):
            return self.const(tv)
        b, st, off = tv.strided
        name = self.bufname(b)
        shape = self.reshaped.get(b)
        if shape is not None and off == 0 and st == _contig(tv.sizes):
            # allocated in an output's shape (reshape_outputs_at_allocation): the same memory
            # in another shape (the GEMM argument a saved output shares) is a view of it
            return name if tuple(tv.sizes) == tuple(shape) else f"{name}.view({list(tv.sizes)})"
        view = getattr(b, "view_layout", None)
        if tv.storage_buffer is not None and shape is None and (
                view is None or off == 0 and (tuple(tv.sizes), tuple(st)) == (tuple(view[0]), tuple(view[1]))):
            # (a buffer computed in memory order is allocated as its view: the buffer in its
            # own layout is then another view of that memory, below)
            return name
        if b.kind == "input" and off == 0 and len(tv.sizes) == 2 and len(b.sizes) == 2 \
                and tuple(tv.sizes) == tuple(b.sizes)[::-1] and tuple(st) == tuple(b.strides)[::-1]:
            # an input matrix's transpose (a Linear weight handed to a GEMM): ``t()`` is one
            # cheap view call where as_strided parses three lists (0.8 vs 1.2 µs here, ~4 µs
            # on the H100's host; a Llama decode step made 226 of them). Inputs only: the
            # tensor a wrapper allocates for a buffer may be its view (view_layout, reshaped)
            return f"{name}.t()"
        if b.base_offset or b.kind == "input":   # as_strided takes an absolute storage offset
            return f"_as_strided({name}, {list(tv.sizes)}, {list(st)}, {name}.storage_offset() + {off})"
        return f"_as_strided({name}, {list(tv.sizes)}, {list(st)}, {off})"

    def packed_weight(self, pw: PackedWeight) -> str:
        """``_pw0(a3)``: a call of the packed-weight cache of ``pw`` (one per weight and row
        count), bound once in make() from the consts, where instantiate puts a runtime cache
        in place of the marker."""
        if pw not in self.packed:
            self.packed[pw] = f"_pw{len(self.packed)}"
            self.ops[self.const(pw)] = self.packed[pw]
        return f"{self.packed[pw]}(a{pw.input_index})"

    def bufname(self, b: Buffer) -> str:
        if b.kind == "input":
            return f"a{b.input_index}"
        if b.kind == "const":
            return f"_C[{b.name!r}]"
        return b.name


def alloc_layout(b, alloc_shape: dict):
    """(shape, strides) a wrapper allocates buffer ``b`` with: its own layout, or for a
    contiguous buffer the shape ``reshape_outputs_at_allocation`` chose."""
    if getattr(b, "view_layout", None) is not None:
        return b.view_layout
    if tuple(b.strides) != _contig(b.sizes):
        return tuple(b.sizes), tuple(b.strides)
    shape = tuple(alloc_shape.get(b, b.sizes))
    return shape, _contig(shape)


def reshape_outputs_at_allocation(lowered, w) -> dict:
    """A graph output that is a contiguous reshape of a whole wrapper-allocated buffer: allocate
    the buffer in the output's shape (same memory layout) and skip an as_strided per call.
    Returns buffer -> the shape to allocate it in (shared by the C++ and GPU wrappers)."""
    alloc_shape = {}
    for i, v in enumerate(lowered.outputs):
        if isinstance(v, LoopValue) and v.strided is not None and v.buffer is None:
            b, st, off = v.strided
            if isinstance(b, ComputedBuffer) and off == 0 and v.numel == b.numel and b not in alloc_shape \
                    and b.view_layout is None \
                    and st == _contig(v.sizes) and b.strides == _contig(b.sizes):
                alloc_shape[b] = v.sizes
                lowered.outputs[i] = LoopValue.view_of(b, v.sizes, st, 0)
                w.reshaped[b] = v.sizes
    return alloc_shape


def render_wrapper(sched: Schedule, lowered, seg_codes: dict, num_inputs: int, nsizes: int = 0):
    """Returns (source, consts, serializable). ``seg_codes``: segment index -> SegmentCode.

    ``nsizes`` > 0 (shape-generic code): each segment call also passes ``ds0, ds1, ...``,
    which backend/dynamic.py defines at the top of ``call`` from the inputs' shapes."""
    w = WrapperGen(num_inputs)
    L = w.lines
    args = ", ".join(f"a{i}" for i in range(num_inputs))
    L.append(f"    def call({args}):")
    allocated = set()
    alloc_shape = reshape_outputs_at_allocation(lowered, w)
    for si, seg in enumerate(sched.segments):
        if isinstance(seg, ExternCall):
            grad_mode = _needs_grad_mode(seg)
            call_args = ", ".join([_detached(w.tensor(a), a) if grad_mode else w.tensor(a) for a in seg.args] +
                                  [f"{k}={w.tensor(v)}" for k, v in seg.kwargs.items()])
            opname = _opname(seg.op, w)
            outs = [b for b in seg.outputs]
            allocated.update(b for b in seg.outputs if b is not None)
            if seg.multi:
                if grad_mode:
                    L.append("    with torch.enable_grad():")
                L.append(f"    {'    ' if grad_mode else ''}_r = {opname}({call_args})")
                for i, b in enumerate(outs):
                    if b is not None:
                        L.append(f"    {b.name} = _r[{i}]")
                if nsizes or any(b is not None and _may_be_large(b) for b in outs):
                    L.append("    del _r")    # its outputs are released at their last use
            else:
                L.append(f"    {outs[0].name} = {opname}({call_args})")
            continue
        code = seg_codes[si]
        for b in code.params:
            if b.kind == "py" and b not in allocated:
                allocated.add(b)
                # empty_strided, also for contiguous buffers: its argument parsing is ~0.7 µs
                # cheaper a call than torch.empty(shape, dtype=...) (measured, torch 2.13)
                shape, strides = alloc_layout(b, alloc_shape)
                L.append(f"    {b.name} = _empty_strided({shape!r}, {strides!r}, "
                         f"dtype=torch.{_DTYPE_NAMES[b.dtype]})")
        ptrs = []
        for b in code.params:
            if b.kind == "const":
                ptrs.append(f"_P[{b.name!r}]")
            else:
                ptrs.append(f"{w.bufname(b)}.data_ptr()")
        ptrs += [f"ds{i}" for i in range(nsizes)]
        # a nonzero result: an index was out of range; code i is the segment's i-th check
        checks = tuple((c.error, c.message) for c in code.checks)
        L.append(f"    if (_e := _S{si}({', '.join(ptrs)})): _index_error(_e, {checks!r})")
        for g in seg:
            for m in g.members:
                if m.kind == "alias" and getattr(m.target, "kind", None) == "py":
                    # computed over a buffer that died in this kernel (reuse_dead_buffers)
                    L.append(f"    {m.name} = {m.target.name}")
                    allocated.add(m)
    outs = []
    for v in lowered.outputs:
        outs.append(w.tensor(v))
    L.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    L[1:] = release_after_last_use(L[1:], _released_buffers(sched, every=nsizes > 0))
    L[1:] = ["    " + x for x in L[1:]]
    head = ["import torch", "",
            "def make(_S, _C, _P, _K, _empty_strided, _as_strided, _index_error):"]
    head += [f"    _S{si} = _S[{si}]" for si, seg in enumerate(sched.segments) if not isinstance(seg, ExternCall)]
    head += [f"    {name} = {expr}" for expr, name in w.ops.items()]
    return "\n".join(head + L + ["    return call"]) + "\n", w.consts, w.serializable


# A buffer of at least this many bytes is released right after its last use in a call.
# Why: held until the call returned, every intermediate of a BERT-base forward (b2 T128,
# ~50 MB) was live at once; freeing them all at the return left glibc's heap with a free
# top larger than its trim threshold, which it handed back to the kernel, so the next call
# page-faulted ~7 MB of fresh memory (1875 faults a call; eager and Inductor, which free
# at last use: none), and each GEMM's output was cold. Smaller buffers are not worth a
# ``del`` statement (~15 ns a call each) on the small graphs whose calls take microseconds.
RELEASE_BYTES = 1 << 16


def _released_buffers(sched, every: bool) -> set:
    """Names of the buffers the wrapper binds (its allocations, the names it gives buffers
    written over a dying one, extern results) whose memory may be RELEASE_BYTES or more;
    ``every``: all of them (shape-generic code, rendered at sample sizes whose texts must
    agree, backend/dynamic.py)."""
    bound = [b for seg in sched.segments if isinstance(seg, ExternCall) for b in seg.outputs]
    bound += [m for seg in sched.segments if not isinstance(seg, ExternCall)
              for g in seg for m in g.members if m.kind in ("py", "alias")]
    return {b.name for b in bound if b is not None and b.kind != "input" and (every or _may_be_large(b))}


def _may_be_large(b) -> bool:
    """Whether ``b`` may hold RELEASE_BYTES or more (a size not known until the call: yes)."""
    n = 1
    for size in b.sizes:
        if not isinstance(size, int):
            return True
        n *= size
    return n * b.dtype.itemsize >= RELEASE_BYTES


def release_after_last_use(lines: list, names: set) -> list:
    """``lines`` (a call's straight-line body, one statement per line, the return last) with
    ``del name`` after the last line that mentions each of ``names`` before the return:
    Python then frees the tensor there (unless a view of it lives on), as eager frees an
    intermediate when its last user has run. Mentions are found as identifiers in the text
    Python runs, so a name is never deleted before a line that reads it."""
    last = {}
    for i, line in enumerate(lines[:-1]):
        for ident in _IDENT.findall(line):
            if ident in names:
                last[ident] = i
    returned = set(_IDENT.findall(lines[-1]))
    after: dict = {}
    for name, i in last.items():
        if name not in returned:
            after.setdefault(i, []).append(name)
    out = []
    for i, line in enumerate(lines):
        out.append(line)
        if i in after:
            out.append(f"    del {', '.join(after[i])}")
    return out


_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _contig(sizes):
    from ..index import contiguous_strides
    return tuple(contiguous_strides(sizes))


# Extern ops whose public torch function has the same signature: its hand-written argument
# parser is 3-35 µs faster a call than the generic boxed ``OpOverload`` path (measured on
# this machine: convolution 158 -> 123 µs on a small conv, addmm 40 -> 33 µs).
_FAST = {"aten::convolution": "torch.convolution", "aten::mm": "torch.mm", "aten::addmm": "torch.addmm",
         "aten::bmm": "torch.bmm", "aten::baddbmm": "torch.baddbmm"}


# ATen ops whose outputs depend on grad mode, not only on their arguments: oneDNN's RNN
# layer (an LSTM on the CPU) returns the workspace its backward reads only while grad mode
# is on, even with train=True. A training graph's forward runs with grad mode off (inside
# the autograd node), so such a call runs under enable_grad, on detached arguments (no
# autograd graph is built), where it was traced with train=True.
_GRAD_MODE_OUTPUTS = {"aten::mkldnn_rnn_layer": 15}   # op -> index of its ``train`` argument


def _needs_grad_mode(seg) -> bool:
    train = _GRAD_MODE_OUTPUTS.get(getattr(getattr(seg.op, "_schema", None), "name", None))
    return train is not None and seg.multi and len(seg.args) > train and seg.args[train] is True


def _detached(expr: str, arg) -> str:
    return f"{expr}.detach()" if isinstance(arg, LoopValue) else expr


def _opname(op, w: WrapperGen) -> str:
    if isinstance(op, torch._ops.OpOverload) and op._overloadname == "default" and op._schema.name in _FAST:
        expr = _FAST[op._schema.name]
        if expr not in w.ops:
            w.ops[expr] = f"_o{len(w.ops)}"
        return w.ops[expr]
    if isinstance(op, torch._ops.OpOverload):
        # bound once: the C++ callable behind the OpOverload (skips its Python __call__)
        expr = f"torch.ops.{op.namespace}.{op._opname}.{op._overloadname}._op"
        if expr not in w.ops:
            w.ops[expr] = f"_o{len(w.ops)}"
        return w.ops[expr]
    w.serializable = False
    w.consts.append(op)
    return f"_K[{len(w.consts) - 1}]"
