"""Render scheduled groups as plain C++17: one ``extern "C"`` function per segment.

No torch headers (gcc builds a file in a fraction of a second). Every pointer is
``__restrict__``: inputs are only read, and everything written is freshly allocated, so
nothing aliases. OpenMP splits the outermost loop only when a group does enough work to pay
for waking threads; the innermost loops carry ``omp simd`` so gcc vectorises them under
``-O3 -march=native``.
"""
from __future__ import annotations

import torch

from ..index import IndexExpr, Var
from ..ir import ComputedBuffer, ScalarExpr, Reduction
from ..schedule import Group, _reads, member_index, red_vars
from ..lower.core import LowerOptions
from .emit import Emitter, ctype
from .prelude import prelude, reduction_clause, wide_vectors  # noqa: F401  (prelude: used by the build step)
from .reuse import reuse_pairs

# Work (element-operations) below which a loop nest runs on one thread: waking the OpenMP
# team costs a few microseconds, which is the whole budget of a small model's call, and it
# leaves the team spinning ~10 ms (libgomp's default wait policy, shared with PyTorch's own
# ops), which on a loaded 2-core machine slows whatever runs next. Measured here: a
# memory-bound pointwise kernel gains nothing from 2 threads up to 2**18 elements (55 us
# either way) and 13% at 2**20; so small models never wake the team.
PARALLEL_WORK = 1 << 18
PARALLEL_GROWTH = 64      # shape-generic loops: how much larger than the example sizes may get
ARENA_STACK_LIMIT = 1 << 16

def _init(rtype, dt):
    t = ctype(dt)
    if rtype == "sum":
        return f"static_cast<{t}>(0)"
    if rtype == "prod":
        return f"static_cast<{t}>(1)"
    if dt == torch.bool:
        return "false" if rtype in ("max", "argmax") else "true"
    if dt.is_floating_point:
        inf = "__builtin_inff()" if dt == torch.float32 else "__builtin_inf()"
        return f"-{inf}" if rtype in ("max", "argmax") else inf
    lim = {torch.int64: "__INT64_MAX__", torch.int32: "__INT32_MAX__", torch.int16: "__INT16_MAX__",
           torch.int8: "__INT8_MAX__", torch.uint8: "__UINT8_MAX__"}[dt]
    if rtype in ("max", "argmax"):
        return "0" if dt == torch.uint8 else f"(-{lim} - 1)"
    return lim


class SegmentCode:
    def __init__(self, name):
        self.name = name
        self.params: list = []         # buffers passed as pointers, in order
        self.nsizes = 0                # trailing int64 size arguments (shape-generic code)
        self.checks: list = []         # ir.IndexCheck for each error code the function returns
        self.text = ""


def render_segment(name: str, groups: list, local: set, kernel_no: list, nsizes: int = 0,
                   options: LowerOptions | None = None) -> SegmentCode:
    """``nsizes`` > 0: a shape-generic rendering (backend/dynamic.py). The function takes the
    size symbols as trailing ``int64_t ds0, ds1, ...`` arguments, and no choice depends on a
    size's magnitude: OpenMP decides at run time (an ``if`` clause), and the arena (one slot
    per buffer: slot reuse compares sizes) is on the stack or the heap as its size decides."""
    seg = SegmentCode(name)
    seg.nsizes = nsizes
    params: dict = {}
    internal: list = []
    body = Emitter()
    body.wide_simd = wide_vectors()

    def need(buf):
        if buf.kind == "local":
            return
        target = buf.target if isinstance(buf, ComputedBuffer) and buf.kind == "alias" else buf
        if target.kind == "internal":
            if target not in internal:
                internal.append(target)
        elif target not in params:
            params[target] = True

    for g in groups:
        for m in g.members:
            need(m)
    for g in groups:
        _render_group(body, g, local, need, kernel_no, bool(nsizes), options or LowerOptions())
    # arena: first-fit reuse by lifetime (group position of first write .. last read)
    arena_lines, arena_size = _arena(groups, internal, bool(nsizes))
    seg.params = list(params)
    seg.checks = list(body.checks)
    sig = ", ".join([f"{'const ' if not _written(b, groups) else ''}{ctype(b.dtype)}* __restrict__ {b.name}"
                     for b in seg.params] + [f"int64_t ds{i}" for i in range(nsizes)])
    out = [f'extern "C" int {name}({sig}) {{', "  int err = 0;"]
    heap = arena_size > ARENA_STACK_LIMIT
    if arena_size and nsizes:
        # The size is a polynomial in the sizes: the stack when it fits (a heap allocation
        # and free per call cost the seed MLP's generic build ~0.1 µs of its ~3 µs kernel),
        # the heap when it does not (rounded up: aligned_alloc wants a multiple of 64).
        out.append(f"  const int64_t arena_bytes = {arena_size};")
        out.append(f"  alignas(64) char arena_stack[{ARENA_STACK_LIMIT}];")
        out.append(f"  char* arena = arena_bytes <= {ARENA_STACK_LIMIT} ? arena_stack : "
                   "static_cast<char*>(aligned_alloc(64, (arena_bytes + 63) / 64 * 64));")
    elif arena_size and not heap:
        out.append(f"  alignas(64) char arena[{arena_size}];")
    elif arena_size:
        out.append(f"  char* arena = static_cast<char*>(aligned_alloc(64, {arena_size}));")
    out += arena_lines
    out += body.lines
    if arena_size and nsizes:
        out.append("  if (arena != arena_stack) free(arena);")
    elif heap:
        out.append("  free(arena);")
    out.append("  return err;")
    out.append("}")
    seg.text = "\n".join(out)
    return seg


def _written(b, groups):
    for g in groups:
        for m in g.members:
            if m is b or (m.kind == "alias" and m.target is b):
                return True
    return False


def _arena(groups, internal, generic=False):
    first, last = {}, {}
    from ..schedule import _reads
    for gi, g in enumerate(groups):
        for m in g.members:
            if m in internal:
                first.setdefault(m, gi)
                last[m] = max(last.get(m, gi), gi)
            for b in _reads(m):
                if b in internal:
                    last[b] = max(last.get(b, gi), gi)
    slots: list = []                   # [offset, size, free_after_group]
    lines, top = [], 0
    for b in sorted(internal, key=lambda b: first.get(b, 0)):
        if generic:
            # polynomial in the sizes (no rounding), and 8-byte aligned for every dtype
            nbytes = b.numel * 8 + 64
        else:
            nbytes = max(b.numel * _itemsize(b.dtype), 1)
            nbytes = (nbytes + 63) // 64 * 64
        f = first.get(b, 0)
        off = None
        for s in ([] if generic else slots):
            if s[2] < f and s[1] >= nbytes:
                off = s[0]
                s[2] = last.get(b, f)
                break
        if off is None:
            off = top
            top += nbytes
            slots.append([off, nbytes, last.get(b, f)])
        lines.append(f"  {ctype(b.dtype)}* __restrict__ {b.name} = reinterpret_cast<{ctype(b.dtype)}*>(arena + {off});")
    return lines, top


def _itemsize(dt):
    return torch.empty((), dtype=dt).element_size()


def _render_group(k: Emitter, g: Group, local: set, need, kernel_no, generic=False, options=None):
    kernel_no[0] += 1
    ov = [Var(f"x{d}", s) for d, s in enumerate(g.outer)]
    work = 0
    simple = True
    for m in g.members:
        n = m.numel
        if isinstance(m.body, Reduction):
            for r in m.body.rsizes:
                n *= r
            simple = False
        if member_index(m, ov, "z")[1]:
            simple = False
        work = max(work, n)
    k.line(f"// kernel {kernel_no[0]}: " + ", ".join(f"{m.name}={m.origin or 'pointwise'}" for m in g.members))
    k.line("{")
    k.push()
    group_start = len(k.lines)
    k.open_block()
    k.written = {m.cname for m in g.members if m not in local}
    if generic:
        # a loop too small to pay for threads even at PARALLEL_GROWTH x dyn_scale times the
        # sizes seen gets one serial copy (a size-driven choice: recorded at the example size,
        # replayed elsewhere). The growth factor is larger than dyn_scale because a dynamic
        # graph is captured at its second call's (often small) sizes: the test GPT captured at
        # (B, T) = (3, 17) and run at (8, 128) has 20x the work, and without a parallel copy
        # ran 1.5x slower than its static graph on 2 cores.
        par = bool(g.outer) and g.outer[0] > 1 and \
            options.size_choice("parallel loop", work * options.dyn_scale * PARALLEL_GROWTH >= PARALLEL_WORK)
    else:
        par = work >= PARALLEL_WORK and g.outer and g.outer[0] > 1
    start = len(k.lines)
    columns = None if generic else _column_block(g, ov, local)
    for d, v in enumerate(ov if columns is None else ()):
        pragma = None
        if d == 0 and par and generic:
            pragma = "#pragma omp parallel for" + (" simd" if len(ov) == 1 and simple else "")
        elif d == 0 and par:
            pragma = "#pragma omp parallel for"
        elif d == len(ov) - 1 and simple and not (d == 0 and par):
            pragma = "#pragma omp simd"
        k.open_loop(v, pragma)
    k.group_frames = len(k.frames)
    locals_here = {m: f"v_{m.name}" for m in g.members if m in local}

    def hook(buf, ix):
        if buf in locals_here:
            return ScalarExpr(locals_here[buf], buf.dtype)
        need(buf)
        return None
    k.load_hook = hook
    if columns is not None:
        _render_columns(k, g, ov, columns, par, locals_here)
    pairs = reuse_pairs(g.members, ov, locals_here) if columns is None else {}
    holds: dict = {}                   # pointwise member -> (canonical id, store line index)
    i = 0
    while columns is None and i < len(g.members):
        mates = _sibling_reductions(g.members, i, ov, pairs)
        if len(mates) > 1:
            _render_siblings(k, mates, ov, locals_here)
        else:
            _render_member(k, g.members[i], ov, locals_here, pairs.get(g.members[i]), holds)
        i += len(mates) or 1
    for _ in (ov if columns is None else ()):
        k.close_loop()
    block = k.close_block()
    k.flatten(group_start)
    # the nest starts after the group's hoisted values: the block's slot, and its tail (the
    # slot just before the outer loops) when there are outer loops
    start += len(block.slot) - 1 + (len(block.tail) if ov else 0)
    k.lines[start:] = [l for l in k.lines[start:] if l]    # blanked reuse lines (never empty else)
    if par and generic:
        # Shape-generic code decides at run time, with two copies of the loop nest: an OpenMP
        # ``if`` clause would still outline the loop into a function (losing __restrict__ and
        # vectorisation) and build a team of one on every call.
        nest = k.lines[start:]
        pad = nest[0][:len(nest[0]) - len(nest[0].lstrip())]
        serial = (["  " + pad + "#pragma omp simd"] if len(ov) == 1 and simple else []) + \
                 ["  " + l for l in nest[1:]]
        k.lines[start:] = ([f"{pad}if ({work} >= {PARALLEL_WORK}) {{"] + ["  " + l for l in nest] +
                           [f"{pad}}} else {{"] + serial + [f"{pad}}}"])
    if any(l.lstrip().startswith("err |= ") for l in k.lines[start:]):
        # bounds-check bits (emit.flag_out_of_range) are ORed into ``err`` in every
        # iteration: a reduction, so that neither SIMD lanes nor threads lose another's flag
        k.lines[start:] = [l + " reduction(|:err)" if l.lstrip().startswith("#pragma omp") else l
                           for l in k.lines[start:]]
    k.pop()
    k.line("}")


# Column reductions (a sum over the rows of a row-major value, one result per column: bias
# and LayerNorm weight gradients sum over the tokens) run with the kept dim innermost, in
# blocks of at most this many columns (a divisor of the dim, at least 8), an accumulator
# array each: 64 floats measured fastest on a 250 x 512 sum (16: 11 us, 64: 6.3, 256: 7.5).
COLUMN_BLOCK = 64


def _column_block_size(columns: int):
    """How many columns one block of a column loop takes: all of them up to COLUMN_BLOCK,
    else the largest divisor of ``columns`` from COLUMN_BLOCK down to 8 (None: no such)."""
    if columns <= COLUMN_BLOCK:
        return columns
    return next((b for b in range(COLUMN_BLOCK, 7, -1) if columns % b == 0), None)


def _column_block(g: Group, ov, local):
    """The block of the group's last outer dim to render it with ``_render_columns``, or None.

    Why: a reduction's own loop is innermost, so a sum over rows reads one column with the
    row's stride (Whisper's bias gradients: stride 512 or 2048 over 250 tokens); gcc
    vectorises that loop with gathers, or not at all. ATen vectorises across the kept dim
    instead, and so does this: for each block of columns, the rows in order, the block's
    columns innermost (a 250 x 512 column sum: 102 us -> 6 us, torch.sum(0) 7 us; the
    LayerNorm weight and bias gradients of that size 107 -> 30 us; measured alone, ctypes).

    When: the members are folds (sum, prod, max, min) with no loop of its own besides their
    reduction, reading no other member (a result exists only after all rows), then possibly
    pointwise members without loops of their own (computed per column after the rows: the
    cast or copy of a gradient into its parameter's buffer); and the loads the innermost
    loop must gather are fewer with the columns innermost than with the rows innermost (a
    load that does not vary in the innermost loop is hoisted out of it)."""
    if not ov or not g.members:
        return None
    reds = [m for m in g.members if isinstance(m.body, Reduction)]
    if not reds or g.members[:len(reds)] != reds:
        return None
    for m in reds:
        if not (m.body.rtype in _FOLDS and m.body.acc_dtype != torch.bool
                and not member_index(m, ov, "z")[1] and not _reads(m) & set(g.members)):
            return None
        if _row_chunks(red_vars(m, "zr")) is None:
            return None                    # many rows, none to chunk them by: left in lanes
    if any(member_index(m, ov, "z")[1] for m in g.members[len(reds):]):
        return None
    last = ov[-1]
    size = _column_block_size(last.size)
    if size is None or size < 2:
        return None
    rows_inner = cols_inner = 0
    for m in reds:
        rv = [v for v in red_vars(m, "zr") if v.size > 1]
        if not rv:
            return None
        k = Emitter(probing=True)
        idx, _ = member_index(m, ov, "zi")
        m.body.fn(k, idx, [IndexExpr.of(v) for v in red_vars(m, "zr")])
        for _, ix in k.loads:
            coef = {}
            for a, c in ix.terms:
                if not isinstance(a, Var):
                    return None            # an indirect or divided index: left as it is
                coef[a.name] = c
            r = coef.get(rv[-1].name, 0)
            x = coef.get(last.name, 0)
            rows_inner += r not in (0, 1)  # gathered with the rows innermost
            cols_inner += x not in (0, 1)  # gathered with the columns innermost
    return size if cols_inner < rows_inner else None


def _row_chunks(rv):
    """The row loops ``rv`` of a column sum as (loops, inner loops, index per dim): each run of
    the inner loops (at most COLUMN_CHUNK rows) is added up apart, then into the total; None
    inner loops: all rows in order (few); None: no way to chunk them. Why: added in order, n
    rows round like n terms; in chunks of c, like c + n/c, near what the row loop's SIMD lanes
    gave and ATen's cascade sum (a conv bias before BatchNorm, zero in exact arithmetic, came
    out 5x noisier than eager's with its 2 x 8 x 8 positions added in order). The inner loops
    are the innermost dims whose product is at most COLUMN_CHUNK, or the innermost dim cut
    by its largest divisor up to COLUMN_CHUNK (a 250-token sum: 10 chunks of 25)."""
    ix = [IndexExpr.of(v) for v in rv]
    total = 1
    for v in rv:
        total *= v.size
    if total <= COLUMN_CHUNK:
        return list(rv), None, ix
    cut, rows = len(rv), 1
    while cut > 0 and rows * rv[cut - 1].size <= COLUMN_CHUNK:
        cut -= 1
        rows *= rv[cut].size
    if cut < len(rv):
        return list(rv[:cut]), list(rv[cut:]), ix
    last = rv[-1]
    chunk = next((c for c in range(COLUMN_CHUNK, 3, -1) if last.size % c == 0), None)
    if chunk is None:
        return None
    hi, lo = Var(f"{last.name}h", last.size // chunk), Var(f"{last.name}l", chunk)
    ix[-1] = IndexExpr.of(hi) * chunk + IndexExpr.of(lo)
    return list(rv[:-1]) + [hi], [lo], ix


COLUMN_CHUNK = 32


def _render_columns(k: Emitter, g: Group, ov, size: int, par: bool, locals_here):
    """The group's reductions with the last outer dim split into blocks of ``size``: per
    block, an accumulator array per reduction, then the rows (each run of reductions with the
    same sizes shares one row loop; many rows in chunks, ``_row_chunks``), the block's columns
    innermost, then per column the results and the pointwise members after them."""
    outer, last = ov[:-1], ov[-1]
    xb, xi = Var(f"{last.name}b", last.size // size), Var(f"{last.name}i", size)
    split = list(outer) + [xb, xi]
    reds = [m for m in g.members if isinstance(m.body, Reduction)]
    for d, v in enumerate(split[:-1]):
        k.open_loop(v, "#pragma omp parallel for" if d == 0 and par and v.size > 1 else None)
    k.group_frames = len(k.frames)
    for m in reds:
        k.line(f"alignas(64) {ctype(m.body.acc_dtype)} acc_{m.name}[{size}];")
        if _row_chunks(red_vars(m, "r"))[1] is not None:
            k.line(f"alignas(64) {ctype(m.body.acc_dtype)} part_{m.name}[{size}];")
    k.open_loop(xi, "#pragma omp simd")
    for m in reds:
        k.line(f"acc_{m.name}[{xi.name}] = {_init(m.body.rtype, m.body.acc_dtype)};")
    k.close_loop()
    i = 0
    while i < len(reds):
        j = i
        while j < len(reds) and reds[j].body.rsizes == reds[i].body.rsizes:
            j += 1
        run = reds[i:j]
        rv = [Var(f"r_{run[0].name}_{d}", s) for d, s in enumerate(run[0].body.rsizes)]
        rows, inner, ix = _row_chunks(rv)
        _loops_open(k, rows, False)
        if inner is not None:              # a chunk of rows, summed apart first
            k.open_loop(xi, "#pragma omp simd")
            for m in run:
                k.line(f"part_{m.name}[{xi.name}] = {_init(m.body.rtype, m.body.acc_dtype)};")
            k.close_loop()
            _loops_open(k, inner, False)
        into = "acc" if inner is None else "part"
        k.open_loop(xi, "#pragma omp simd")
        for m in run:
            k.writing = m.cname
            idx, _ = member_index(m, split, f"i_{m.name}_")
            v = k.cast(m.body.fn(k, idx, ix), m.body.acc_dtype)
            k.line(_fold(m.body.rtype, f"{into}_{m.name}[{xi.name}]", v.expr))
        k.close_loop()
        if inner is not None:
            _loops_close(k, inner)
            k.open_loop(xi, "#pragma omp simd")
            for m in run:
                k.line(_fold(m.body.rtype, f"acc_{m.name}[{xi.name}]", f"part_{m.name}[{xi.name}]"))
            k.close_loop()
        _loops_close(k, rows)
        i += len(run)
    k.open_loop(xi, "#pragma omp simd")
    for m in g.members:
        k.writing = m.cname
        idx, _ = member_index(m, split, f"i_{m.name}_")
        if m in reds:
            res = f"static_cast<{ctype(m.dtype)}>(acc_{m.name}[{xi.name}])"
        else:
            res = k.cast(m.body.fn(k, idx), m.dtype).expr
        _keep_result(k, m, idx, locals_here, res)
        k.forget_loads(m.cname)   # an input written in place (write_in_place) reads anew
    k.close_loop()
    for _ in split[:-1]:
        k.close_loop()


def _sibling_reductions(members, i, ov, pairs) -> list:
    """``members[i]`` and the reductions right after it that can share its row loop: row
    reductions (no inner loop of their own) over the same sizes, none reading another of
    them, none storing or reading back terms (codegen/reuse.py). Why: a LayerNorm's shift
    and square sums both recompute the row's inlined input (a residual stream's sum of
    buffers, an embedding's gathered rows); in one loop they load and compute it once."""
    def fusable(m):
        return (isinstance(m.body, Reduction) and m.body.rtype in _FOLDS
                and m.body.acc_dtype != torch.bool and not member_index(m, ov, "z")[1]
                and m not in pairs and m not in pairs.values())
    if not fusable(members[i]):
        return []
    mates = [members[i]]
    for m in members[i + 1:]:
        if not fusable(m) or m.body.rsizes != mates[0].body.rsizes or _reads(m) & set(mates):
            break
        mates.append(m)
    return mates


def _render_siblings(k: Emitter, mates: list, ov, locals_here):
    """Row reductions ``mates`` (``_sibling_reductions``) in one loop, an accumulator each."""
    red0 = mates[0].body
    rv = [Var(f"r_{mates[0].name}_{d}", s) for d, s in enumerate(red0.rsizes)]
    accs, clauses = [], []
    for m in mates:
        acc = f"acc_{m.name}"
        k.line(f"{ctype(m.body.acc_dtype)} {acc} = {_init(m.body.rtype, m.body.acc_dtype)};")
        accs.append(acc)
        clauses.append(reduction_clause(m.body.rtype, acc, m.body.acc_dtype.is_floating_point))
    _loops_open(k, rv, True, " ".join(clauses))
    for m, acc in zip(mates, accs):
        k.writing = m.cname
        idx, _ = member_index(m, ov, f"i_{m.name}_")
        v = k.cast(m.body.fn(k, idx, [IndexExpr.of(x) for x in rv]), m.body.acc_dtype)
        k.line(_fold(m.body.rtype, acc, v.expr))
    _loops_close(k, rv)
    for m, acc in zip(mates, accs):
        k.writing = m.cname
        idx, _ = member_index(m, ov, f"i_{m.name}_")
        _keep_result(k, m, idx, locals_here, f"static_cast<{ctype(m.dtype)}>({acc})")


def _loops_open(k, vars_, simd_last, reduction_clause=None):
    for i, v in enumerate(vars_):
        pragma = None
        if i == len(vars_) - 1 and simd_last:
            pragma = "#pragma omp simd" + (f" {reduction_clause}" if reduction_clause else "")
        k.open_loop(v, pragma)


def _loops_close(k, vars_):
    for _ in vars_:
        k.close_loop()


def _render_member(k: Emitter, m: ComputedBuffer, ov, locals_here, keep_in=None, holds=None):
    """``keep_in``: the pointwise member whose output row also stores this sum's terms, for
    its own loop to read back (codegen/reuse.py); ``holds`` records what was stored where."""
    tag = m.name
    k.writing = m.cname
    idx, inner = member_index(m, ov, f"i_{tag}_")
    t = ctype(m.dtype)
    if not isinstance(m.body, Reduction):
        _loops_open(k, inner, True)
        held = (holds or {}).get(m)
        if held:
            # the stored terms, read back where this loop computes the same value; the read
            # (and the sum's store) are blanked below if it never does
            cid, store_at = held
            name = k.tmp("kept")
            read_at = len(k.lines)
            k.line(f"const {t} {name} = {m.cname}[{m.index(idx).c()}];")
            k.reuse[cid] = slot = [name, False]
        v = k.cast(m.body.fn(k, idx), m.dtype)
        if m in locals_here:
            k.line(f"const {t} {locals_here[m]} = {v.expr};")
            k.defined(locals_here[m])
        else:
            k.line(f"{m.cname}[{m.index(idx).c()}] = {v.expr};")
            k.forget_loads(m.cname)   # an input written in place (write_in_place) reads anew
        if held:
            del k.reuse[cid]
            if not slot[1]:
                k.lines[read_at] = k.lines[store_at] = ""
        _loops_close(k, inner)
        return
    red = m.body
    rv = [Var(f"r_{tag}_{d}", s) for d, s in enumerate(red.rsizes)]
    size = _member_column_block(m, idx, inner, rv) if keep_in is None and m not in locals_here else None
    if size is not None:
        _render_member_columns(k, m, idx, inner, rv, size, locals_here)
        return
    if keep_in is not None:
        # the row variable is named as keep_in's inner loop variable, so that the terms'
        # loads read the same index text in both loops (their canonical forms then match)
        kidx, (kvar,) = member_index(keep_in, ov, f"i_{keep_in.name}_")
        rv = [kvar]
    _loops_open(k, inner, False)
    acc_t = ctype(red.acc_dtype)
    acc = f"acc_{tag}"
    k.line(f"{acc_t} {acc} = {_init(red.rtype, red.acc_dtype)};")
    arg = red.rtype in ("argmax", "argmin")
    if arg:
        k.line(f"int64_t {acc}_i = 0;")
    clause = None if red.acc_dtype == torch.bool else \
        reduction_clause(red.rtype, acc, red.acc_dtype.is_floating_point)
    _loops_open(k, rv, clause is not None, clause)
    v = k.cast(red.fn(k, idx, [IndexExpr.of(x) for x in rv]), red.acc_dtype)
    if red.rtype in _FOLDS:
        k.line(_fold(red.rtype, acc, v.expr))
        if red.rtype == "sum" and keep_in is not None and v.expr in k.canon:
            holds[keep_in] = (k.canon[v.expr], len(k.lines))
            k.line(f"{keep_in.cname}[{keep_in.index(kidx).c()}] = {v.expr};")
    else:
        cmp = ">" if red.rtype == "argmax" else "<"
        flat = IndexExpr()
        mul = 1
        for x in reversed(rv):
            flat = flat + IndexExpr.of(x) * mul
            mul *= x.size
        if red.acc_dtype.is_floating_point:
            k.line(f"if (({v.expr} != {v.expr} && {acc} == {acc}) || {v.expr} {cmp} {acc}) "
                   f"{{ {acc} = {v.expr}; {acc}_i = {flat.c()}; }}")
        else:
            k.line(f"if ({v.expr} {cmp} {acc}) {{ {acc} = {v.expr}; {acc}_i = {flat.c()}; }}")
    _loops_close(k, rv)
    _keep_result(k, m, idx, locals_here, f"{acc}_i" if arg else f"static_cast<{t}>({acc})")
    _loops_close(k, inner)


_FOLDS = ("sum", "prod", "max", "min")    # reductions folded by one line per element


def _member_column_block(m: ComputedBuffer, idx, inner, rv):
    """The block of ``m``'s innermost own kept loop to render it with
    ``_render_member_columns``, or None: the column sums of ``_column_block`` for a
    reduction that has kept loops of its own in its group (a mean over the spatial dims of
    a channels-last value, computed next to the pointwise member that makes that value).

    Why: a channels-last activation's mean over H and W (EfficientNet's squeeze-and-
    excitation, every conv net's global pooling) reads each channel's column with a stride
    of C per element; with the channels innermost the loads are consecutive and vectorise
    (EfficientNet-B0's first block, a 2 x 32 x 64 x 64 SiLU + mean: ~1 ms a call as a
    strided row loop). Same conditions as ``_column_block``: a fold, every load an affine
    index, fewer gathered loads with the columns innermost."""
    red = m.body
    if not inner or red.rtype not in _FOLDS or red.acc_dtype == torch.bool:
        return None
    last = inner[-1]
    size = _column_block_size(last.size)
    if size is None or size < 2:
        return None
    nonunit = [v for v in rv if v.size > 1]
    if not nonunit or _row_chunks(list(rv)) is None:
        return None
    k = Emitter(probing=True)
    red.fn(k, idx, [IndexExpr.of(v) for v in rv])
    rows_inner = cols_inner = 0
    for _, ix in k.loads:
        coef = {}
        for a, c in ix.terms:
            if not isinstance(a, Var):
                return None
            coef[a.name] = c
        rows_inner += coef.get(nonunit[-1].name, 0) not in (0, 1)
        cols_inner += coef.get(last.name, 0) not in (0, 1)
    return size if cols_inner < rows_inner else None


def _render_member_columns(k: Emitter, m: ComputedBuffer, idx, inner, rv, size: int, locals_here):
    """The reduction ``m`` with its innermost kept loop in blocks of ``size`` columns,
    innermost: per block an accumulator array, the rows in order (in chunks: _row_chunks),
    then the block's results (``_render_columns`` for one member with loops of its own)."""
    red, tag = m.body, m.name
    last = inner[-1]
    xb, xi = Var(f"{last.name}b", last.size // size), Var(f"{last.name}i", size)
    col = IndexExpr.of(xb) * size + IndexExpr.of(xi)
    d = int(last.name[len(f"i_{tag}_"):])
    idx = list(idx)
    idx[d] = col
    acc_t = ctype(red.acc_dtype)
    rows, chunk, ix = _row_chunks(list(rv))
    _loops_open(k, list(inner[:-1]) + [xb], False)
    k.line(f"alignas(64) {acc_t} acc_{tag}[{size}];")
    if chunk is not None:
        k.line(f"alignas(64) {acc_t} part_{tag}[{size}];")
    k.open_loop(xi, "#pragma omp simd")
    k.line(f"acc_{tag}[{xi.name}] = {_init(red.rtype, red.acc_dtype)};")
    k.close_loop()
    _loops_open(k, rows, False)
    if chunk is not None:
        k.open_loop(xi, "#pragma omp simd")
        k.line(f"part_{tag}[{xi.name}] = {_init(red.rtype, red.acc_dtype)};")
        k.close_loop()
        _loops_open(k, chunk, False)
    into = "acc" if chunk is None else "part"
    k.open_loop(xi, "#pragma omp simd")
    v = k.cast(red.fn(k, idx, ix), red.acc_dtype)
    k.line(_fold(red.rtype, f"{into}_{tag}[{xi.name}]", v.expr))
    k.close_loop()
    if chunk is not None:
        _loops_close(k, chunk)
        k.open_loop(xi, "#pragma omp simd")
        k.line(_fold(red.rtype, f"acc_{tag}[{xi.name}]", f"part_{tag}[{xi.name}]"))
        k.close_loop()
    _loops_close(k, rows)
    k.open_loop(xi, "#pragma omp simd")
    _keep_result(k, m, idx, locals_here, f"static_cast<{ctype(m.dtype)}>(acc_{tag}[{xi.name}])")
    k.close_loop()
    _loops_close(k, list(inner[:-1]) + [xb])


def _fold(rtype: str, acc: str, v: str) -> str:
    if rtype == "sum":
        return f"{acc} += {v};"
    if rtype == "prod":
        return f"{acc} *= {v};"
    return f"{acc} = t_{rtype}({acc}, {v});"


def _keep_result(k: Emitter, m: ComputedBuffer, idx, locals_here, res: str):
    """A member's value at ``idx``: a local for the group's later members, else stored."""
    if m in locals_here:
        k.line(f"const {ctype(m.dtype)} {locals_here[m]} = {res};")
        k.defined(locals_here[m])
    else:
        k.line(f"{m.cname}[{m.index(idx).c()}] = {res};")
