"""Render scheduled loop IR as Triton kernels: the second renderer of the same IR as cpp.py.

The bodies are drawn by ``TritonEmitter`` (codegen/triton_emit.py), which speaks the same
emitter interface as the C++ one, so a lowering written once runs on both.

The C++ loop nest maps onto a Triton program like this:

  outer loops  ->  the x axis: one program owns XBLOCK consecutive (flattened) outer
                   positions; outer variables ``x0, x1..`` are div/mod of ``xindex``
  a member's inner loops / reduction loop
               ->  the r axis: RBLOCK lanes over the member's flattened inner (or reduction)
                   space, ``[XBLOCK, RBLOCK]`` tiles. *Persistent* when every member's r
                   extent fits one tile (the whole row stays in registers, one pass),
                   otherwise *looped* (``for r0 in range(0, R, RBLOCK)`` with a tile-wide
                   accumulator reduced at the end)

A reduction result read only inside its kernel stays in a register (``[XBLOCK, 1]``); a
value with inner dims that a later member of the same kernel reads goes through global
memory with a barrier (the same program wrote the whole slice). bf16/fp16 are computed in
fp32 (loaded, upcast, stored rounded), as eager's kernels do internally.
"""
from __future__ import annotations

import re

import torch

from ..index import IndexExpr, Var
from ..ir import ComputedBuffer, ScalarExpr, Reduction, Unlowerable
from .triton_emit import HALF, TL, TritonEmitter, phys


# --- kernels --------------------------------------------------------------------------------

class KernelPlan:
    """One Triton kernel: members of a scheduler group under an outer iteration space."""

    def __init__(self, outer, members):
        self.outer = tuple(outer)
        self.members = list(members)
        self.local: set = set()       # members kept in registers (x level, read only here)
        self.barrier_after: set = set()  # members a later member reads back from memory


class KernelCode:
    def __init__(self):
        self.name = ""
        self.body = ""                # source with the name left as {name}
        self.params: list = []        # Buffers, in order
        self.grid = 1
        self.num_warps = 4
        self.xblock = 1
        self.rblock = 0
        self.persistent = True
        self.summary = ""
        self.xnumel = 1               # outer positions: the grid is ceil(xnumel / xblock)
        self.nsizes = 0               # trailing int64 size parameters ds0.. (shape-generic)

    def source(self, name):
        return self.body.replace("KERNEL_NAME", name)


def _np2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def member_extent(m: ComputedBuffer, ov):
    """(inner Vars, reduction sizes) of ``m`` under outer vars ``ov``."""
    from ..schedule import member_index
    _, inner = member_index(m, ov, f"i_{m.name}_")
    rs = tuple(m.body.rsizes) if isinstance(m.body, Reduction) else ()
    return inner, rs


def r_extent(m, ov) -> int:
    inner, rs = member_extent(m, ov)
    if inner and rs:
        raise Unlowerable("reduction with inner dims")
    n = 1
    for v in inner:
        n *= v.size
    for s in rs:
        n *= s
    return n if (inner or rs) else 0


def extents(plan: KernelPlan):
    """(outer positions X, every member's r extent): what the block choice depends on."""
    ov = [Var(f"x{d}", s) for d, s in enumerate(plan.outer)]
    X = 1
    for s in plan.outer:
        X *= s
    return X, tuple(r_extent(m, ov) for m in plan.members)


def choose_blocks(plan: KernelPlan, ov, r_contiguous: bool):
    """Launch parameters from sizes: (two_d, persistent, XBLOCK, RBLOCK, num_warps)."""
    X, exts = extents(plan)
    return blocks_for(X, max(exts) if exts else 0, r_contiguous)


def generic_blocks(X: int, R: int, r_symbolic: bool, r_contiguous: bool):
    """Launch parameters for a shape-generic kernel (backend/gpu/dynamic.py), fixed once for
    every size: ``X``/``R`` are the largest samples. A reduced extent that changes with the
    sizes cannot be held in one persistent tile (the tile is a compile-time constant), so
    such a kernel loops over it, with a tile sized for the samples."""
    if R == 0 or not r_symbolic:
        return blocks_for(X, R, r_contiguous)
    if r_contiguous or X < 64:
        rb = min(2048, max(16, _np2(R)))
        xb = max(1, min(_np2(X), max(1, 4096 // rb), 64))
        work = xb * rb
        return True, False, xb, rb, (8 if work >= 4096 else (4 if work >= 1024 else 2))
    two_d, _, xb, rb, nw = blocks_for(X, 1 << 20, False)      # the column-reduction split
    return two_d, False, xb, rb, nw


def blocks_for(X: int, R: int, r_contiguous: bool):
    if R == 0:
        xb = min(1024, _np2(X))
        nw = 4 if xb >= 512 else (2 if xb >= 128 else 1)
        return False, True, xb, 0, nw
    if R <= 2048:
        rb = max(2, _np2(R))
        xb = max(1, min(_np2(X), max(1, 4096 // rb), 64))
        if X >= 4096 and xb * rb < 1024:
            xb = max(1, min(_np2(X), 1024 // rb))
        work = xb * rb
        nw = 8 if work >= 4096 else (4 if work >= 1024 else 2)
        if rb >= 1024 and nw < 8:
            nw = 8
        return True, True, xb, rb, nw
    if r_contiguous or X < 64:
        return True, False, 1, 2048, 8
    # A column reduction (the reduced dim is not the contiguous one): x spans contiguous
    # columns for coalesced loads, but a wide XBLOCK leaves few programs: a bias gradient
    # over (8192, 768) ran as 12 programs on a 132-SM GPU (0.3 ms each in GPT training).
    # Narrow XBLOCK until there are about two programs per SM, keeping >= 8 columns (32 B
    # rows of fp32) per load and a 4096-element tile.
    xb = 64
    while xb > 8 and -(-X // xb) < 2 * GPU_SMS:
        xb //= 2
    return True, False, xb, 4096 // xb, 8


GPU_SMS = 132      # an H100/H200; only sets how far column reductions split their columns


def render_kernel(plan: KernelPlan, r_contiguous: bool = True, blocks=None, nsizes: int = 0) -> KernelCode:
    """``blocks``: launch parameters fixed by the caller (as choose_blocks returns them);
    ``nsizes`` > 0: a shape-generic rendering (gpu/dynamic.py) whose kernel takes the size
    symbols ``ds0..`` as int64 arguments (the sizes in its text become expressions in them)."""
    from ..schedule import member_index
    kc = KernelCode()
    ov = [Var(f"x{d}", s) for d, s in enumerate(plan.outer)]
    two_d, persistent, XB, RB, nw = blocks or choose_blocks(plan, ov, r_contiguous)
    X = 1
    for s in plan.outer:
        X *= s
    kc.grid = max(1, -(-X // XB))
    kc.xnumel = X
    kc.nsizes = nsizes
    kc.num_warps, kc.xblock, kc.rblock, kc.persistent = nw, XB, RB, persistent
    k = TritonEmitter(two_d)
    k.xb = XB
    params: dict = {}

    def pname(buf):
        target = buf.target if isinstance(buf, ComputedBuffer) and buf.kind == "alias" else buf
        if target not in params:
            params[target] = f"p{len(params)}"    # positional: identical kernels dedupe
        return params[target]
    k.param = pname
    # generic kernels index in int64: no int32 bound holds for every size they may see
    big = bool(nsizes) or _needs_int64(plan)
    pid = "tl.program_id(0).to(tl.int64)" if big else "tl.program_id(0)"
    if two_d:
        k.line(f"xindex = {pid} * {XB} + tl.arange(0, {XB})[:, None]")
        k.line(f"xz = tl.zeros([{XB}, 1], tl.int32)")
        k.line(f"rbase = tl.arange(0, {RB})[None, :]")
        k.line(f"rz = tl.zeros([1, {RB}], tl.int32)")
        k.rlevel.update({"rbase", "rz"})
    else:
        k.line(f"xindex = {pid} * {XB} + tl.arange(0, {XB})")
        k.line(f"xz = tl.zeros([{XB}], tl.int32)")
    k.line(f"xmask = xindex < {X}")
    k.xvars = {"xindex", "xz"}
    stride = 1
    defs = []
    order = _x_order(plan, ov) if not two_d else list(range(len(ov)))
    for pos in range(len(order) - 1, -1, -1):
        v = ov[order[pos]]
        e = "xindex" if stride == 1 else f"(xindex // {stride})"
        if pos > 0:
            e = f"{e} % {v.size}"
        defs.append(f"{v.name} = {e}")
        k.xvars.add(v.name)
        stride *= v.size
    for line in reversed(defs):
        k.line(line)
    locals_here: dict = {}

    def hook(buf, ix):
        if buf in locals_here:
            return locals_here[buf]
        return None
    k.load_hook = hook
    rscope = {"defs": {}, "masks": {}}

    def r_vars(sizes, names, scope_key):
        """Define the IR vars ``names`` (row-major over ``sizes``) from rindex in this scope."""
        canon = rscope["defs"].get(tuple(sizes))
        if canon is None:
            canon = []
            st = 1
            lines = []
            for j in range(len(sizes) - 1, -1, -1):
                nm = k.tmp("rv")
                e = "rindex" if st == 1 else f"(rindex // {st})"
                if j > 0:
                    e = f"{e} % {sizes[j]}"
                lines.append(f"{nm} = {e}")
                canon.append(nm)
                st *= sizes[j]
            for line in reversed(lines):
                k.line(line)
            canon = list(reversed(canon))
            rscope["defs"][tuple(sizes)] = canon
            k.rlevel.update(canon)
        for n, c in zip(names, canon):
            k.alias[n] = c
            k.line(f"{n} = {c}")      # conditions of piecewise bodies name the IR vars
            k.rlevel.add(n)
        ext = 1
        for s in sizes:
            ext *= s
        mk = rscope["masks"].get(ext)
        if mk is None:
            mk = k.tmp("rmask")
            k.line(f"{mk} = rindex < {ext}")
            k.rlevel.add(mk)
            rscope["masks"][ext] = mk
        k.rmask = mk

    if two_d and persistent:
        k.line("rindex = rbase")
        k.rlevel.add("rindex")
    summary = []
    shares = _shared_loops(plan, ov) if not persistent else set()
    pending = []                  # reductions whose loop is still open: results come after it
    in_loop = False
    for j, m in enumerate(plan.members):
        tag = f"m{j}"
        idx, inner = member_index(m, ov, f"i_{tag}_")
        red = m.body if isinstance(m.body, Reduction) else None
        t_store = TL[m.dtype]
        ext = r_extent(m, ov)
        summary.append(f"{m.name}={m.origin or 'pointwise'}" + (f"[r{ext}]" if ext else ""))
        if ext == 0:
            # x level: one value per outer position
            k.rmask = None
            v = k.cast(m.body.fn(k, idx), m.dtype)
            _finish_x(k, m, idx, v, plan, locals_here, pname, tag=tag)
            continue
        looped = not persistent
        if looped and not in_loop:
            k.line(f"for r0 in range(0, {ext}, {RB}):")
            k.depth += 1
            k.push()
            k.line("rindex = r0 + rbase")
            k.rlevel.add("rindex")
            rscope = {"defs": {}, "masks": {}}
            in_loop = True
        if red is None:
            r_vars([v.size for v in inner], [v.name for v in inner], None)
            v = k.cast(m.body.fn(k, idx), m.dtype)
            _store(k, m, idx, v, pname, True)
        else:
            rv = [Var(f"r_{tag}_{d}", s) for d, s in enumerate(red.rsizes)]
            r_vars(list(red.rsizes), [x.name for x in rv], None)
            acc_dt = _acc_dtype(red)
            init = _init(red.rtype, acc_dt)
            val = k.cast(red.fn(k, idx, [IndexExpr.of(x) for x in rv]), red.acc_dtype)
            vexpr = _as_acc(val.expr, red.acc_dtype, acc_dt, k)
            full = f"xmask & {k.rmask}"
            arg = red.rtype in ("argmax", "argmin")
            if arg:
                flat = IndexExpr()
                mul = 1
                for x in reversed(rv):
                    flat = flat + IndexExpr.of(x) * mul
                    mul *= x.size
                iexpr = k._shaped(k.ix(flat), False, True, True)
            acc = f"acc_{tag}"
            if not looped:
                masked = f"tl.where({full}, {vexpr}, {init})"
                if arg:
                    k.line(f"{acc}_v = {masked}")
                    k.line(f"{acc}_i = tl.broadcast_to(({iexpr}).to(tl.int64), [{XB}, {RB}])")
                res = _reduce_expr(red.rtype, masked, acc)
            else:
                if arg:
                    # running (value, index) per lane, combined across lanes at the end
                    k.scopes[0].setdefault("__accs__", [])
                    pre = [f"{acc}_v = tl.full([{XB}, {RB}], {init}, {TL[acc_dt]})",
                           f"{acc}_i = tl.zeros([{XB}, {RB}], tl.int64)"]
                    _insert_before_loop(k, pre)
                    comb = f"t_{red.rtype}_combine"
                    k.line(f"{acc}_nv, {acc}_ni = {comb}({acc}_v, {acc}_i, tl.where({full}, {vexpr}, {init}), "
                           f"({iexpr}).to(tl.int64))")
                    k.line(f"{acc}_v = tl.where({full}, {acc}_nv, {acc}_v)")
                    k.line(f"{acc}_i = tl.where({full}, {acc}_ni, {acc}_i)")
                else:
                    _insert_before_loop(k, [f"{acc} = tl.full([{XB}, {RB}], {init}, {TL[acc_dt]})"])
                    k.line(f"{acc} = {_combine(red.rtype, acc, f'tl.where({full}, {vexpr}, {init})')}")
                res = _reduce_expr(red.rtype, acc, acc)
            pending.append((m, idx, tag, res, acc_dt, arg))
            if looped and j in shares:
                continue          # the next member accumulates in the same loop
            if looped:
                k.pop()
                k.depth -= 1
                k.rmask = None
                in_loop = False
            for pm, pidx, ptag, pres, pacc, parg in pending:
                _reduction_result(k, pm, pidx, ptag, pres, pacc, parg, plan, locals_here, pname)
            pending = []
            continue
        if looped:
            k.pop()
            k.depth -= 1
            k.rmask = None
            in_loop = False
        if m in plan.barrier_after:
            k.line("tl.debug_barrier()")
    kc.params = list(params)
    sizes = [f"ds{i}" for i in range(nsizes)]
    sig = ", ".join([params[b] for b in kc.params] + sizes)
    if sizes:
        # Why: the JIT specialises integer arguments by value (== 1, divisible by 16); a
        # kernel compiled at one size must not carry such an assumption to the others
        head = [f"@triton.jit(do_not_specialize={sizes!r})", f"def KERNEL_NAME({sig}):"]
    else:
        head = ["@triton.jit", f"def KERNEL_NAME({sig}):"]
    kc.body = "\n".join(head + k.lines) + "\n"
    kc.summary = ", ".join(summary)
    del t_store
    return kc


def _x_order(plan: KernelPlan, ov) -> list:
    """Outer dims from slowest to fastest varying along xindex: the memory order of the
    first buffer the kernel writes. Why: a cast into a transposed layout (a weight for a
    matmul) iterated in logical order writes (and reads) with a stride of a whole row."""
    from ..schedule import member_index
    for m in plan.members:
        if m.kind not in ("py", "alias"):
            continue
        idx, _ = member_index(m, ov, "o")
        st = {}
        for i, s in zip(idx, m.strides):
            for a, c in i.terms:
                if isinstance(a, Var) and a.name.startswith("x"):
                    st[a.name] = abs(s)
        d_stride = [st.get(v.name, 0) for v in ov]
        return sorted(range(len(ov)), key=lambda d: (-d_stride[d], d))
    return list(range(len(ov)))


def _insert_before_loop(k: TritonEmitter, lines):
    """Accumulator initialisations go just before the innermost open ``for``."""
    for i in range(len(k.lines) - 1, -1, -1):
        if k.lines[i].lstrip().startswith("for r0 in range("):
            ind = k.lines[i][:len(k.lines[i]) - len(k.lines[i].lstrip())]
            k.lines[i:i] = [ind + ln for ln in lines]
            return
    raise AssertionError("no loop open")


def _shared_loops(plan: KernelPlan, ov) -> set:
    """The members ``j`` of a looped kernel whose reduction loop also runs member ``j + 1``:
    runs of reductions over the same r extent where none reads another of its run.

    Why: each loop reads its inputs from memory again. A BatchNorm backward's two sums over
    (grad, input), or a variance's sums of deviations and of their squares, made one pass
    each over the same activation; in one loop the loads common to them are issued once
    (the emitter's common-subexpression scope is the loop's), so a tensor is read once."""
    from ..schedule import _reads
    shares, run = set(), []
    for j, m in enumerate(plan.members):
        red = m.body if isinstance(m.body, Reduction) else None
        ext = r_extent(m, ov)
        ok = red is not None and ext > 0 and red.rtype not in ("argmax", "argmin")
        if ok and run:
            prev = plan.members[run[-1]]
            # (a reduction's value is read by later members from its register, never
            # from memory: barrier_after does not concern it)
            if (ext == r_extent(prev, ov) and tuple(red.rsizes) == tuple(prev.body.rsizes)
                    and not _reads(m) & {plan.members[i] for i in run}):
                shares.add(run[-1])
                run.append(j)
                continue
        run = [j] if ok else []
    return shares


def _reduction_result(k, m, idx, tag, res, acc_dt, arg, plan, locals_here, pname):
    """A reduction member's value at x level, once its loop (or tile) is done."""
    name = f"v_{tag}"
    k.line(f"{name} = {res}")
    out_dt = m.dtype
    if out_dt == torch.bool:
        k.line(f"{name} = {name} != 0")
    elif phys(out_dt) != acc_dt and not arg:
        k.line(f"{name} = {name}.to({TL[phys(out_dt)]})")
    if out_dt in HALF:
        k.line(f"{name} = {name}.to({TL[out_dt]}).to(tl.float32)")
    k.rmask = None
    _finish_x(k, m, idx, ScalarExpr(name, m.dtype), plan, locals_here, pname, named=True, tag=tag)


def _finish_x(k, m, idx, v: ScalarExpr, plan, locals_here, pname, named=False, tag="m"):
    """An x-level member value: keep it in a register for later members, store it if needed."""
    name = v.expr
    if not named:
        if v.expr in k.consts:
            shape = f"[{k.xb}, 1]" if k.two_d else f"[{k.xb}]"
            name = f"v_{tag}"
            k.line(f"{name} = tl.full({shape}, {v.expr}, {TL[phys(m.dtype)]})")
        elif not re.fullmatch(r"[A-Za-z_]\w*", v.expr):
            name = f"v_{tag}"
            k.line(f"{name} = {v.expr}")
    locals_here[m] = ScalarExpr(name, m.dtype)
    if m not in plan.local:
        _store(k, m, idx, ScalarExpr(name, m.dtype), pname, False)


def _store(k: TritonEmitter, m, idx, v: ScalarExpr, pname, r_level: bool):
    ix = m.index(idx)
    target = m.target if m.kind == "alias" else m
    ix = IndexExpr.of(ix) - target.offset
    hx, hr = k._levels(ix)
    want_r = k.two_d and r_level
    s = k._shaped(k.ix(ix), hx, hr, want_r)
    mask = "xmask" + (f" & {k.rmask}" if want_r and k.rmask else "")
    val = v.expr
    dt = m.dtype
    if val in k.consts:
        val = f"tl.full({'[1, 1]' if k.two_d else '[1]'}, {val}, {TL[phys(dt)]})"
    val = f"{val}.to({TL[dt]})"
    k.line(f"tl.store({pname(m)} + ({s}), {val}, {mask})")


def _acc_dtype(red: Reduction):
    dt = red.acc_dtype
    if dt in HALF or dt == torch.float64 and red.rtype in ("sum", "prod"):
        # fp64 was chosen for long C++ sums in one accumulator; tiles of partial sums
        # reduced as a tree are accurate in fp32 (eager's CUDA sums do the same).
        return torch.float32 if dt in HALF else dt
    if dt == torch.bool:
        return torch.int32
    return dt


def _as_acc(expr, dt, acc_dt, k):
    if phys(dt) == acc_dt:
        return expr
    if expr in k.consts:
        return expr
    return f"{expr}.to({TL[acc_dt]})"


def _init(rtype, dt) -> str:
    if rtype == "sum":
        return "0" if not dt.is_floating_point else "0.0"
    if rtype == "prod":
        return "1" if not dt.is_floating_point else "1.0"
    if dt.is_floating_point:
        return 'float("-inf")' if rtype in ("max", "argmax") else 'float("inf")'
    info = torch.iinfo(dt)
    return str(info.min) if rtype in ("max", "argmax") else str(info.max)


def _combine(rtype, a, b) -> str:
    if rtype == "sum":
        return f"{a} + {b}"
    if rtype == "prod":
        return f"{a} * {b}"
    return f"t_{rtype}({a}, {b})"


def _reduce_expr(rtype, tile, acc) -> str:
    if rtype == "sum":
        return f"tl.sum({tile}, 1)[:, None]"
    if rtype == "prod":
        return f"tl.reduce({tile}, 1, t_mul)[:, None]"
    if rtype in ("max", "min"):
        return f"tl.reduce({tile}, 1, t_{rtype})[:, None]"
    # argmax / argmin: the tile is {acc}_v with indices {acc}_i
    return f"tl.reduce(({acc}_v, {acc}_i), 1, t_{rtype}_combine)[1][:, None]"


def _needs_int64(plan: KernelPlan) -> bool:
    lim = 2 ** 31 - 1
    X = 1
    for s in plan.outer:
        X *= s
    if X * 2048 > lim:
        return True
    from ..schedule import _reads
    bufs = set(plan.members)
    for m in plan.members:
        bufs |= _reads(m)
    for b in bufs:
        span = b.offset
        for s, st in zip(b.sizes, b.strides):
            span += (s - 1) * abs(st)
        if span > lim or b.numel > lim:
            return True
    return False
