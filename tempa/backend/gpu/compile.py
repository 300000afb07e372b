"""One functional ATen graph on CUDA -> Triton kernels + one generated wrapper function:
the Triton target of the backend's pipeline (pipeline.py lists the passes).

``TritonTarget`` differs from the C++ target in data (bf16/fp16 admitted, shared values
stored sooner, small addmms as mm + a fused bias) and in its own passes: ``partition``
(each group -> one Triton kernel, or one per member where a group mixes shapes a single
program cannot hold), ``plan_memory`` (register vs global memory), ``render``
(codegen/triton.py, identical kernels shared), ``autotune`` (max-autotune: each matmul with
the pointwise kernel after it -> a GEMM template with that kernel as its epilogue, or
cuBLAS + the kernel, whichever measured faster) and ``finish`` (every kernel of every plan
compiled at once, in parallel (kernels.py), then the wrappers (wrapper.py)).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ... import counters, logs
from ...configuration import config
from ..codegen import triton as tr
from ..codegen.triton_emit import EXTRA_DTYPES
from ..compile_graph import CompiledGraphInfo
from ..ir import ExternCall, Reduction, LoopValue
from ..lower.trace import UntraceableGraph
from ..pipeline import Target, memory_summary, plan_graph as run_passes
from ..schedule import _extern_buffers, _reads, nonunit, probe_loads
from ..index import Var
from . import kernels as K
from . import wrapper as W
aten = torch.ops.aten

# Library calls (not gaps in the IR): reported as extern, not as ATen fallbacks.
GPU_EXTERNS = {
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_flash_attention_backward.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_efficient_attention_backward.default,
    aten._scaled_dot_product_cudnn_attention.default,
    aten._scaled_dot_product_cudnn_attention_backward.default,
    aten._flash_attention_forward.default, aten._flash_attention_backward.default,
    aten._efficient_attention_forward.default, aten._efficient_attention_backward.default,
    aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
    aten.convolution.default, aten.convolution_backward.default,
    aten.embedding_dense_backward.default,
}


@dataclass
class GpuGraphInfo(CompiledGraphInfo):
    triton_source: str = ""
    kernels: list = field(default_factory=list)     # one summary line per launch
    unique_kernels: int = 0
    launch: str = ""                                # "direct" | "jit"
    autotune: list = field(default_factory=list)

    def summary(self) -> str:
        return (f"{len(self.kernels)} Triton launches ({self.unique_kernels} distinct kernels), "
                f"{len(self.extern_calls)} extern calls, {len(self.aten_fallbacks)} ATen fallbacks")


@dataclass
class GpuPlan:
    lowered: object
    items: list                    # ExternCall | (KernelPlan, KernelCode)
    info: GpuGraphInfo
    num_inputs: int
    label: str
    param_inputs: set              # input indices that were nn.Parameters at trace time
    autotune: object = None
    not_fused: list = field(default_factory=list)
    generic_wrapper: tuple = None  # (source, constants) of a shape-generic template


def partition(sched) -> list:
    out = []
    for it in sched.items:
        if isinstance(it, ExternCall):
            out.append(it)
            continue
        ov = [Var(f"x{d}", s) for d, s in enumerate(it.outer)]
        exts = []
        split = False
        for m in it.members:
            inner, rs = tr.member_extent(m, ov)
            if inner and rs:
                split = True
            exts.append((bool(inner), bool(rs)))
        if not any(r for _, r in exts) and any(i for i, _ in exts):
            split = True            # pointwise group of mixed ranks: flat 1-D kernels are simpler
        if split:
            for m in it.members:
                out.append(tr.KernelPlan(nonunit(m.sizes), [m]))
        else:
            out.append(tr.KernelPlan(it.outer, it.members))
    return out


def plan_memory(items, lowered):
    kernel_of = {}
    for i, it in enumerate(items):
        if isinstance(it, tr.KernelPlan):
            for m in it.members:
                kernel_of[m] = i
    readers: dict = {}
    for i, it in enumerate(items):
        if isinstance(it, ExternCall):
            for b in _extern_buffers(it.args, it.kwargs):
                readers.setdefault(b, set()).add("py")
        else:
            for m in it.members:
                for b in _reads(m):
                    readers.setdefault(b, set()).add(i)
    for v in lowered.outputs:
        if isinstance(v, LoopValue) and v.strided is not None:
            readers.setdefault(v.strided[0], set()).add("py")
    for i, it in enumerate(items):
        if not isinstance(it, tr.KernelPlan):
            continue
        ov = [Var(f"x{d}", s) for d, s in enumerate(it.outer)]
        for m in it.members:
            if m.kind == "alias":
                continue
            rs = readers.get(m, set())
            ext = tr.r_extent(m, ov)
            if any(r != i for r in rs):
                m.kind = "py"
            elif ext == 0:
                m.kind = "local"
                it.local.add(m)
            else:
                m.kind = "py"          # scratch for a later member of this kernel
            if ext and i in rs:
                it.barrier_after.add(m)


def _r_contiguous(kp) -> bool:
    ov = [Var(f"x{d}", s) for d, s in enumerate(kp.outer)]
    for m in kp.members:
        if tr.r_extent(m, ov) == 0:
            continue
        loads, idx, inner = probe_loads(m, ov, "q")
        if isinstance(m.body, Reduction):
            last = f"qr{len(m.body.rsizes) - 1}"
        elif inner:
            last = inner[-1].name
        else:
            continue
        for _, ix in loads:
            for a, c in ix.terms:
                if isinstance(a, Var) and a.name == last and abs(c) == 1:
                    return True
        return False
    return True


# ~0.7 µs of H200 bf16 matmul: below it an addmm's host cost outweighs its GPU time, so it
# runs as mm + a fused bias add (lower/core.py LowerOptions says why).
ADDMM_AS_MM_LIMIT = 1 << 28


class TritonTarget(Target):
    """The Triton renderer's passes of pipeline.GRAPH_PASSES, and its finish."""
    name = "triton"
    gpu_schedule = True
    # a value with several users that reads this many buffers is stored once (lower_graph)
    shared_reads = 3
    addmm_as_mm_macs = ADDMM_AS_MM_LIMIT
    extra_dtypes = EXTRA_DTYPES
    in_place_within_kernel = False  # a member's elements may sit on other threads
    channels_last_stores = True

    @property
    def split_reduction_results(self) -> int:
        """lower/reductions.split_plan: a reduction with fewer results is split, so that it
        runs as about two programs of 8 result columns per SM (config.gpu_split_reductions)."""
        return 16 * tr.GPU_SMS if config.gpu_split_reductions else 0

    def lower(self, job):
        out = super().lower(job)
        _refuse_host_reads(job.gm, job.lowered)
        for cb in job.lowered.copy_backs:
            cb.target._mutated = True      # written in place: no alignment assumption
        for st in job.lowered.steps:
            if isinstance(st, ExternCall) and st.op in GPU_EXTERNS:
                st.fallback = False
        return out

    def partition(self, job):
        job.parts = partition(job.sched)
        return f"{sum(isinstance(p, tr.KernelPlan) for p in job.parts)} kernels"

    def plan_memory(self, job):
        plan_memory(job.parts, job.lowered)
        return memory_summary(job.lowered.steps)

    def render(self, job):
        job.items = []
        for it in job.parts:
            if isinstance(it, ExternCall):
                job.items.append(it)
            else:
                it.r_contiguous = _r_contiguous(it)
                job.items.append((it, tr.render_kernel(it, it.r_contiguous)))
        return _Kernels(job.items)

    def autotune(self, job):
        autotune = job.settings.get("autotune")
        job.tuned_from = len(autotune.log) if autotune is not None else 0
        if autotune is None:
            return None
        # max-autotune: matmuls become GEMM templates with their epilogue fused, where
        # that measures faster than cuBLAS + the separate epilogue kernel
        from . import gemm_tune
        job.items = gemm_tune.tune(job.items, job.lowered, autotune, K.interpret_mode())
        return "\n".join(autotune.log[job.tuned_from:])

    def make_plan(self, job) -> GpuPlan:
        lowered, items, autotune = job.lowered, job.items, job.settings.get("autotune")
        info = GpuGraphInfo()
        if autotune is not None:
            info.autotune = autotune.log[job.tuned_from:]
        info.aten_fallbacks = list(lowered.fallbacks)
        info.extern_calls = list(lowered.externs)
        info.kernel_count = sum(1 for it in items if not isinstance(it, ExternCall))
        info.mutated_inputs = list(job.mutated)
        info.segment_count = info.kernel_count
        job.kept["render"] = _Kernels(items)
        info.passes = job.kept
        plan = GpuPlan(lowered, items, info, job.num_inputs, job.label,
                       set(job.settings.get("param_inputs", ())), autotune, list(job.sched.report))
        _report(plan)
        return plan

    def finish(self, plans: list) -> list:
        return finish(plans)


TRITON = TritonTarget()


class _Kernels:
    """The rendered Triton kernels of one plan, printable (their final names come in finish)."""

    def __init__(self, items):
        self.items = items

    def __str__(self):
        return "\n\n".join(it[1].body for it in self.items if isinstance(it, tuple))


def _refuse_host_reads(gm, lowered):
    """A CUDA graph whose kernels would read or write a CPU tensor runs as ATen calls (eager
    lets a CPU 0-d tensor take part as a scalar: the step counters of a non-capturable Adam,
    which its step also increments). Why: a Triton kernel cannot touch host memory
    ("Pointer argument cannot be accessed from Triton"). CPU tensors only ATen calls take
    stay as they are; a graph of CPU tensors only is Triton's interpreter at work. To do:
    pass such 0-d values as scalar kernel arguments."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    devices = [getattr(n.meta.get("traced_meta"), "device", None) for n in phs]
    const_devices = {name: t.device for name, t in lowered.constants.items()}
    if not any(isinstance(d, torch.device) and d.type == "cuda" for d in [*devices, *const_devices.values()]):
        return
    host_inputs = {id(b): n.name for n, b, d in zip(phs, lowered.inputs, devices)
                   if b is not None and isinstance(d, torch.device) and d.type == "cpu"}
    host_consts = {name for name, d in const_devices.items() if d.type == "cpu"}
    if not host_inputs and not host_consts:
        return

    def host_name(b):
        if getattr(b, "kind", "") == "const":
            return b.name if b.name in host_consts else None
        return host_inputs.get(id(b))
    for st in [*lowered.steps, *lowered.copy_backs]:
        if isinstance(st, ExternCall):
            continue
        touched = [name for b in (*_reads(st), getattr(st, "target", None))
                   if b is not None and (name := host_name(b))]
        if touched:
            raise UntraceableGraph(f"a kernel of this CUDA graph would read or write the CPU tensor "
                                   f"{touched[0]}: Triton kernels cannot touch host memory")


def plan_graph(gm, num_outputs: int, mutated: list, num_inputs: int, label: str = "graph",
               prefix: str = "", param_inputs=frozenset(), autotune=None, nsizes: int = 0,
               choices=None) -> GpuPlan:
    """The pipeline's graph passes with the Triton target. ``nsizes`` > 0: one rendering of
    a shape-generic graph (gpu/dynamic.py): lowering assumes sizes may grow and replays
    ``choices`` (as the CPU's plan_graph); the kernels are rendered again with fixed blocks
    by ``rerender`` before their text is used."""
    return run_passes(TRITON, gm, num_outputs, mutated, num_inputs, label, prefix, nsizes, choices,
                      param_inputs=param_inputs, autotune=autotune)


def rerender(plan: GpuPlan, blocks: list, nsizes: int):
    """Render ``plan``'s kernels again with launch parameters ``blocks`` (one per kernel, in
    order) taking ``nsizes`` size arguments; kernel j is named ``KNAME{j}_`` until finish
    names the deduplicated kernels (the name must not depend on the rendering)."""
    j = 0
    for i, it in enumerate(plan.items):
        if isinstance(it, tuple):
            kp = it[0]
            kc = tr.render_kernel(kp, kp.r_contiguous, blocks[j], nsizes)
            kc.name = f"KNAME{j}_"
            plan.items[i] = (kp, kc)
            j += 1
    _report(plan)


def _report(plan: GpuPlan):
    info, items = plan.info, plan.items
    lines = []
    for it in items:
        if isinstance(it, ExternCall):
            lines.append(f"  {'fallback' if it.fallback else 'extern'} {it.name}")
        elif getattr(it[1], "tag", None) == "gemm":
            lines.append(f"  triton gemm {it[1].summary}")
        else:
            kp, kc = it
            mode = ("persistent" if kc.persistent else "looped") if kc.rblock else "pointwise"
            lines.append(f"  triton {mode} x{list(kp.outer)} XBLOCK={kc.xblock}"
                         + (f" RBLOCK={kc.rblock}" if kc.rblock else "") + f" warps={kc.num_warps}: {kc.summary}")
    info.fusion_report = "launches:\n" + "\n".join(lines) + (
        "\nnot fused:\n  " + "\n  ".join(plan.not_fused) if plan.not_fused else "\nnot fused: (none)")
    if info.autotune:
        info.fusion_report += "\nautotune:\n  " + "\n  ".join(info.autotune)


def finish(plans: list) -> list:
    """Compile every plan's kernels as ONE module (deduplicated, in parallel), then wrappers."""
    from ..codegen.triton_emit import PRELUDE, INTERPRET_SHIM
    interp = K.interpret_mode()
    names: dict = {}               # kernel body -> name
    renames: dict = {}             # plan -> {provisional name: name} (shape-generic templates)
    for p in plans:
        for it in p.items:
            if isinstance(it, tuple):
                body = it[1].body
                if body not in names:
                    if getattr(it[1], "tag", None) == "gemm":
                        names[body] = K.content_name(body, "gemm")   # as autotuning named it
                    else:
                        names[body] = f"k{len(names)}_" + ("red" if it[1].rblock else "pw")
                renames.setdefault(id(p), {})[it[1].name] = names[body]
                it[1].name = names[body]
    src = PRELUDE + (INTERPRET_SHIM if interp else "") + "\n\n" + "\n\n".join(
        body.replace("KERNEL_NAME", name) for body, name in names.items())
    path = K.write_module(src)
    mod = K.load_module(path)
    compiled = {}
    if not interp:
        codes = {}
        aligned: dict = {}
        for p in plans:
            for it in p.items:
                if isinstance(it, tuple):
                    codes[it[1].name] = it[1]
                    # one kernel launched at several sites: claim only what holds at all
                    a = set(K.aligned(it[1]))
                    aligned[it[1].name] = aligned.get(it[1].name, a) & a
        jobs = [K.Job(n, K.signature(kc), sorted(aligned[n]), kc.num_warps, getattr(kc, "num_stages", 1),
                      cost=len(kc.body)) for n, kc in codes.items()]
        compiled = K.compile_jobs(path, jobs)
    out = []
    for p in plans:
        info = p.info
        info.triton_source = src
        info.unique_kernels = len({it[1].name for it in p.items if isinstance(it, tuple)})
        info.kernels = [it[1].name + ": " + it[1].summary for it in p.items if isinstance(it, tuple)]
        info.launch = "jit" if interp else "direct"
        counters.bump("kernels_compiled", info.unique_kernels)
        counters.bump("aten_fallbacks", len(info.aten_fallbacks))
        rendered = None
        if p.generic_wrapper is not None:
            wsrc, consts = p.generic_wrapper
            for old, new in renames.get(id(p), {}).items():
                wsrc = wsrc.replace(old, new)
            rendered = (wsrc, consts)
        call, wsrc = W.build(p, mod, compiled, interp, rendered)
        info.wrapper_source = wsrc
        info.passes["build"] = path
        info.passes["wrap"] = wsrc
        log = logs.get("code")
        if log.isEnabledFor(20):
            log.info("%s: %s\n--- wrapper ---\n%s\n--- triton ---\n%s\n--- fusion ---\n%s",
                     p.label, info.summary(), wsrc, src, info.fusion_report)
        out.append((call, info))
    return out


def compile_graph(gm, num_outputs: int, mutated: list, num_inputs: int, label: str = "graph", **kw):
    return finish([plan_graph(gm, num_outputs, mutated, num_inputs, label, **kw)])[0]
