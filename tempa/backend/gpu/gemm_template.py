"""The Triton GEMM template: a tiled ``tl.dot`` kernel with the epilogue rendered into its store.

One program computes a BLOCK_M x BLOCK_N tile of the output (of one batch entry for bmm):

  program order  the flat program id is walked in *groups* of GROUP_M tile rows, so the
                 programs running together share A row panels and B column panels in L2
  main loop      K in steps of BLOCK_K; operands addressed through their strides (any
                 layout: transposed, sliced, broadcast); fp32 accumulator. A ragged M or N
                 wraps its row/column index (``% M``), so operand loads need no mask; only
                 a ragged K masks (with zeros, which add nothing)
  epilogue       the accumulator (times alpha, plus beta * bias for addmm), rounded to the
                 output dtype as the library's result would be, is the value of the matmul's
                 output buffer: the fused kernel's members (pointwise IR bodies) are
                 rendered over the tile by the ordinary TritonEmitter, with that buffer's
                 loads answered from registers. Stores are masked to the real M x N.

Shapes, strides and block sizes are literals in the source (one kernel text per site and
configuration; kernel parameters are only pointers, as for every tempa kernel), so Triton
sees exact strides and can vectorise and pipeline the loads.

fp32 operands use TF32 only where torch.backends.cuda.matmul.allow_tf32 allows it (eager's
rule); otherwise ``input_precision="ieee"``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..codegen.triton_emit import TL, TritonEmitter, literal, phys
from ..index import Indirect, IndexExpr, Var
from ..ir import ScalarExpr
from ..lower.core import bcast
from ..schedule import member_index

HALF = (torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3

    @property
    def label(self) -> str:
        return (f"{self.block_m}x{self.block_n}x{self.block_k} g{self.group_m} "
                f"w{self.num_warps} s{self.num_stages}")


class GemmCode:
    """A rendered template instance; quacks like codegen.triton.KernelCode for the wrapper."""
    tag = "gemm"
    rblock = 0
    xblock = 0
    persistent = True

    def __init__(self, config: GemmConfig):
        self.config = config
        self.name = ""
        self.body = ""
        self.params: list = []
        self.grid = 1
        self.num_warps = config.num_warps
        self.num_stages = config.num_stages
        self.summary = ""


def allow_tf32() -> bool:
    try:
        return bool(torch.backends.cuda.matmul.allow_tf32)
    except Exception:  # noqa: BLE001 - an older/newer torch without the flag: be exact
        return False


def render(site, cfg: GemmConfig, interpret: bool = False, tf32: bool | None = None) -> GemmCode:
    BM, BN, BK = cfg.block_m, cfg.block_n, cfg.block_k
    M, N, K = site.m, site.n, site.k
    kc = GemmCode(cfg)
    tiles_m, tiles_n = -(-M // BM), -(-N // BN)
    tiles = tiles_m * tiles_n
    kc.grid = site.batch * tiles
    k = TileEmitter(two_d=False)
    params: dict = {}

    def pname(buf):
        target = buf.target if getattr(buf, "kind", None) == "alias" else buf
        if target not in params:
            params[target] = f"p{len(params)}"
        return params[target]
    k.param = pname
    big = _needs_int64(site)
    L = k.line
    # -- which tile: grouped ordering of the flat program id ---------------------------------
    L("g_pid = tl.program_id(0)")
    if site.op == "bmm":
        L(f"g_bat = g_pid // {tiles}")
        L(f"g_pid = g_pid % {tiles}")
        if big:
            L("g_bat = g_bat.to(tl.int64)")
    gm = max(1, min(cfg.group_m, tiles_m))
    L(f"g_group = g_pid // {gm * tiles_n}")
    L(f"g_first_m = g_group * {gm}")
    L(f"g_rows = tl.minimum({tiles_m} - g_first_m, {gm})")
    L(f"g_pid_m = g_first_m + (g_pid % {gm * tiles_n}) % g_rows")
    L(f"g_pid_n = (g_pid % {gm * tiles_n}) // g_rows")
    cast = ".to(tl.int64)" if big else ""
    L(f"g_rm = (g_pid_m * {BM} + tl.arange(0, {BM})){cast}")
    L(f"g_rn = (g_pid_n * {BN} + tl.arange(0, {BN})){cast}")
    L(f"g_rk = tl.arange(0, {BK}){cast}")
    # a ragged edge wraps (rows past M re-read row 0..): loads stay in bounds without masks
    L(f"g_am = g_rm % {M}" if M % BM else "g_am = g_rm")
    L(f"g_bn = g_rn % {N}" if N % BN else "g_bn = g_rn")
    # -- operand pointers -----------------------------------------------------------------
    a_ptr = _operand_ptr(site.a, pname, "g_am[:, None]", "g_rk[None, :]", site.op == "bmm")
    b_ptr = _operand_ptr(site.b, pname, "g_rk[:, None]", "g_bn[None, :]", site.op == "bmm")
    L(f"g_a = {a_ptr}")
    L(f"g_b = {b_ptr}")
    sak, sbk = site.a.strided[1][-1], site.b.strided[1][-2]
    L(f"g_acc = tl.zeros([{BM}, {BN}], dtype=tl.float32)")
    L(f"for g_k in range(0, {-(-K // BK)}):")
    k.depth += 1
    if K % BK:
        L(f"g_kleft = {K} - g_k * {BK}")
        L("g_x = tl.load(g_a, mask=g_rk[None, :] < g_kleft, other=0.0)")
        L("g_y = tl.load(g_b, mask=g_rk[:, None] < g_kleft, other=0.0)")
    else:
        L("g_x = tl.load(g_a)")
        L("g_y = tl.load(g_b)")
    if interpret and site.dtype in HALF:
        # the interpreter's dot reads half operands' bits wrongly: exact products in fp32
        L("g_x = g_x.to(tl.float32)")
        L("g_y = g_y.to(tl.float32)")
    prec = ""
    if site.dtype == torch.float32 and not interpret:
        use_tf32 = allow_tf32() if tf32 is None else tf32
        prec = ', input_precision="tf32"' if use_tf32 else ', input_precision="ieee"'
    L(f"g_acc = tl.dot(g_x, g_y, g_acc{prec})")
    L(f"g_a += {BK * sak}")
    L(f"g_b += {BK * sbk}")
    k.depth -= 1
    # -- epilogue ---------------------------------------------------------------------------
    L(f"xz = tl.zeros([{BM}, {BN}], tl.int32)")
    L(f"g_mmask = g_rm[:, None] < {M}")
    L(f"g_nmask = g_rn[None, :] < {N}")
    L("xmask = g_mmask & g_nmask")
    # the output's index variables keep their own shapes (a row vector, a column vector, the
    # batch a scalar): a bias indexed by the column alone is then loaded once per column
    outer = ["g_bat"] if site.op == "bmm" else []
    outer += ["g_rm[:, None]", "g_rn[None, :]"]
    ov = [Var(f"x{d}", s) for d, s in enumerate(site.out.sizes)]
    for v, e in zip(ov, outer):
        L(f"{v.name} = {e}")
    k.xvars = {"xz"} | {v.name for v in ov}
    k.row, k.col = ov[-2].name, ov[-1].name
    k.xb = BM * BN
    idx = [IndexExpr.of(v) for v in ov]
    val = "g_acc"
    if site.alpha != 1:
        L(f"g_acc = g_acc * {literal(site.alpha, torch.float32)}")
    if site.bias is not None:
        bias = k.cast(bcast(site.bias, site.out.sizes)(k, idx), torch.float32)
        term = bias.expr if site.beta == 1 else f"{bias.expr} * {literal(site.beta, torch.float32)}"
        L(f"g_val = g_acc + {term}")
        val = "g_val"
    if site.dtype in HALF:
        # round as the library's result is rounded: the epilogue sees what eager would read
        L(f"g_out = {val}.to({TL[site.dtype]}).to(tl.float32)")
        val = "g_out"
    result = ScalarExpr(val, site.dtype)
    if site.store_out:
        _store(k, site.out, site.out.index(idx), result, pname)
    summary = [f"{site.op} {'%dx' % site.batch if site.op == 'bmm' else ''}{M}x{K}x{N} [{cfg.label}]"]
    if site.epilogue is not None:
        summary.append(_render_epilogue(k, site, ov, result, pname, f"[{BM}, {BN}]"))
    kc.params = list(params)
    sig = ", ".join(params[b] for b in kc.params)
    kc.body = "\n".join(["@triton.jit", f"def KERNEL_NAME({sig}):"] + k.lines) + "\n"
    kc.summary = " + ".join(summary)
    return kc


class TileEmitter(TritonEmitter):
    """The emitter over a GEMM tile: a load takes the shape its index has ([BM, 1], [1, BN],
    [1, 1] or the whole tile) with the mask of that shape; Triton broadcasts the values.
    Why: loading a bias row as a whole [BM, BN] tile repeats its load BM times per program."""
    row = col = ""

    def load(self, buf, ix):
        self.loads.append((buf, ix))
        if self.load_hook is not None:
            hooked = self.load_hook(buf, ix)
            if hooked is not None:
                return hooked
        ix = IndexExpr.of(ix) - buf.offset
        names = {getattr(a, "name", None) for a in ix.vars()}
        if self.masks or any(isinstance(a, Indirect) for a in ix.vars()):
            # a piecewise branch or a gathered index: whole-tile shapes, as the base emitter does
            self.loads.pop()
            return super().load(buf, ix + buf.offset)
        s = self.ix(ix)
        rows, cols = self.row in names, self.col in names
        if rows and cols:
            ptr, mask = s, "xmask"
        elif rows:
            ptr, mask = s, "g_mmask"
        elif cols:
            ptr, mask = s, "g_nmask"
        else:
            ptr, mask = f"{s} + tl.zeros([1, 1], tl.int32)", None
        expr = f"tl.load({self.param(buf)} + ({ptr})" + (f", mask={mask}, other=0)" if mask else ")")
        if buf.dtype in HALF:
            expr += ".to(tl.float32)"
        return ScalarExpr(self._cse(expr, False), buf.dtype)


def _operand_ptr(tv, pname, row: str, col: str, batched: bool) -> str:
    """``param + offset + row*stride + col*stride (+ batch*stride)`` for an operand view."""
    buf, strides, offset = tv.strided
    terms = []
    base = offset - buf.offset          # kernel pointers point at the buffer's first element
    if base:
        terms.append(str(base))
    if batched:
        terms.append(f"g_bat * {strides[0]}")
    terms.append(f"{row} * {strides[-2]}")
    terms.append(f"{col} * {strides[-1]}")
    return f"{pname(buf)} + ({' + '.join(terms)})"


def _render_epilogue(k: TritonEmitter, site, ov, result: ScalarExpr, pname, tile: str) -> str:
    """The fused kernel's members over the tile; loads of the matmul output read ``result``."""
    out = site.out
    values: dict = {}

    def hook(buf, ix):
        if buf is out:
            return result
        return values.get(buf)          # an earlier member of this kernel: its register
    k.load_hook = hook
    names = []
    for j, m in enumerate(site.epilogue.members):
        idx, inner = member_index(m, ov, f"i_e{j}_")
        assert not inner, "epilogue members are pointwise over the output (gemm.epilogue_problem)"
        v = k.cast(m.body.fn(k, idx), m.dtype)
        name = v.expr
        if v.expr in k.consts:
            name = f"v_e{j}"
            k.line(f"{name} = tl.full({tile}, {v.expr}, {TL[phys(m.dtype)]})")
        values[m] = ScalarExpr(name, m.dtype)
        if m.kind != "local":
            _store(k, m, m.index(idx), values[m], pname)
        names.append(m.origin or "pointwise")
    k.load_hook = None
    return "epilogue " + ", ".join(names)


def _store(k: TritonEmitter, buf, ix, v: ScalarExpr, pname):
    target = buf.target if getattr(buf, "kind", None) == "alias" else buf
    ix = IndexExpr.of(ix) - target.offset
    s = k._shaped(k.ix(ix), *k._levels(ix), False)
    k.line(f"tl.store({pname(buf)} + ({s}), {v.expr}.to({TL[buf.dtype]}), xmask)")


def _needs_int64(site) -> bool:
    """Offsets past 2**31 elements anywhere the kernel addresses: index in int64."""
    lim = 2 ** 31 - 1
    bufs = {site.a.strided[0], site.b.strided[0], site.out}
    if site.bias is not None:
        bufs.add(site.bias.strided[0])
    if site.epilogue is not None:
        from ..schedule import _reads
        for m in site.epilogue.members:
            bufs.add(m)
            bufs |= _reads(m)
    for b in bufs:
        span = b.offset + getattr(b, "base_offset", 0)
        for s, st in zip(b.sizes, b.strides):
            span += (s - 1) * abs(st)
        if span > lim:
            return True
    return False
