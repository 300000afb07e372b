"""The lowering machinery every lowering module shares: the registry, the lowering context
(making buffers, reductions and extern calls), and the pointwise/broadcast helpers.

A lowering receives the lowering context, the FX node (for traced metadata: the exact output
shape and dtype) and the node's arguments with tensors replaced by ``LoopValue`` values. It returns
a ``LoopValue`` (or a tuple of them). It raises ``Unlowerable`` for a case it does not handle; the
node then runs as an ATen fallback call, so a gap costs speed, never correctness.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from ..index import IndexExpr, contiguous_strides
from ..ops import OPS, UnknownOp, lookup
from ..ir import (CTYPES, Buffer, ComputedBuffer, ExternCall, LoweredGraph, Pointwise, Reduction, LoopValue,
                  Unlowerable)

aten = torch.ops.aten
prims = torch.ops.prims
LOWERINGS: dict = {}

# Matmuls with at most this many multiply-adds are generated as loops inside the kernel
# file; bigger ones call ATen (oneDNN/MKL). Why 2**17: an ATen mm call costs ~5 us of
# dispatch on this machine, about what our plain vectorised loop needs for ~130k MACs; above
# that the tuned library's blocking wins.
SMALL_MATMUL_MACS = 1 << 17
# The GPU runs an addmm up to LowerOptions.addmm_as_mm_macs multiply-adds as mm plus a bias
# add that fuses into the kernel after it. Why: at such sizes the GPU waits on the host, and
# ATen's addmm (cuBLASLt with a bias epilogue, its heuristic queried per call) costs ~22 µs
# of host time against mm's ~12 µs (H200 host, measured 2026-11-30); bigger ones keep the
# free epilogue. The CPU never does (0).


@dataclass
class LowerOptions:
    """The settings of one lowering, passed explicitly (``ctx.options``; C++ rendering reads
    the same object for its own size-driven choices)."""
    # Shape-generic graphs (backend/dynamic.py): the sizes seen are samples of a range, so
    # thresholds on work assume run-time sizes up to this many times bigger (a matmul that
    # grows past the library's break-even point is not inlined).
    dyn_scale: int = 1
    # ... and the choices made from magnitudes are recorded while lowering at the example
    # sizes and replayed at the other sizes, so every rendering makes the same choices.
    size_choices: "SizeChoices | None" = None
    addmm_as_mm_macs: int = 0
    # dtypes lowered beyond the C++ ones (ir.CTYPES): the GPU's bf16 and fp16
    extra_dtypes: frozenset = frozenset()
    # a channels-last 4-D value stored for several users keeps that layout (lowerings.py
    # _stored_strides; the GPU, whose scheduler fuses reads of it)
    channels_last_stores: bool = False
    # a value stored in a permuted layout is computed in memory order (LowerCtx.store; the
    # CPU at fixed sizes)
    memory_order_stores: bool = False
    # options={"freezing": True}, an inference graph at fixed sizes: the inputs (parameters
    # no graph writes) whose weight matrices a GEMM may read packed, where that is measured
    # faster (matmul.py _packed_linear; runtime/packed_weights.py)
    pack_weights: frozenset = frozenset()
    # a training forward (the CPU at fixed sizes): the positions of its outputs that are
    # saved values handed out in the layout the forward computes them in rather than eager's,
    # the backward then compiled for those layouts (lowerings._as_saved, autograd.py)
    own_layout_outputs: frozenset = frozenset()
    # a value the graph returns and also reads is stored where it is computed, and a value a
    # reshape of it was made memory for reads that memory (lowerings._outputs_read_inside,
    # _reshaped_source_reads_it; the CPU: not yet measured on a GPU)
    outputs_stored_once: bool = False
    # a reduction with fewer results than this over many values is split in two (the GPU's:
    # enough programs for its SMs; reductions.split_plan); 0: never
    split_reduction_results: int = 0
    # a depthwise convolution's weight and bias gradients computed as loops, its input
    # gradient alone asked of ATen (lower/depthwise.py; the C++ target at fixed sizes: a
    # shape-generic graph keeps ATen's whole backward)
    depthwise_weight_grad_loops: bool = False

    def admits(self, dt) -> bool:
        return dt in CTYPES or dt in self.extra_dtypes

    def size_choice(self, what: str, value: bool) -> bool:
        return value if self.size_choices is None else self.size_choices(what, value)


def probe(tv: LoopValue, prefix: str):
    """``(loads, idx)``: the buffer reads computing ``tv`` at a symbolic index ``idx`` (a
    variable ``{prefix}{d}`` for each non-unit dim d)."""
    from ..codegen.emit import Emitter
    from ..index import Var
    idx = [IndexExpr.of(Var(f"{prefix}{d}", s)) if s != 1 else IndexExpr() for d, s in enumerate(tv.sizes)]
    k = Emitter(probing=True)
    tv.load(k, idx)
    return k.loads, idx


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


# Pointwise ops that cost a CPU a polynomial of a dozen or more vector instructions per
# element: worth storing rather than recomputing where that is the choice
# (joint._recompute_pointwise, lowerings.BROADCAST_READS).
TRANSCENDENTAL = frozenset(getattr(aten, name) for name in (
    "erf", "erfc", "erfinv", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "tanh",
    "sigmoid", "sin", "cos", "tan", "asin", "acos", "atan", "atan2", "sinh", "cosh", "asinh",
    "acosh", "atanh", "lgamma", "digamma"))

# Ops that only view their first argument (new sizes and strides over the same memory).
VIEW_OPS = frozenset((aten.view.default, aten._unsafe_view.default, aten.reshape.default,
                      aten.unsqueeze.default, aten.squeeze.dim, aten.expand.default,
                      aten.permute.default, aten.transpose.int, aten.t.default, aten.slice.Tensor))

# The node meta key of a backward placeholder's traced metadata in eager's layout, where the
# forward hands the saved value out in another (autograd._adopt_saved_layouts).
EAGER_LAYOUT = "eager_traced_meta"

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


def _traced_meta(node):
    tm = node.meta.get("traced_meta")
    if tm is None:
        raise Unlowerable("no traced metadata")
    return tm


class LowerCtx:
    def __init__(self, options: LowerOptions | None = None):
        self.options = options or LowerOptions()
        self.g = LoweredGraph()
        self.n = 0
        # id(value) -> (value, its buffer-backed LoopValue): values made memory for an extern call.
        # lower_graph points later users of the same FX node at the buffer (see there).
        self.realized: dict = {}

    def name(self, prefix="buf"):
        self.n += 1
        return f"{prefix}{self.n}"

    # -- making memory ------------------------------------------------------------------
    def realize(self, tv: LoopValue, origin="", strides=None) -> LoopValue:
        """``tv`` as memory: contiguous, or in ``strides`` (computed in memory order where
        the target asks for it: ``store``)."""
        if tv.buffer is not None:
            return tv
        if strides is not None and self.options.memory_order_stores \
                and tuple(strides) != contiguous_strides(tv.sizes):
            out = self.store(tv, strides, origin)
            self.realized[id(tv)] = (tv, out)
            return out
        buf = ComputedBuffer(self.name(), tv.sizes, tuple(strides or contiguous_strides(tv.sizes)), 0,
                             tv.dtype, body=Pointwise(tv.load), origin=origin)
        self.g.steps.append(buf)
        out = LoopValue.of_buffer(buf)
        self.realized[id(tv)] = (tv, out)
        return out

    def store(self, tv: LoopValue, strides, origin="") -> LoopValue:
        """``tv`` as new memory laid out with ``strides``. Where those are a dense layout with
        the dims permuted (a transpose: a matmul's ``x.t()`` operand, a value saved for the
        backward in eager's permuted layout), the buffer is computed over its dims in memory
        order, the innermost loop storing consecutive elements, and read through a view with
        ``strides``. Why: in the logical order the innermost loop of a transposed store
        jumps a whole row per element, each store (and the loads feeding it) a cache miss:
        GPT-2's transposed GELU output for its c_proj weight gradient, 3072 x 64 with strides
        (1, 3072), took 6.7 ms a step, as long as eager's whole GELU forward and backward."""
        perm = memory_order(tv.sizes, strides) if self.options.memory_order_stores else None
        if perm is None:
            buf = ComputedBuffer(self.name(), tv.sizes, tuple(strides), 0, tv.dtype,
                                 body=Pointwise(tv.load), origin=origin)
            self.g.steps.append(buf)
            return LoopValue.of_buffer(buf)
        sizes = tuple(tv.sizes[d] for d in perm)

        def load_in_memory_order(k, idx):
            logical = [None] * len(perm)
            for i, d in enumerate(perm):
                logical[d] = idx[i]
            return tv.load(k, logical)
        buf = ComputedBuffer(self.name(), sizes, contiguous_strides(sizes), 0, tv.dtype,
                             body=Pointwise(load_in_memory_order), origin=origin,
                             view_layout=(tuple(tv.sizes), tuple(strides)))
        self.g.steps.append(buf)
        return LoopValue.view_of(buf, tv.sizes, strides, 0)

    def strided_or_realize(self, tv: LoopValue, origin="") -> LoopValue:
        return tv if tv.strided is not None else self.realize(tv, origin)

    def reduction(self, sizes, rsizes, rtype, fn, dtype, acc_dtype=None, origin="") -> LoopValue:
        buf = ComputedBuffer(self.name(), tuple(sizes), contiguous_strides(sizes), 0, dtype,
                             body=Reduction(tuple(rsizes), rtype, fn, acc_dtype or dtype),
                             origin=origin)
        self.g.steps.append(buf)
        return LoopValue.of_buffer(buf)

    def extern(self, node: fx.Node, args, kwargs, fallback: bool, op=None, arg_nodes=None,
               out_strides=None, keep_outputs=None):
        """Run ``node.target`` through ATen from the wrapper; tensor args become buffers.

        Why the traced strides: ATen picks output layouts from input layouts (attention's
        output follows its inputs' strides), and we index outputs with the strides seen at
        trace time, so each argument must have exactly the traced layout at run time.

        ``op`` / ``arg_nodes``: call another op than ``node.target`` (same output), whose
        tensor arguments are those FX nodes (addmm run as mm: its a and b).
        ``out_strides``: call with every tensor argument contiguous instead, the outputs then
        having these strides (measured: matmul.py's convolutions).
        ``keep_outputs``: the indices of a multi-output op's results used (the others are
        computed elsewhere: lower/depthwise.py asks convolution_backward for one of three).
        """
        def prep(a, meta):
            if isinstance(a, LoopValue):
                want = getattr(meta, "stride", None)
                offset = getattr(meta, "offset", 0)
                if out_strides is not None and want is not None:
                    want, offset = contiguous_strides(meta.shape), 0
                if a.strided is not None and (want is None or tuple(a.strided[1]) == tuple(want)
                                              and a.strided[2] == offset):
                    return a
                if a.strided is not None and a.strided[2] == offset and \
                        same_addresses(a.sizes, a.strided[1], want):
                    # The same elements at the same addresses; only the strides of size-1
                    # dims differ (a batch-1 view of a matmul's output handed to attention:
                    # lowering's view gives such a dim stride 0, ATen the next dim's
                    # extent). A view with the traced strides, not a copy: ATen may read a
                    # size-1 dim's stride when it picks its output's layout.
                    return LoopValue.view_of(a.strided[0], a.sizes, want, offset)
                if want is None:
                    return self.realize(a, f"input of {node.target}")
                # new memory in the traced strides, at offset 0 whatever the traced offset:
                # ATen picks output layouts from input strides, never from the offset
                out = self.store(a, want, f"input of {node.target}")
                self.realized[id(a)] = (a, out)
                return out
            if isinstance(a, (list, tuple)):
                ms = meta if isinstance(meta, (list, tuple)) and len(meta) == len(a) else [None] * len(a)
                return type(a)(prep(x, m) for x, m in zip(a, ms))
            return a
        def meta_of(n):
            # an ATen fallback gets a saved value in eager's layout, where the forward hands it
            # out in another (autograd._adopt_saved_layouts): its output layout follows its
            # inputs', and is indexed as traced
            return n.meta.get(EAGER_LAYOUT, n.meta.get("traced_meta")) if fallback else n.meta.get("traced_meta")
        arg_metas = fx.node.map_arg(tuple(arg_nodes) if arg_nodes is not None else node.args, meta_of)
        kw_metas = fx.node.map_arg(node.kwargs, meta_of)
        args = tuple(prep(a, m) for a, m in zip(args, arg_metas))
        kwargs = {k: prep(v, kw_metas.get(k)) for k, v in kwargs.items()}
        tm = node.meta.get("traced_meta")
        multi = tm is None
        if multi:
            outs_meta = _multi_metas(node)
        else:
            outs_meta = [tm]
        outs = []
        for i, m in enumerate(outs_meta):
            if m is None or keep_outputs is not None and i not in keep_outputs:
                outs.append(None)
                continue
            if out_strides is not None:
                outs.append(Buffer(self.name(), m.shape, tuple(out_strides[i]), 0, m.dtype))
                continue
            outs.append(Buffer(self.name(), m.shape, m.stride, 0, m.dtype, base_offset=m.offset))
        op = op or node.target
        name = str(op)
        call = ExternCall(name, op, args, kwargs, outs, fallback, multi)
        self.g.steps.append(call)
        (self.g.fallbacks if fallback else self.g.externs).append(name)
        tvs = [LoopValue.of_buffer(b) if b is not None else None for b in outs]
        return tuple(tvs) if multi else tvs[0]


def same_addresses(sizes, strides, other) -> bool:
    """Whether two layouts of ``sizes`` put every element at the same address: equal strides
    on every dim but those of size 1, whose stride is never multiplied by anything but 0."""
    if other is None or 0 in sizes:
        return False
    return all(n == 1 or int(a) == int(b) for n, a, b in zip(sizes, strides, other))


def memory_order(sizes, strides):
    """The dims of a dense layout ``strides`` from the largest stride to the smallest
    (size-1 dims, whose stride is never used, first), or None where the layout is not dense,
    has no elements, or is already in that order (contiguous)."""
    if 0 in sizes:
        return None
    perm = sorted(range(len(sizes)), key=lambda d: (sizes[d] != 1, -strides[d]))
    nonunit = [d for d in perm if sizes[d] != 1]
    if nonunit == sorted(nonunit):
        return None
    dense = contiguous_strides(tuple(sizes[d] for d in perm))
    if any(sizes[d] != 1 and strides[d] != s for d, s in zip(perm, dense)):
        return None
    return perm


def _multi_metas(node):
    n = 0
    by_index = {}
    for u in node.users:
        if u.op == "call_function" and u.target is operator.getitem:
            by_index[u.args[1]] = u.meta.get("traced_meta")
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


def bcast(tv: LoopValue, sizes):
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
                sub[d] = IndexExpr()
        return tv.load(k, sub)
    return load


def scalar_loader(v):
    def load(k, idx):
        return k.const(v)
    return load


def promote(*args):
    dummies = []
    for a in args:
        if isinstance(a, LoopValue):
            dummies.append(torch.empty([1] * len(a.sizes), dtype=a.dtype))
        elif isinstance(a, (bool, int, float)):
            dummies.append(a)
    return elementwise_dtypes(*dummies, type_promotion_kind=ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT)[1]


def pointwise(node, op, args, compute=None):
    """A pointwise op over ``args`` (values and Python scalars, broadcast to the node's
    shape and cast to ``compute``, default the node's dtype): ``op`` is a name of ops.OPS,
    or ``op(k, vals, dtype) -> ScalarExpr`` composing several (``composite``)."""
    tm = _traced_meta(node)
    sizes, odt = tm.shape, tm.dtype
    cdt = compute or odt
    loaders = [bcast(a, sizes) if isinstance(a, LoopValue) else scalar_loader(a) for a in args]
    cost = 1 + sum(a.cost for a in args if isinstance(a, LoopValue))
    body = _named(op, len(args)) if isinstance(op, str) else op

    def fn(k, idx):
        vals = [k.cast(l(k, idx), cdt) for l in loaders]
        return k.cast(body(k, vals, cdt), odt)
    return LoopValue(sizes, odt, fn, cost=cost)


def _named(name: str, arity: int):
    lookup(name)                   # an unknown name fails here, at lowering, not at render
    if OPS[name].arity != arity:
        raise UnknownOp(f"{name} takes {OPS[name].arity} arguments, got {arity}")

    def body(k, vals, dt):
        return k.op(name, vals, dt)
    return body


def square(k, v, dt):
    return k.op("mul", [v, v], dt)


def identity(k, vals, dt):
    """The composite of a cast or copy: the (cast) argument itself."""
    return vals[0]
