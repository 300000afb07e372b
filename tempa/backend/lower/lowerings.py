"""ATen FX graph -> loop IR: ``lower_graph`` walks the graph and calls one registered lowering
per ATen op. The lowerings live by concept:

  core.py        the registry, the lowering context, pointwise/broadcast helpers
  pointwise.py   unary/binary/compare ops, casts, constant factories
  views.py       views (free: index remaps), cat/pad/scatter, embedding/gather/index
  reductions.py  sum, mean, max, arg-max, var, ...
  matmul.py      small matmuls as loops, big ones and convolution/attention as externs

An op without a lowering (or whose lowering raises ``Unlowerable``) runs as an ATen fallback
call: a gap costs speed, never correctness.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..index import contiguous_strides
from ..ir import Buffer, ComputedBuffer, LoweredGraph, Pointwise, LoopValue, Unlowerable
from . import pointwise, reductions, views  # importing them registers their lowerings
from .core import (INLINE_COST, LOWERINGS, SMALL_MATMUL_MACS, TRANSCENDENTAL, VIEW_OPS, LowerCtx,
                   LowerOptions, SizeChoices, literal, probe, register, same_addresses)
from .embedding_grad import add_rows_in_place
from .matmul import EXTERN_OPS, lower_extern
from .layout import is_channels_last
from .trace import HANDED_OUT_AS_INPUT

aten = torch.ops.aten

# what other packages use from here (the lowerings themselves live in the modules above)
__all__ = ["lower_graph", "LOWERINGS", "register", "literal", "LowerOptions", "SizeChoices",
           "SMALL_MATMUL_MACS", "INLINE_COST", "EXTERN_OPS",
           "pointwise", "reductions", "views"]


def lower_graph(gm: fx.GraphModule, num_outputs: int, mutated: list, shared_reads=None,
                options: LowerOptions | None = None) -> LoweredGraph:
    """Lower a functional ATen graph whose outputs are (user outputs..., new values of the
    inputs in ``mutated``..., [saved tensors...]).

    ``shared_reads`` (the GPU: 3): a value with several users that reads this many buffers
    is stored once instead of recomputed by each user. Why: a transformer's residual stream
    is a chain of adds, each cheap, so the cost rule alone inlines it for several layers and
    layer i's kernels re-read all i earlier sublayer outputs: extra memory traffic on every
    layer, and no two layers' kernels alike (each is compiled by Triton on its own).
    ``options``: the size-driven settings (lower/core.py LowerOptions)."""
    ctx = LowerCtx(options)
    g = ctx.g
    env: dict = {}
    stored_anyway = _outputs_read_inside(gm, num_outputs, mutated) if ctx.options.outputs_stored_once else set()
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, n in enumerate(phs):
        tm = n.meta.get("traced_meta")
        if tm is None:
            env[n] = n.meta.get("value")
            g.inputs.append(None)
            continue
        b = Buffer(f"in{i}", tm.shape, tm.stride, 0, tm.dtype, kind="input", input_index=i,
                   base_offset=tm.offset)
        g.inputs.append(b)
        env[n] = LoopValue.of_buffer(b)
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            t = getattr(gm, n.target)
            b = Buffer(n.target, tuple(t.shape), tuple(t.stride()), 0, t.dtype, kind="const",
                       base_offset=t.storage_offset())
            g.constants[n.target] = t
            env[n] = LoopValue.of_buffer(b)
        elif n.op == "call_function":
            args = fx.node.map_arg(n.args, lambda a: env[a])
            kwargs = fx.node.map_arg(n.kwargs, lambda a: env[a])
            if n.target is operator.getitem:
                env[n] = args[0][args[1]]
                continue
            env[n] = _lower_node(ctx, n, args, kwargs)
            if ctx.realized:
                # An argument made memory for this (extern) call: later users of that node
                # read the buffer instead of recomputing it (a backward's dY feeds two mms,
                # dY @ W and dY.t() @ X; the transpose is then a free strided view). Users
                # lowered earlier keep their own copy of the expression: still correct.
                for a in n.all_input_nodes:
                    hit = ctx.realized.get(id(env.get(a)))
                    if hit is not None and hit[0] is env[a]:
                        env[a] = hit[1]
                        if ctx.options.outputs_stored_once:
                            _reshaped_source_reads_it(env, a, hit[1])
                ctx.realized.clear()
            v = env[n]
            users = _consumers(n)
            if isinstance(v, LoopValue) and v.cost > INLINE_COST and (users > 1 or v.cost > 4 * INLINE_COST):
                env[n] = ctx.realize(v, str(n.target), _stored_strides(ctx, n))
            elif (shared_reads and isinstance(v, LoopValue) and v.strided is None
                  and v.cost > 1 and users > 1 and _buffers_read(v) >= shared_reads):
                env[n] = ctx.realize(v, str(n.target), _stored_strides(ctx, n))
            elif n in stored_anyway and isinstance(v, LoopValue) and v.strided is None and v.cost > 0:
                env[n] = ctx.realize(v, "output")
            elif ctx.options.outputs_stored_once and isinstance(v, LoopValue) and v.strided is None \
                    and v.dtype.is_floating_point and _read_broadcast(n) and _transcendental_inside(n, env):
                env[n] = ctx.realize(v, str(n.target), _stored_strides(ctx, n))
        elif n.op == "output":
            outs = list(n.args[0])
            vals = [env[o] if isinstance(o, fx.Node) else o for o in outs]
            # Outputs must be memory the wrapper can hand out, in the layout seen at trace
            # time: a backward graph indexes its saved inputs with the traced strides.
            own = ctx.options.own_layout_outputs
            handed = {u.strided[0] for u in vals[:num_outputs]
                      if isinstance(u, LoopValue) and u.strided is not None} if own else set()
            vals = [_as_saved(ctx, v, handed) if i in own else
                    _as_traced(ctx, v, o.meta.get("traced_meta"), o.meta.get(HANDED_OUT_AS_INPUT, False))
                    if isinstance(o, fx.Node) else _as_traced(ctx, v, None)
                    for i, (v, o) in enumerate(zip(vals, outs))]
            g.outputs = vals[:num_outputs] + vals[num_outputs + len(mutated):]
            for inp, v in zip(mutated, vals[num_outputs:num_outputs + len(mutated)]):
                dst = g.inputs[inp]
                src = v if isinstance(v, LoopValue) else None
                if src is None:
                    raise Unlowerable("non-tensor mutation")
                if _reads_other_elements(src, dst):
                    src = ctx.realize(src, "mutation source")
                cb = ComputedBuffer(ctx.name("copyback"), dst.sizes, dst.strides, dst.offset, dst.dtype,
                                    kind="alias", body=Pointwise(src.load),
                                    origin="copy-back", target=dst)
                cb.input_index = inp
                cb.source = _copied_buffer(src)
                g.copy_backs.append(cb)
    return g


# A value whose consumers read it this many times over (a broadcast: RoPE's cos and sin,
# (tokens, head_dim), read by every head of q and k in every layer) is stored once where its
# expression holds a transcendental op, rather than recomputed at every read. Why: Mistral's
# inference recomputed cos and sin per element of q and k, 16 heads x 6 layers of them: 1.6 ms
# of each layer's 40.
BROADCAST_READS = 4


def _read_broadcast(n) -> bool:
    """Whether ``n``'s consumers (through views) iterate over at least BROADCAST_READS times
    its elements."""
    own = _numel(n)
    if not own:
        return False
    reads, stack, seen = 0, list(n.users), set()
    while stack:
        u = stack.pop()
        if u in seen or u.op != "call_function":
            continue
        seen.add(u)
        if u.target in VIEW_OPS:
            stack.extend(u.users)
            continue
        reads += max(_numel(u) or own, own)
    return reads >= BROADCAST_READS * own


def _numel(n):
    tm = n.meta.get("traced_meta") if isinstance(n, fx.Node) else None
    if tm is None or not hasattr(tm, "shape"):
        return 0
    count = 1
    for d in tm.shape:
        count *= int(d)
    return count


def _transcendental_inside(n, env) -> bool:
    """Whether the expression ``n`` lowered to computes a transcendental op (down to the values
    already in memory)."""
    stack, seen = [n], set()
    while stack:
        x = stack.pop()
        if x in seen or not isinstance(x, fx.Node) or x.op != "call_function":
            continue
        seen.add(x)
        if getattr(x.target, "overloadpacket", None) in TRANSCENDENTAL:
            return True
        v = env.get(x)
        if x is not n and isinstance(v, LoopValue) and v.strided is not None:
            continue
        stack.extend(x.all_input_nodes)
    return False


def _outputs_read_inside(gm, num_outputs, mutated) -> set:
    """The graph's outputs (user outputs, saved values) that its own nodes read too, in eager's
    contiguous layout: stored where they are computed, and read from there. Why: such a value
    left as an expression was computed in each reader and once more for the output, at the
    graph's end: DistilBERT's training forward recomputed each residual sum its LayerNorm
    reads, only to save it, 12 extra passes over (tokens, d). Not the new values of mutated
    inputs, which are written into those inputs."""
    outs = list(gm.graph.output_node().args[0])
    picked = outs[:num_outputs] + outs[num_outputs + len(mutated):]
    kept = set()
    for o in picked:
        tm = o.meta.get("traced_meta") if isinstance(o, fx.Node) else None
        if tm is not None and len(o.users) > 1 and not tm.offset \
                and tuple(tm.stride) == contiguous_strides(tm.shape):
            kept.add(o)
    return kept


_RESHAPES = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _reshaped_source_reads_it(env, node, memory):
    """``node`` (a reshape of a computed value) was made contiguous memory for an extern
    call: later users of the value it reshapes read that memory too, through the inverse
    reshape, rather than compute the value again. Why: a Linear's input is its 2-D view, so
    a GELU output the backward needs (saved, as eager saves it) was computed twice, for the
    GEMM and again as the saved output, an erf per element each time. A reshape of an
    unstored value is its row-major order, which a contiguous buffer of the reshape has."""
    if node.op != "call_function" or node.target not in _RESHAPES or not node.args:
        return
    src = node.args[0]
    value = env.get(src) if isinstance(src, fx.Node) else None
    if not isinstance(value, LoopValue) or value.strided is not None or memory.strided is None:
        return
    buf, strides, offset = memory.strided
    if offset or getattr(buf, "base_offset", 0) or tuple(strides) != contiguous_strides(memory.sizes) \
            or memory.numel != value.numel:
        return
    env[src] = LoopValue.view_of(buf, value.sizes, contiguous_strides(value.sizes), 0)


def _consumers(n) -> int:
    """How many of ``n``'s users read it as separate expressions: a user whose only user is
    another user of ``n`` is part of that one's expression (``x * sigmoid(x)``, SiLU's
    decomposition; ``x * hardtanh(x + 3)``), where the kernel computes ``x`` once (its loads
    and ops are shared within an expression). Only a user of ``x``'s shape (elementwise):
    a reduction's result (softmax's ``x - amax(x)``) is a loop of its own, which would
    compute ``x`` again (T5's attention scores: 162 -> 219 us a call when counted once). Why: counted as two readers, a BatchNorm
    followed by SiLU was stored and read back (EfficientNet's expansion and depthwise
    outputs, 3 MB each at b2 128x128) instead of fused into the kernel after it."""
    users = list(n.users)
    if len(users) <= 1:
        return len(users)
    inside = set(users)
    shape = _shape(n)
    return sum(not (len(u.users) == 1 and next(iter(u.users)) in inside
                    and shape is not None and _shape(u) == shape) for u in users)


def _shape(n):
    tm = n.meta.get("traced_meta")
    return tuple(tm.shape) if tm is not None and hasattr(tm, "shape") else None


def _stored_strides(ctx, n):
    """The strides a value stored for several users gets: its traced ones where it is a
    channels-last 4-D tensor and the target asks for it (between convolutions running
    channels-last, lower/layout.py CONV_LAYOUTS: stored contiguous, the next convolution's
    argument was a second copy), else contiguous (None)."""
    tm = n.meta.get("traced_meta")
    if not ctx.options.channels_last_stores or tm is None or len(tm.shape) != 4 \
            or tuple(tm.stride) == contiguous_strides(tm.shape) or not is_channels_last(tm):
        return None
    return tuple(tm.stride)


def _as_traced(ctx, v, tm, handed_out_as_input=False):
    if not isinstance(v, LoopValue):
        return v
    if not handed_out_as_input and v.strided is not None and \
            any(v.strided[0] is b for b in ctx.g.inputs if b is not None):
        # An input's own memory (x.clone() lowers to x): eager's output is new memory, and
        # handing the input out would make the result an alias of it. An output eager
        # returns as an input or a view of one (an OutputAlias, ``handed_out_as_input``) is
        # what the caller hands out instead: computing a copy of it would be a wasted
        # kernel per call (Dropout in eval mode returns its input).
        return _new_memory(ctx, v, tm)
    if tm is not None and v.strided is not None and v.strided[2] == tm.offset:
        buf, strides, offset = v.strided
        if tuple(strides) == tuple(tm.stride):
            return v
        if same_addresses(tm.shape, strides, tm.stride):
            # the same memory, the strides differ only on dims of size 1 (a view computes 0
            # there, eager the contiguous stride): hand it out with the traced strides rather
            # than copy it (GPT b1's logits, 6.4 MB and one launch a call)
            return LoopValue.view_of(buf, v.sizes, tm.stride, offset)
    if tm is None or 0 in tm.stride and v.numel > 1 \
            or tuple(tm.stride) == contiguous_strides(tm.shape):
        if v.strided is not None and tm is None:
            return v
        contiguous = contiguous_strides(v.sizes)
        if v.buffer is not None and any(a != b and n != 1 for a, b, n in zip(v.buffer.strides, contiguous, v.sizes)):
            # a buffer in another layout (an extern's channels-last result, returned through
            # .contiguous(), which lowers to the value itself): eager's output is contiguous
            return _new_memory(ctx, v, None)
        return ctx.realize(v, "output")
    # The traced strides, at storage offset 0. A traced offset (a split piece of a computed
    # qkv, saved for backward) needs no room: every reader addresses an input through its
    # data_ptr(), which includes the offset, and indexes it with the traced strides. (It
    # was realized contiguous, which a backward then read with the traced strides: wrong
    # values once a computed value's piece was saved.)
    return ctx.store(v, tm.stride, "output")


def _as_saved(ctx, v, handed):
    """A value the forward saves for its backward, in the layout the forward has it in: a
    view of memory the forward computed as it is (a transposed or sliced view of it: no
    copy), anything else stored contiguous (why: autograd.py _own_layout_outputs). Not a
    view of an input or of a buffer the user outputs are (``handed``): a later in-place
    write by the caller would change what the backward reads."""
    if not isinstance(v, LoopValue):
        return v
    if v.strided is None:
        return ctx.realize(v, "saved")
    base = v.strided[0]
    if base.kind in ("input", "const") or base in handed:
        return _new_memory(ctx, v, None)
    return v


def _new_memory(ctx, v, tm):
    """``v`` computed into a buffer of its own, in the traced strides where they are dense."""
    dense = tm is not None and not (0 in tm.stride and v.numel > 1)
    strides = tuple(tm.stride) if dense else contiguous_strides(v.sizes)
    buf = ComputedBuffer(ctx.name(), v.sizes, strides, 0, v.dtype, body=Pointwise(v.load),
                         origin="output")
    ctx.g.steps.append(buf)
    return LoopValue.of_buffer(buf)


def _copied_buffer(src: LoopValue):
    """The computed or extern-made buffer ``src`` reads element for element in its own
    layout, else None."""
    if src.strided is None:
        return None
    buf, strides, offset = src.strided
    if (buf.kind not in ("input", "const") and not buf.base_offset
            and tuple(src.sizes) == tuple(buf.sizes)
            and tuple(strides) == tuple(buf.strides) and offset == buf.offset):
        return buf
    return None


def _reads_other_elements(src: LoopValue, dst: Buffer) -> bool:
    """Would writing ``dst`` in place while computing ``src`` clobber values still needed?"""
    loads, idx = probe(src, "_c")
    own = dst.index(idx)
    return any(b is dst and ix != own for b, ix in loads) or src.sizes != tuple(dst.sizes)


def _has_bad_dtype(args, options):
    bad = []

    def visit(a):
        if isinstance(a, LoopValue) and not options.admits(a.dtype):
            bad.append(a.dtype)
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x)
    visit(args)
    return bool(bad)


def _lower_node(ctx: LowerCtx, n: fx.Node, args, kwargs):
    if n.target is aten.add.Tensor:
        v = add_rows_in_place(ctx, n, args, kwargs)     # a tied embedding's gradient
        if v is not None:
            return v
    fn = LOWERINGS.get(n.target)
    tm = n.meta.get("traced_meta")
    if n.target in EXTERN_OPS:
        return lower_extern(ctx, n, args, kwargs)
    if fn is not None and not _has_bad_dtype(args, ctx.options) and (tm is None or ctx.options.admits(tm.dtype)):
        try:
            v = fn(ctx, n, *args, **kwargs)
            if isinstance(v, LoopValue) and tm is not None and tuple(v.sizes) != tuple(tm.shape):
                raise Unlowerable(f"shape mismatch {v.sizes} vs {tm.shape}")
            return v
        except Unlowerable:
            pass
    return ctx.extern(n, args, kwargs, fallback=True)


def _buffers_read(tv: LoopValue) -> int:
    """How many distinct buffers computing ``tv`` at one index loads."""
    return len({b for b, _ in probe(tv, "_b")[0]})
