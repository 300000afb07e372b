"""Scheduling: which computed buffers share one loop nest (a kernel), and where memory lives.

A *group* is one loop nest over an outer iteration space ``O`` (a tuple of sizes). A member
runs inside the outer loops, with its own inner loops for the rest of its dimensions (and a
reduction loop if it is a reduction). So a softmax is one group over the rows: ``amax`` over
the row, ``sum(exp)`` over the row, then the normalised row. A member may join a group when
its non-unit sizes start with ``O`` and every value it reads from an earlier member is
produced in the *same* outer iteration (checked by probing the body's loads: the index must
equal the producer's index for the current outer position, or stay inside the producer's
current slice). Reduction results read only inside their group stay in a register.

Reshapes do not split iteration spaces: a member's dimension may span several outer
dimensions (its index is then the affine ``16*x0 + x1``), so layer-norm statistics over
``(B, T)`` share a loop nest with the normalised ``(B*T, C)`` GEMM input, and softmax
statistics over ``(B, H, T)`` with the ``(B*H, T, T)`` scores. When a candidate's dims split
the group's outer dims more finely, the outer space is refined (``(8, 16)`` -> ``(2, 4, 16)``)
so that every member's dims are whole runs of outer dims; no index ever needs a division.

Groups between two extern calls form one *segment*: one C++ function, one ctypes call.
Buffers used only inside a segment live in one stack/heap arena whose slots are reused once
a buffer's last reader has run (the buffer reuse plan).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .codegen.emit import Emitter
from .index import IndexExpr, Var, contiguous_strides
from .ir import ComputedBuffer, ExternCall, Reduction, LoopValue


def nonunit(sizes):
    return tuple(s for s in sizes if s != 1)


def member_index(buf: ComputedBuffer, outer_vars, prefix: str):
    """Index expressions for ``buf``'s dims: leading non-unit dims bound to the outer vars,
    each to the run of outer vars whose sizes multiply to its size (``fits`` said so)."""
    idx, inner, k = [], [], 0
    for d, s in enumerate(buf.sizes):
        if s == 1:
            idx.append(IndexExpr())
        elif k < len(outer_vars):
            run, p = [], 1
            while k < len(outer_vars) and p < s:
                run.append(outer_vars[k])
                p *= outer_vars[k].size
                k += 1
            e, mul = IndexExpr(), 1
            for v in reversed(run):
                e = e + IndexExpr.of(v) * mul
                mul *= v.size
            idx.append(e)
        else:
            v = Var(f"{prefix}{d}", s)
            inner.append(v)
            idx.append(IndexExpr.of(v))
    return idx, inner


def fits(outer, sizes) -> bool:
    """Do ``sizes``' leading non-unit dims cover ``outer`` exactly, each dim a whole run of
    outer dims? ((2, 16) fits (32, 64): 32 spans both outer dims.)"""
    nz = nonunit(sizes)
    k = 0
    for s in nz:
        if k == len(outer):
            return True
        p = 1
        while k < len(outer) and p < s:
            p *= outer[k]
            k += 1
        if p != s:
            return False
    return k == len(outer)


def _cumprods(sizes):
    out, p = [], 1
    for s in sizes:
        p *= s
        out.append(p)
    return out


def common_outer(outer, sizes):
    """The finest outer space that both ``outer`` and ``sizes``' non-unit dims are runs of,
    cut at their last common boundary: (8, 16, 16) and (2, 4, 16) give (2, 4, 16). None when
    the dims cross (6, 4) vs (4, 6) or share no boundary, or when either space is empty: a
    zero-size dim has no boundary in common with any other (its group's loops never run)."""
    if 0 in outer or 0 in sizes:
        return None
    a, b = _cumprods(outer), _cumprods(nonunit(sizes))
    common = set(a) & set(b)
    if not common or max(common) <= 1:
        return None
    top = max(common)
    cuts = sorted({x for x in a + b if x <= top})
    out, prev = [], 1
    for c in cuts:
        if c % prev:
            return None
        out.append(c // prev)
        prev = c
    return tuple(out)


def red_vars(buf: ComputedBuffer, prefix: str):
    return [Var(f"{prefix}{d}", s) for d, s in enumerate(buf.body.rsizes)]


def probe_loads(buf: ComputedBuffer, outer_vars, tag="p"):
    idx, inner = member_index(buf, outer_vars, f"{tag}i")
    k = Emitter(probing=True)
    if isinstance(buf.body, Reduction):
        rv = red_vars(buf, f"{tag}r")
        buf.body.fn(k, idx, [IndexExpr.of(v) for v in rv])
    else:
        buf.body.fn(k, idx)
    return k.loads, idx, inner


# GPU: at most this many members in a pointwise kernel that joins unrelated ops.
MAX_UNRELATED_POINTWISE = 16
# GPU: at most this many buffers (members and what they read) in one kernel. Why: Triton's
# compile time grows faster than a kernel's size, and the graph's slowest kernel is the
# critical path of the parallel compile. A GPT-124M training backward recomputes its
# residual stream and each layer's matmul inputs from it at the start: one kernel of 175
# pointers, 3.4 s to compile for sm_90 (here) when the other 40 took at most 1 s.
MAX_KERNEL_BUFFERS = 48


@dataclass(eq=False)
class Group:
    outer: tuple
    members: list = field(default_factory=list)
    pos: int = 0                      # position in the step list
    touched: set = field(default_factory=set)   # members and what they read

    @staticmethod
    def of(st, pos: int) -> "Group":
        g = Group(nonunit(st.sizes), [], pos)
        g.add(st)
        return g

    def add(self, st):
        self.members.append(st)
        self.touched.add(st)
        self.touched |= _reads(st)

    def has_room(self, reads: set) -> bool:
        """GPU: would the kernel stay within MAX_KERNEL_BUFFERS with a step reading ``reads``?"""
        return len(self.touched) + len(reads - self.touched) < MAX_KERNEL_BUFFERS

    def related(self, reads: set) -> bool:
        """Does a step reading ``reads`` read a member of this group, or something a member reads?"""
        return not self.touched.isdisjoint(reads)

    def takes_unrelated(self, st) -> bool:
        """A few independent pointwise ops of one shape share a launch (a layer's weight
        casts under autocast, one per layer): a bounded kernel, fewer launches."""
        return (len(self.members) < MAX_UNRELATED_POINTWISE and nonunit(st.sizes) == tuple(self.outer)
                and not isinstance(st.body, Reduction)
                and not any(isinstance(m.body, Reduction) for m in self.members))

    @property
    def name(self):
        return "kernel(" + ", ".join(m.name for m in self.members) + ")"


@dataclass
class Schedule:
    items: list                        # Group | ExternCall in execution order
    segments: list                     # [list[Group] | ExternCall]
    report: list                       # lines for the fusion report
    local: set                         # buffers kept in registers


def _outer_vars(outer):
    return [Var(f"x{d}", s) for d, s in enumerate(outer)]


def legal(group_outer, members, cand: ComputedBuffer, any_layout=False):
    """None if ``cand`` may join a group with these members and outer space; else why not.
    ``any_layout`` (the GPU): a member in a non-contiguous layout may be read where the read
    is of the current outer element itself (no inner dims): its value is at hand whatever
    the layout. Why: channels-last values between convolutions (lower/layout.py
    CONV_LAYOUTS) otherwise split a BatchNorm backward's chain of pointwise ops into one
    kernel per op."""
    nz = nonunit(cand.sizes)
    if not group_outer:
        return "scalar groups do not fuse"
    if not fits(tuple(group_outer), nz):
        return f"iteration spaces differ: {list(nz)} vs outer {list(group_outer)}"
    ov = _outer_vars(group_outer)
    produced = {m: m for m in members}
    cache = cand.__dict__.setdefault("_probe_cache", {})
    loads = cache.get(tuple(group_outer))
    if loads is None:
        loads = cache[tuple(group_outer)] = probe_loads(cand, ov)[0]
    for buf, ix in loads:
        if buf not in produced:
            continue
        if tuple(buf.strides) != contiguous_strides(buf.sizes) and not (
                any_layout and not member_index(buf, ov, "q")[1]):
            return f"reads {buf.name}, which has a non-contiguous layout"
        why = _local_read(buf, ix, ov)
        if why:
            return f"reads {buf.name} {why}"
    return None


def _local_read(buf: ComputedBuffer, ix: IndexExpr, ov):
    idx, inner = member_index(buf, ov, "q")
    if not inner:
        want = buf.index(idx)
        return None if ix == want else f"at {ix.c()}, not the current outer element {want.c()}"
    base_idx = [IndexExpr() if any(isinstance(a, Var) and a in inner for a in i.vars()) else i for i in idx]
    base = buf.index(base_idx)
    rest = ix - base
    outer_names = {v.name for v in ov}
    if any(getattr(a, "name", None) in outer_names for a in rest.vars()):
        return f"at {ix.c()}: depends on another outer element"
    if any(not isinstance(a, Var) for a in rest.vars()):
        return "through an indirect index"
    lo, hi = rest.rng()
    span = 1
    for v in inner:
        span *= v.size
    if lo < 0 or hi >= span:
        return f"at {ix.c()}: outside the current slice"
    return None


def _regroup(group: Group, cand, any_layout=False):
    """A different outer space (shorter, or split more finely) under which every member and
    ``cand`` still fuse; None if there is none."""
    new = common_outer(tuple(group.outer), cand.sizes)
    if new is None or new == tuple(group.outer):
        return None
    # re-validate every member under the new outer space: a read that stayed inside the
    # producer's slice of one outer element may reach another element of a finer space
    members = []
    for m in group.members:
        if legal(new, members, m, any_layout) is not None:
            return None
        members.append(m)
    return new if legal(new, members, cand, any_layout) is None else None


def schedule(steps: list, copy_backs: list, outputs: list, max_report=60,
             gpu=False) -> Schedule:
    """Place each step in a group after the last one it depends on.

    The CPU scans back from the last group: a group there is one more loop in the same C++
    function, so even unrelated members share one parallel loop. The GPU (``gpu``) scans
    forward from the step's last dependency and joins only a group it shares data with
    (reads a member, or something a member reads). Why: a value nothing needs until the
    graph's end (a training forward's outputs saved for backward, realized last) otherwise
    joins whatever group is last with its row count; on a GPT that made one Triton kernel of
    350 pointers computing every layer's saved values inside the cross-entropy kernel (100
    KB of source, most of a 29 s compile, one 5 ms launch). Placed where their inputs were
    just produced, they join the kernel that already reads those inputs. A few same-shape
    independent pointwise ops may still share a launch (Group.takes_unrelated)."""
    items: list = []
    where: dict = {}                   # buffer -> position in items
    report: list = []
    for st in steps:
        if isinstance(st, ExternCall):
            where_pos = len(items)
            items.append(st)
            for b in st.outputs:
                if b is not None:
                    where[b] = where_pos
            continue
        deps = _reads(st)
        earliest = max([where[b] for b in deps if b in where] + [-1])
        placed = False
        reasons = []
        if gpu:
            # groups that share data first, then (bounded) unrelated pointwise ones
            order, others = [], []
            for p in range(max(earliest, 0), len(items)):
                if isinstance(items[p], Group) and items[p].has_room(deps):
                    (order if items[p].related(deps) else others).append(p)
            order += [p for p in others if items[p].takes_unrelated(st)]
        else:
            order = range(len(items) - 1, max(earliest, 0) - 1, -1)
        for pos in order:
            g = items[pos]
            if not isinstance(g, Group):
                if pos > earliest:
                    continue
                break
            why = legal(g.outer, g.members, st, gpu)
            if why is None:
                g.add(st)
                where[st] = pos
                placed = True
                break
            new = _regroup(g, st, gpu)
            if new is not None:
                g.outer = new
                g.add(st)
                where[st] = pos
                placed = True
                break
            reasons.append(f"{g.name}: {why}")
        if not placed:
            g = Group.of(st, len(items))
            where[st] = len(items)
            items.append(g)
            if reasons and len(report) < max_report:
                report.append(f"{st.name} ({st.origin}) did not fuse with " + "; ".join(reasons[:2]))
            elif earliest >= 0 and isinstance(items[earliest], ExternCall) and len(report) < max_report:
                report.append(f"{st.name} ({st.origin}) starts a kernel after extern {items[earliest].name}")
    for cb in copy_backs:
        # Copy-backs write into inputs, so they run last, after every read of the old value.
        items.append(Group.of(cb, len(items)))
    return Schedule(items, _segments(items), report, set())


def _segments(items: list) -> list:
    """The C++ segments: each extern alone, each run of groups between externs one list."""
    segments: list = []
    for it in items:
        if isinstance(it, ExternCall):
            segments.append(it)
        elif segments and isinstance(segments[-1], list):
            segments[-1].append(it)
        else:
            segments.append([it])
    return segments


def _reads(st: ComputedBuffer):
    # Why cached: probing a body walks its whole (inlined) expression, and schedule,
    # plan_memory, dead-code elimination and the arena planner all ask the same question.
    r = st.__dict__.get("_reads_cache")
    if r is None:
        loads, _, _ = probe_loads(st, [])
        r = st.__dict__["_reads_cache"] = frozenset(b for b, _ in loads)
    return set(r)


def plan_memory(sched: Schedule, inputs, outputs, lowered_steps):
    """Decide each computed buffer's kind: py (wrapper-allocated), internal (arena), local."""
    seg_of: dict = {}
    group_of: dict = {}
    for si, seg in enumerate(sched.segments):
        if isinstance(seg, list):
            for g in seg:
                for m in g.members:
                    seg_of[m] = si
                    group_of[m] = g
    readers: dict = {}
    for si, seg in enumerate(sched.segments):
        if isinstance(seg, ExternCall):
            for b in _extern_buffers(seg.args, seg.kwargs):
                readers.setdefault(b, set()).add(("py", si))
            continue
        for g in seg:
            for m in g.members:
                for b in _reads(m):
                    readers.setdefault(b, set()).add((g, si))
    for v in outputs:
        if isinstance(v, LoopValue) and v.strided is not None:
            readers.setdefault(v.strided[0], set()).add(("py", -1))
    for m, si in seg_of.items():
        if m.kind == "alias":
            continue
        rs = readers.get(m, set())
        if any(r[0] == "py" or r[1] != si for r in rs):
            m.kind = "py"
        elif isinstance(m.body, Reduction) and not member_index(m, _outer_vars(group_of[m].outer), "z")[1] \
                and all(r[0] is group_of[m] for r in rs):
            m.kind = "local"
            sched.local.add(m)
        else:
            m.kind = "internal"
    return readers


def _extern_buffers(args, kwargs):
    out = []

    def visit(a):
        if isinstance(a, LoopValue):
            if a.strided is not None:
                out.append(a.strided[0])
        elif isinstance(a, (list, tuple)):
            for x in a:
                visit(x)
        elif isinstance(a, dict):
            for x in a.values():
                visit(x)
    visit(args)
    visit(kwargs)
    return out
