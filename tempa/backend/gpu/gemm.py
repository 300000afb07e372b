"""GEMM sites for mode="max-autotune": a matmul extern call and the pointwise kernel after it.

After partitioning, a graph is a list of extern calls and Triton kernels. A *site* is an
``aten.mm`` / ``aten.addmm`` / ``aten.bmm`` extern call that a Triton GEMM template
(gemm_template.py) can replace, plus its *epilogue*: the kernel right after it, when every
member of that kernel is pointwise over the matmul's output and reads that output only at
the element it writes (bias add, GELU, ReLU, residual add, a cast, a scale...). Rendered
into the template's store, the epilogue runs on the accumulator tile while it is still in
registers, so the matmul's output goes to memory only when something else reads it.

The choice between the library call (cuBLAS, with the epilogue as its own kernel) and the
template configurations is made by measurement (gemm_tune.py, runtime/autotune.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..codegen import triton as tr
from ..index import Var
from ..ir import ComputedBuffer, ExternCall, Reduction, LoopValue
from ..schedule import _extern_buffers, _reads, member_index, probe_loads

aten = torch.ops.aten
GEMM_OPS = {aten.mm.default: "mm", aten.addmm.default: "addmm", aten.bmm.default: "bmm"}
TEMPLATE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# The template walks the batch of a bmm in its one grid axis: keep the grid within CUDA's
# x limit with room to spare.
MAX_PROGRAMS = 2 ** 31 - 1


@dataclass(eq=False)
class GemmSite:
    """One matmul the template may compute, and what it would fuse."""
    call: ExternCall
    op: str                        # "mm" | "addmm" | "bmm"
    a: LoopValue                          # [B,] M x K operand (a strided view of a buffer)
    b: LoopValue                          # [B,] K x N operand
    bias: LoopValue | None                # addmm's input
    alpha: float
    beta: float
    out: object                    # the extern's output Buffer
    batch: int
    m: int
    n: int
    k: int
    epilogue: object = None        # the KernelPlan fused into the store, or None
    epilogue_code: object = None   # its own KernelCode (the library candidate runs it)
    store_out: bool = True         # the matmul's result is read elsewhere too

    @property
    def dtype(self):
        return self.out.dtype

    @property
    def members(self):
        """Buffers the template writes (the wrapper's debugging check reads them)."""
        ms = list(self.epilogue.members) if self.epilogue is not None else []
        return ([self.out] if self.store_out else []) + [m for m in ms if m.kind != "local"]

    def describe(self) -> str:
        shape = f"{self.batch}x" if self.op == "bmm" else ""
        shape += f"{self.m}x{self.k}x{self.n}"
        dt = str(self.dtype).replace("torch.", "")
        epi = ""
        if self.epilogue is not None:
            origins = [m.origin or "pointwise" for m in self.epilogue.members]
            epi = " +epilogue(" + ", ".join(dict.fromkeys(origins)) + ")"
        return f"{self.op} {shape} {dt}{epi}"


def template_applies(call: ExternCall) -> GemmSite | None:
    """The site for ``call`` when the template can compute it, else None."""
    op = GEMM_OPS.get(call.op)
    if op is None or call.multi or call.fallback:
        return None
    out = call.outputs[0]
    if out is None or out.dtype not in TEMPLATE_DTYPES:
        return None
    if op == "addmm":
        bias, a, b = call.args[:3]
        alpha = call.kwargs.get("alpha", 1)
        beta = call.kwargs.get("beta", 1)
        if not isinstance(bias, LoopValue) or bias.strided is None:
            return None
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (alpha, beta)):
            return None
    else:
        a, b = call.args[:2]
        bias, alpha, beta = None, 1, 1
    if not (isinstance(a, LoopValue) and isinstance(b, LoopValue)) or a.strided is None or b.strided is None:
        return None
    if a.dtype != out.dtype or b.dtype != out.dtype:
        return None
    if op == "bmm":
        batch, m, k = a.sizes
        n = b.sizes[2]
    else:
        batch = 1
        m, k = a.sizes
        n = b.sizes[1]
    # every output dim > 1: the epilogue's outer loop space is then exactly the output's
    # shape (the scheduler drops unit dims); matrix-vector shapes stay with the library
    if min(m, n, k) < 2 or (op == "bmm" and batch < 2) or tuple(out.sizes) != \
            ((batch, m, n) if op == "bmm" else (m, n)):
        return None
    if batch * ((m + 15) // 16) * ((n + 15) // 16) > MAX_PROGRAMS:
        return None
    return GemmSite(call, op, a, b, bias, float(alpha), float(beta), out, batch, m, n, k)


def epilogue_problem(site: GemmSite, kp) -> str | None:
    """None if kernel plan ``kp`` can run inside ``site``'s store, else why not."""
    out = site.out
    if not isinstance(kp, tr.KernelPlan):
        return "not a kernel"
    if tuple(kp.outer) != tuple(out.sizes):
        return f"iterates {list(kp.outer)}, not the matmul's output {list(out.sizes)}"
    ov = [Var(f"x{d}", s) for d, s in enumerate(kp.outer)]
    reads_out = False
    for m in kp.members:
        if not isinstance(m, ComputedBuffer) or m.kind == "alias":
            return f"{m.name} writes into an input"
        if isinstance(m.body, Reduction):
            return f"{m.name} is a reduction"
        if tr.r_extent(m, ov) != 0:
            return f"{m.name} has inner dims"
        loads, _, _ = probe_loads(m, ov, "e")
        want_idx, _ = member_index(out, ov, "o")
        want = out.index(want_idx)
        for buf, ix in loads:
            if buf is out:
                reads_out = True
                if ix != want:
                    return f"{m.name} reads the matmul output at {ix.c()}, not the current element"
    if not reads_out:
        return "does not read the matmul's output"
    return None


def find_sites(items: list, lowered) -> list:
    """Replace each templatable matmul extern in ``items`` (ExternCall | (KernelPlan,
    KernelCode)) by a GemmSite, fusing the next kernel as its epilogue when legal. Returns the
    new item list: GemmSite | ExternCall | (KernelPlan, KernelCode)."""
    readers = _readers(items, lowered)
    out = []
    i = 0
    while i < len(items):
        it = items[i]
        site = template_applies(it) if isinstance(it, ExternCall) else None
        if site is None:
            out.append(it)
            i += 1
            continue
        nxt = items[i + 1] if i + 1 < len(items) else None
        if isinstance(nxt, tuple) and epilogue_problem(site, nxt[0]) is None:
            site.epilogue, site.epilogue_code = nxt
            site.store_out = any(r != i + 1 for r in readers.get(site.out, ()))
            i += 2
        else:
            i += 1
        out.append(site)
    return out


def _readers(items, lowered) -> dict:
    """buffer -> item positions that read it ("py" for graph outputs)."""
    readers: dict = {}
    for i, it in enumerate(items):
        if isinstance(it, ExternCall):
            for b in _extern_buffers(it.args, it.kwargs):
                readers.setdefault(b, set()).add(i)
        else:
            for m in it[0].members:
                for b in _reads(m):
                    readers.setdefault(b, set()).add(i)
    for v in lowered.outputs:
        if isinstance(v, LoopValue) and v.strided is not None:
            readers.setdefault(v.strided[0], set()).add("py")
    return readers
