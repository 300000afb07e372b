"""The backend's passes, in order, as code: one list for the CPU and the GPU, static and
shape-generic graphs, that branches on a target object.

``PASSES`` is the whole route of one captured graph, each pass with one line saying what it
does. The first ones run once per graph (entry.py: prepare, then trace or joint per
variant); ``GRAPH_PASSES`` then run for each functional ATen graph (inference, forward,
backward) through ``plan_graph(target, ...)``: a step is the target's method of the pass's
name, and a target without one skips it (the C++ target has no partition or autotune). The
plans of one call are finished together by ``target.finish`` (build, then wrap).
Shape-generic graphs (dynamic.py, gpu/dynamic.py) run the same ``plan_graph`` at a few
sizes and fit the renderings into one template.

Every pass's output is kept (``CompiledGraphInfo.passes``, ``BackendInfo.passes``) and printed by
``compiled.tempa_info.trace()``: the captured FX graph, the ATen graph, the joint graph and
what it saved, the loop IR, the schedule with its fusion decisions, the kernels, the wrapper.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from .codegen.emit import Emitter
from .index import IndexExpr, Indirect
from .ir import ComputedBuffer, ExternCall, LoopValue, Pointwise, ScalarExpr
from .lower.core import LowerOptions
from .lower.lowerings import lower_graph
from .ops import result_dtype
from .schedule import _extern_buffers, _reads, _segments, member_index, probe_loads, red_vars, schedule

PASSES = (
    # -- once per graph (entry.py) -----------------------------------------------------------
    ("captured", "the torch-level FX graph the frontend (or any caller) hands to the backend"),
    ("split_at_values", "a graph holding value-dependent ops (.item(), nonzero, x[mask]) cut "
                        "at them: they run as ATen calls, each piece between goes through the "
                        "passes below as a graph of its own, shape-generic over the sizes and "
                        "numbers they compute (split_at_values.py)"),
    ("prepare", "lift get_attr tensors to inputs, so parameter values are never baked in"),
    ("aten", "trace on private clones under a recording dispatch mode + functionalize: a "
             "functional ATen graph and the inputs it mutates (lower/trace.py)"),
    ("layout", "4-D convolutions channels-last where the target's policy says so (GPU): the "
               "inference graph replayed with converted arguments, or the joint's replay "
               "converting them; returned tensors and gradients keep eager's layouts "
               "(lower/layout.py CONV_LAYOUTS, lower/replay.py)"),
    ("joint", "[training] the forward with grad and its recorded backward, partitioned into "
              "forward (outputs + saved) and backward graphs (lower/joint.py)"),
    # -- per functional graph: GRAPH_PASSES, through plan_graph ------------------------------
    ("lower", "ATen FX -> loop IR (lower/lowerings.py); an op without a lowering becomes an ATen call"),
    ("eliminate_dead", "drop buffers nothing reads"),
    ("schedule", "group buffers into loop nests (kernels), cut at extern calls (schedule.py)"),
    ("write_in_place", "a mutated input's new value computed straight into it where nothing "
                       "reads the old value later: no temporary, no copy-back loop"),
    ("partition", "[Triton] a group -> one kernel, or one per member where one program cannot hold it"),
    ("plan_memory", "where each buffer lives: wrapper-allocated, the C++ arena, a register"),
    ("render", "kernel text: C++ segments (codegen/cpp.py) or Triton kernels (codegen/triton.py)"),
    ("autotune", "[Triton, max-autotune] GEMM + epilogue templates against cuBLAS (gpu/gemm_tune.py)"),
    # -- per call of the backend, over all its plans: target.finish --------------------------
    ("build", "gcc -> one library (runtime/build.py), or every Triton kernel compiled in parallel"),
    ("wrap", "a generated Python wrapper: allocate, call kernels and externs, return (codegen/wrapper.py)"),
    # -- around the variants (entry.py, autograd.py) -----------------------------------------
    ("variants", "inference, or [training] forward and backward in one autograd node, the "
                 "backward also compiled per pattern of outputs without a gradient (lower/absent.py)"),
)
GRAPH_PASSES = ("lower", "eliminate_dead", "schedule", "write_in_place", "partition", "plan_memory",
                "render", "autotune")

# Shape-generic graphs: lowering thresholds assume run-time sizes up to this many times the
# sizes seen while compiling (lower/core.py LowerOptions.dyn_scale).
DYNAMIC_SIZE_SCALE = 4


@dataclass
class GraphJob:
    """One functional ATen graph going through GRAPH_PASSES: its inputs, what the passes
    made so far, and what each produced (``kept``: pass name -> output, in pass order)."""
    gm: object
    num_outputs: int
    mutated: list
    num_inputs: int
    label: str
    prefix: str = ""
    nsizes: int = 0                 # > 0: a rendering of a shape-generic graph
    options: object = None          # lower.core.LowerOptions
    lowered: object = None          # ir.LoweredGraph
    sched: object = None            # schedule.Schedule
    settings: dict = field(default_factory=dict)    # the target's own (GPU: param_inputs, autotune)
    kept: dict = field(default_factory=dict)
    # what the targets' own passes make: C++ segments; Triton partition, kernels, autotuning
    seg_codes: dict = None          # segment index -> cpp.SegmentCode
    kernel_count: int = 0
    parts: list = None              # ExternCall | triton.KernelPlan
    items: list = None              # ExternCall | (KernelPlan, KernelCode)
    tuned_from: int = 0             # autotune log entries made before this graph


def eliminate_dead(lowered) -> None:
    """Drop the steps no output or copy-back depends on."""
    live = set()
    work = []
    for v in lowered.outputs:
        if isinstance(v, LoopValue) and v.strided is not None:
            work.append(v.strided[0])
    for cb in lowered.copy_backs:
        work.extend(_reads(cb))
    producers = {}
    for st in lowered.steps:
        if isinstance(st, ExternCall):
            for b in st.outputs:
                if b is not None:
                    producers[b] = st
        else:
            producers[st] = st
    for st in lowered.steps:   # a random draw moves its generator even when nothing reads it
        if isinstance(st, ExternCall) and _draws_random_numbers(st.op):
            live.add(st)
            work.extend(_extern_buffers(st.args, st.kwargs))
    while work:
        b = work.pop()
        st = producers.get(b)
        if st is None or st in live:
            continue
        live.add(st)
        if isinstance(st, ExternCall):
            work.extend(_extern_buffers(st.args, st.kwargs))
        else:
            work.extend(_reads(st))
    lowered.steps = [s for s in lowered.steps if s in live]
    lowered.fallbacks = [s.name for s in lowered.steps if isinstance(s, ExternCall) and s.fallback]
    lowered.externs = [s.name for s in lowered.steps if isinstance(s, ExternCall) and not s.fallback]


def write_in_place(lowered, sched, within_kernel: bool) -> list:
    """Drop each copy-back that copies a buffer computed only to be copied, and compute that
    buffer straight into the input instead: an optimizer's ``p.add_(g, alpha=-lr)`` is then
    one loop that reads ``p`` and ``g`` and writes ``p``, not a loop into a temporary plus a
    copy loop (and the temporary's memory). Safe where every other read of the input's old
    value runs in an earlier kernel or extern, the buffer reads the input only at the element
    it writes, has the input's layout, and is neither handed out nor passed to an extern.
    ``within_kernel``: other members of the buffer's kernel may read the input (its old
    value before the write, the new one after it), as in C++, where one thread runs each
    element's whole loop body in order; a Triton kernel gets neither (its members' elements
    may sit on other threads). Returns the names of the inputs now written in place."""
    where = {}
    for i, it in enumerate(sched.items):
        for m in (it.outputs if isinstance(it, ExternCall) else it.members):
            where[m] = i
    handed_out = {v.strided[0] for v in lowered.outputs if isinstance(v, LoopValue) and v.strided is not None}
    written = []
    for cb in list(lowered.copy_backs):
        src, dst = cb.source, cb.target
        if src is None or src not in where:
            continue
        if isinstance(sched.items[where[src]], ExternCall):
            if _extern_in_place(sched.items, where[src], src, cb, dst, handed_out):
                _drop_copy_back(lowered, sched, cb)
                written.append(dst.name)
            continue
        if not _computable_into(src, dst, handed_out):
            continue
        if not _old_value_read_only_before(sched.items, where[src], src, cb, dst, within_kernel):
            continue
        if not within_kernel and any(m is not src and src in _reads(m)
                                     for m in sched.items[where[src]].members):
            continue
        src.kind, src.target = "alias", dst
        _drop_copy_back(lowered, sched, cb)
        written.append(dst.name)
    if written:
        sched.segments[:] = _segments(sched.items)
    return written


def reuse_dead_buffers(lowered, sched) -> list:
    """Compute a wrapper-allocated pointwise buffer into the memory of a buffer of the same
    layout that dies in its kernel (the output of the convolution before it: a BatchNorm
    and activation written over the convolution's result), as Inductor's in-place reuse
    does. Safe where the dying buffer ``d`` is read by nothing after the kernel, in the
    kernel only by ``b`` itself and by members before it, all at the element ``b`` writes
    (one thread runs each element's whole loop body in order: C++ only), and neither is
    handed out. Why: a new buffer per kernel is an allocation per call and a second working set
    the size of the activation (MobileNetV2 b2 128x128: 64 allocations a call, the
    convolution outputs 0.1-3 MB each). Returns the (buffer, reused) names."""
    handed_out = {v.strided[0] for v in lowered.outputs if isinstance(v, LoopValue) and v.strided is not None}
    where, last_read = {}, {}
    for i, it in enumerate(sched.items):
        if isinstance(it, ExternCall):
            for b in _extern_buffers(it.args, it.kwargs):
                last_read[b] = i
            for b in it.outputs:
                if b is not None and not it.fallback:   # a fallback's result may be a view
                    where[b] = i
            continue
        for m in it.members:
            where[m] = i
            for b in _reads(m):
                last_read[b] = i
    taken, done = set(), []
    for at, it in enumerate(sched.items):
        if isinstance(it, ExternCall):
            continue
        for pos, b in enumerate(it.members):
            # (not a returned one: the wrapper may allocate that in the output's shape)
            if not (isinstance(b, ComputedBuffer) and b.kind == "py" and isinstance(b.body, Pointwise)
                    and b not in handed_out and b.target is None and b.offset == 0 and all(isinstance(n, int) for n in b.sizes)):
                continue
            # the latest-written candidate first (the likeliest still in cache); by name
            # among equals, so that the generated code does not depend on set order
            for d in sorted(_reads(b), key=lambda x: (-where.get(x, -1), x.name)):
                if not (d in where and d not in taken and d not in handed_out and d.kind == "py"
                        and getattr(d, "target", None) is None and where[d] < at
                        and last_read.get(d) == at and d.offset == 0 and d.base_offset == 0
                        and d.dtype == b.dtype and _memory(d) == _memory(b)):
                    continue
                if any(d in _reads(m) and (k > pos or not _reads_at_offset_of(m, d, b))
                       for k, m in enumerate(it.members)):
                    continue
                b.kind, b.target = "alias", d
                taken.update((b, d))
                done.append((b.name, d.name))
                break
    return done


def _memory(buf) -> tuple:
    """(sizes, strides) of the memory a buffer is allocated as (a value stored in memory
    order is allocated as its view: LowerCtx.store)."""
    return getattr(buf, "view_layout", None) or (tuple(buf.sizes), tuple(buf.strides))


def _reads_at_offset_of(m, d, b) -> bool:
    """Does the pointwise member ``m`` (of ``b``'s sizes) read ``d`` only at the offset ``b``
    writes in the same iteration?"""
    if not isinstance(m.body, Pointwise) or tuple(m.sizes) != tuple(b.sizes):
        return False
    loads, idx, _ = probe_loads(m, [])
    own = b.index(idx)
    return all(ix == own for buf, ix in loads if buf is d)


def _drop_copy_back(lowered, sched, cb) -> None:
    sched.items.remove(next(it for it in sched.items
                            if not isinstance(it, ExternCall) and cb in it.members))
    lowered.copy_backs.remove(cb)


# functional ATen ops whose in-place twin writes its first argument, returning it: a
# StaticCache's index_copy_ (traced as index_put) then writes the cache's new rows, where
# the functional op copied the whole cache and the copy-back copied it again
IN_PLACE_TWINS = {
    torch.ops.aten.index_put.default: torch.ops.aten.index_put_.default,
    torch.ops.aten.index_copy.default: torch.ops.aten.index_copy_.default,
    torch.ops.aten.index_add.default: torch.ops.aten.index_add_.default,
    torch.ops.aten.scatter.src: torch.ops.aten.scatter_.src,
    torch.ops.aten.scatter.value: torch.ops.aten.scatter_.value,
    torch.ops.aten.scatter_add.default: torch.ops.aten.scatter_add_.default,
}


def _extern_in_place(items, at, src, cb, dst, handed_out) -> bool:
    """Make the extern at ``items[at]``, whose output ``src`` the copy-back ``cb`` copies
    into ``dst``, write ``dst`` itself, when its op has an in-place twin, ``dst`` (in its own
    layout) is its first argument and no other, ``src`` has ``dst``'s layout and is not
    handed out, and nothing after it reads ``dst``'s old value."""
    call = items[at]
    twin = IN_PLACE_TWINS.get(call.op)
    if twin is None or call.multi or not call.args or src in handed_out or dst in handed_out:
        return False
    first = call.args[0]
    if not (isinstance(first, LoopValue) and first.strided is not None and first.strided[0] is dst
            and tuple(first.strided[1]) == tuple(dst.strides) and first.strided[2] == 0
            and tuple(first.sizes) == tuple(dst.sizes)):
        return False
    if (tuple(src.strides) != tuple(dst.strides) or src.dtype != dst.dtype
            or dst in _extern_buffers(call.args[1:], call.kwargs)):
        return False
    for i, it in enumerate(items):
        if i <= at:
            continue
        if isinstance(it, ExternCall):
            if dst in _extern_buffers(it.args, it.kwargs):
                return False
        elif any(m is not cb and dst in _reads(m) for m in it.members):
            return False
    if call.name == str(call.op):
        call.name = str(twin)
    call.op = twin        # returns its first argument: ``src`` is then ``dst``'s tensor
    return True


def _computable_into(src, dst, handed_out) -> bool:
    if (not isinstance(src.body, Pointwise) or src.target is not None or src in handed_out
            or dst in handed_out or src.dtype != dst.dtype or src.offset != dst.offset
            or tuple(src.sizes) != tuple(dst.sizes)
            or any(a != b for a, b, n in zip(src.strides, dst.strides, src.sizes) if n != 1)):
        return False
    return _reads_only_own_elements(src, dst, src.sizes)


def _old_value_read_only_before(items, at, src, cb, dst, within_kernel) -> bool:
    """Does every read of ``dst``'s old value come before ``src`` writes it? A member of
    ``src``'s own kernel may read it when it comes earlier in the kernel and reads only the
    elements ``src`` writes: of the same size, they share every loop but the innermost, so
    each element is read before it is written, on every thread."""
    for i, it in enumerate(items):
        if isinstance(it, ExternCall):
            used = set(_extern_buffers(it.args, it.kwargs))
            if src in used or (dst in used and i >= at):
                return False
            continue
        before_src = True
        for m in it.members:
            if m is src:
                before_src = False
            elif m is not cb and i >= at and dst in _reads(m):
                if not (within_kernel and i == at and before_src
                        and _reads_only_own_elements(m, dst, src.sizes)):
                    return False
    return True


def _reads_only_own_elements(m, dst, sizes) -> bool:
    if not isinstance(m.body, Pointwise) or tuple(m.sizes) != tuple(sizes):
        return False
    loads, idx, _ = probe_loads(m, [])
    own = dst.index(idx)
    return all(ix == own for b, ix in loads if b is dst)


def _draws_random_numbers(op) -> bool:
    return isinstance(op, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in op.tags


class Target:
    """The passes every target shares; a target (codegen CppTarget in compile_graph.py,
    TritonTarget in gpu/compile.py) adds its own and says how it lowers."""
    name = "?"
    gpu_schedule = False            # schedule with the GPU's fusion limits (schedule.py)
    shared_reads = None             # lower_graph's shared_reads (the GPU stores shared values sooner)
    addmm_as_mm_macs = 0            # LowerOptions.addmm_as_mm_macs
    extra_dtypes: frozenset = frozenset()   # dtypes lowered beyond the C++ ones (LowerOptions)
    in_place_within_kernel = True   # write_in_place: a kernel's other members may read the input
    channels_last_stores = False    # LowerOptions.channels_last_stores
    memory_order_stores = False     # LowerOptions.memory_order_stores (at fixed sizes)
    outputs_stored_once = False     # LowerOptions.outputs_stored_once
    split_reduction_results = 0     # LowerOptions.split_reduction_results (at fixed sizes)
    depthwise_weight_grad_loops = False   # LowerOptions.depthwise_weight_grad_loops (at fixed sizes)

    def lower(self, job: GraphJob):
        job.lowered = lower_graph(job.gm, job.num_outputs, job.mutated, self.shared_reads, job.options)
        return LoopIR(job.lowered)

    def eliminate_dead(self, job: GraphJob):
        before = len(job.lowered.steps)
        eliminate_dead(job.lowered)
        return f"{before - len(job.lowered.steps)} of {before} steps dropped"

    def schedule(self, job: GraphJob):
        job.sched = schedule(job.lowered.steps, job.lowered.copy_backs, job.lowered.outputs,
                             gpu=self.gpu_schedule)
        return Schedule(job.sched)

    def write_in_place(self, job: GraphJob):
        written = write_in_place(job.lowered, job.sched, self.in_place_within_kernel)
        return f"written in place: {', '.join(written)}" if written else "none written in place"

    def make_plan(self, job: GraphJob):
        raise NotImplementedError

    def finish(self, plans: list) -> list:
        raise NotImplementedError


def plan_graph(target: Target, gm, num_outputs: int, mutated: list, num_inputs: int,
               label: str = "graph", prefix: str = "", nsizes: int = 0, choices=None,
               pack_weights: frozenset = frozenset(), own_layout_outputs: frozenset = frozenset(),
               **extra):
    """GRAPH_PASSES over one functional ATen graph with ``target``: the target's plan (to be
    finished with ``target.finish``). ``nsizes`` > 0: one rendering of a shape-generic graph
    taking that many size symbols; ``choices``: a lower.core.SizeChoices log that records or
    replays size-driven choices; ``pack_weights``: LowerOptions.pack_weights (fixed sizes
    only); ``own_layout_outputs``: LowerOptions.own_layout_outputs (fixed sizes only);
    ``extra``: the target's own settings for this graph."""
    fixed = not nsizes and choices is None
    options = LowerOptions(DYNAMIC_SIZE_SCALE if nsizes else 1, choices, target.addmm_as_mm_macs,
                           frozenset(target.extra_dtypes), target.channels_last_stores,
                           target.memory_order_stores and not nsizes,
                           frozenset(pack_weights) if fixed else frozenset(),
                           frozenset(own_layout_outputs) if fixed else frozenset(),
                           outputs_stored_once=target.outputs_stored_once,
                           split_reduction_results=target.split_reduction_results if fixed else 0,
                           depthwise_weight_grad_loops=target.depthwise_weight_grad_loops and fixed)
    job = GraphJob(gm, num_outputs, mutated, num_inputs, label, prefix, nsizes, options, settings=extra)
    job.kept["aten"] = gm
    for name in GRAPH_PASSES:
        step = getattr(target, name, None)
        if step is not None:
            out = step(job)
            if out is not None:
                job.kept[name] = out
    return target.make_plan(job)


class LoopIR:
    """The loop IR as lowered (the step list of that moment), printable. Buffer kinds and
    dead steps are as the later passes left them on the shared objects."""

    def __init__(self, lowered):
        self.lowered = lowered
        self.steps = list(lowered.steps)

    def __str__(self):
        g = self.lowered
        lines = ["inputs: " + ", ".join(_describe(b) for b in g.inputs if b is not None)]
        for st in self.steps:
            if isinstance(st, ExternCall):
                outs = ", ".join(_describe(b) for b in st.outputs if b is not None)
                lines.append(f"{outs} = {'fallback' if st.fallback else 'extern'} {st.name}")
            elif isinstance(st, ComputedBuffer):
                lines.append(_computed(st, _reads(st)))
                lines.extend(_body(st))
        for cb in g.copy_backs:
            lines.append(_computed(cb, _reads(cb)) + f"  (written into {cb.target.name})")
            lines.extend(_body(cb))
        outs = [v.strided[0].name if isinstance(v, LoopValue) and v.strided is not None else repr(v)
                for v in g.outputs]
        lines.append("outputs: " + ", ".join(outs))
        return "\n".join(lines)


class Schedule:
    """The schedule, printable: its groups (what fused into each kernel, with each member's
    memory kind once plan_memory has run) and what did not fuse, and why."""

    def __init__(self, sched):
        self.sched = sched

    def __str__(self):
        lines = []
        for it in self.sched.items:
            if isinstance(it, ExternCall):
                lines.append(f"  {'fallback' if it.fallback else 'extern'} {it.name}")
            else:
                lines.append(f"  kernel over {list(it.outer)}: " + ", ".join(
                    f"{m.name}[{m.origin or 'pointwise'}{', ' + m.kind if m.kind != 'py' else ''}]"
                    for m in it.members))
        report = self.sched.report
        return "groups:\n" + "\n".join(lines) + (
            "\nnot fused:\n  " + "\n  ".join(report) if report else "\nnot fused: (none)")


def memory_summary(steps) -> str:
    """How many computed buffers live where, after plan_memory."""
    kinds = Counter(st.kind for st in steps if isinstance(st, ComputedBuffer))
    return ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "(no computed buffers)"


def _body(buf) -> list:
    """The body of ``buf`` at one element, as named ops (``t3 = exp(t2)``)."""
    idx, _ = member_index(buf, [], "i")
    k = _Printer()
    if buf.is_reduction:
        v = buf.body.fn(k, idx, [IndexExpr.of(r) for r in red_vars(buf, "r")])
    else:
        v = buf.body.fn(k, idx)
    return k.lines + [f"    -> {v.expr}"]


def _dtype_name(dt) -> str:
    return str(dt).replace("torch.", "")


class _Printer(Emitter):
    """The emitter interface writing named ops instead of C++ (LoopIR's listing)."""

    def _let(self, expr, dt):
        for scope in reversed(self.scopes):
            if expr in scope:
                return ScalarExpr(scope[expr], dt)
        name = self.tmp()
        self.line(f"  {name}: {_dtype_name(dt)} = {expr}")
        self.scopes[-1][expr] = name
        return ScalarExpr(name, dt)

    def load(self, buf, ix):
        return self._let(f"load {buf.name}[{IndexExpr.of(ix).c()}]", buf.dtype)

    def op(self, name, vals, dtype):
        return self._let(f"{name}({', '.join(v.expr for v in vals)})", result_dtype(name, dtype))

    def cast(self, v, dt):
        return v if v.dtype == dt else self._let(f"{_dtype_name(dt)}({v.expr})", dt)

    def const(self, v, dt=None):
        return ScalarExpr(repr(v), dt or (torch.bool if isinstance(v, bool) else
                                          torch.int64 if isinstance(v, int) else torch.float64))

    def index(self, ix):
        return ScalarExpr(f"index({IndexExpr.of(ix).c()})", torch.int64)

    def indirect(self, v, size, check):
        name = self.tmp("ind")
        wrap = ", negative from the end" if check.wrap_negative else ""
        self.line(f"  {name}: index = {v.expr} into [0, {size}){wrap}, else {check.error}")
        return IndexExpr.of(Indirect(name, 0, max(size - 1, 0)))

    def flag_out_of_range(self, v, size, check):
        self.line(f"  check 0 <= {v.expr} < {size}, else {check.error}")
        return "out_of_range"

    def piecewise(self, branches, dt):
        name = self.tmp()
        self.line(f"  {name}: {_dtype_name(dt)} = the first of:")
        for cond, fn in branches:
            self.push()
            v = self.cast(fn(self), dt)
            self.line(f"  {v.expr} if {cond}")
            self.pop()
        return ScalarExpr(name, dt)


def _describe(b) -> str:
    return f"{b.name}: {str(b.dtype).replace('torch.', '')}{list(b.sizes)}"


def _computed(buf, reads) -> str:
    body = buf.body
    what = f"{body.rtype} over {list(body.rsizes)}" if buf.is_reduction else "pointwise"
    names = ", ".join(sorted(b.name for b in reads)) or "-"
    return f"{_describe(buf)} = {what} of ({names})  [{buf.origin or 'pointwise'}]"


def show(passes: dict, heading: str = "") -> str:
    """The kept outputs of ``passes`` (name -> output), in PASSES order, as text."""
    order = [name for name, _ in PASSES]
    out = [heading] if heading else []
    for name in sorted(passes, key=lambda n: order.index(n) if n in order else len(order)):
        value = passes[name]
        text = value.code if hasattr(value, "code") and hasattr(value, "graph") else str(value)
        out.append(f"=== {name} ===\n{text.strip()}")
    return "\n\n".join(out)
