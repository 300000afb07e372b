"""One functional ATen graph -> one C++ library + one generated wrapper function: the C++
target of the backend's pipeline (pipeline.py lists the passes; ``CppTarget`` holds the
C++ ones: plan_memory, render, and finish = build + wrap).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass, field

import torch

from .. import counters, logs
from .codegen import cpp, wrapper
from .ir import PackedWeight, failed_check
from ..sourcefiles import source_file
from .pipeline import Target, memory_summary, plan_graph as run_passes, reuse_dead_buffers, show
from .runtime import build as _build, fastcall, nativeautograd
from .runtime.packed_weights import PackedWeightCache
from .schedule import plan_memory


@dataclass
class CompiledGraphInfo:
    """What the backend made of one graph: the generated code and why it looks that way."""
    kernel_count: int = 0
    segment_count: int = 0             # C++ calls per invocation
    cpp_source: str = ""
    wrapper_source: str = ""
    aten_fallbacks: list = field(default_factory=list)
    extern_calls: list = field(default_factory=list)
    fusion_report: str = ""
    used_gcc: bool = False
    from_disk_cache: bool = False
    so_path: str = ""
    segment_calls: str = ""            # how the wrapper calls C++: "extension" | "ctypes"
    allocator: str = ""                # its buffers' allocator: "extension" | "torch.empty_strided"
    autograd: str = ""                 # a training forward's node: "native" | "autograd.Function"
    passes: dict = field(default_factory=dict)    # pipeline pass name -> its output (trace())
    mutated_inputs: list = field(default_factory=list)   # input indices the graph writes to
    # options={"freezing": True}: the caches of the weights its GEMMs read packed
    # (runtime/packed_weights.py: which input, for how many rows, how often packed)
    packed_weights: list = field(default_factory=list)
    # a training backward's variants for calls where some outputs get no gradient
    # (autograd.py, lower/absent.py): those outputs' indices -> the variant's info, or a
    # string saying why it could not be compiled (then zeros are given to this backward)
    absent_tangents: dict = field(default_factory=dict)
    # the BackendInfo that counts this graph's kernels (entry.BackendInfo._adopt): a backward
    # compiled after the forward (autograd.py) adds its kernels there
    owner: object = field(default=None, repr=False, compare=False)

    def summary(self) -> str:
        return (f"{self.kernel_count} kernels in {self.segment_count} C++ calls, "
                f"{len(self.extern_calls)} extern calls, {len(self.aten_fallbacks)} ATen fallbacks")

    def trace(self, heading: str = "") -> str:
        """Each pass's output for this graph, in pipeline order."""
        return show(self.passes, heading)


@dataclass
class Plan:
    """A graph lowered, scheduled and rendered, waiting for its C++ to be built."""
    lowered: object
    sched: object
    seg_codes: dict
    info: CompiledGraphInfo
    num_inputs: int
    label: str


class CppTarget(Target):
    """The C++ renderer's passes of pipeline.GRAPH_PASSES, and its finish."""
    name = "cpp"
    memory_order_stores = True
    outputs_stored_once = True
    depthwise_weight_grad_loops = True
    # between convolutions run channels-last (config.cpu_conv_layout), a value stored for
    # several users keeps that layout: stored contiguous, each reader (the next convolution's
    # NHWC copy, the BatchNorm and activation after it) read it transposed
    channels_last_stores = True
    # a value with several users that reads two or more buffers is stored once (lower_graph):
    # a transformer's residual stream (each layer's sum read by its LayerNorm's passes and
    # by the next add) is otherwise recomputed from every earlier sublayer's output in every
    # later LayerNorm pass, ViT-B's 6th layer summing 12 buffers three times per row
    shared_reads = 2

    def plan_memory(self, job):
        plan_memory(job.sched, job.lowered.inputs, job.lowered.outputs, job.lowered.steps)
        reused = reuse_dead_buffers(job.lowered, job.sched) if job.nsizes == 0 else []
        summary = memory_summary(job.lowered.steps)
        if reused:
            summary = f"{summary}\nwritten over a dying buffer: " + ", ".join(f"{b} over {d}" for b, d in reused)
        return summary

    def render(self, job):
        kernel_no = [0]
        job.seg_codes = {}
        for si, seg in enumerate(job.sched.segments):
            if isinstance(seg, list):
                job.seg_codes[si] = cpp.render_segment(f"{job.prefix}seg{si}", seg, job.sched.local,
                                                       kernel_no, job.nsizes, job.options)
        job.kernel_count = kernel_no[0]
        return "\n\n".join(c.text for c in job.seg_codes.values())

    def make_plan(self, job) -> "Plan":
        lowered, sched = job.lowered, job.sched
        info = CompiledGraphInfo()
        info.kernel_count = job.kernel_count
        info.segment_count = len(job.seg_codes)
        info.aten_fallbacks = list(lowered.fallbacks)
        info.extern_calls = list(lowered.externs)
        info.fusion_report = str(job.kept["schedule"])
        info.cpp_source = job.kept["render"]
        info.passes = job.kept
        info.mutated_inputs = list(job.mutated)
        return Plan(lowered, sched, job.seg_codes, info, job.num_inputs, job.label)

    def finish(self, plans: list) -> list:
        return finish(plans)


CPP = CppTarget()


def plan_graph(gm, num_outputs: int, mutated: list, num_inputs: int, label: str = "graph",
               prefix: str = "", nsizes: int = 0, choices=None, pack_weights=frozenset(),
               own_layout_outputs=frozenset()) -> Plan:
    """The pipeline's graph passes with the C++ target (pipeline.plan_graph says more)."""
    return run_passes(CPP, gm, num_outputs, mutated, num_inputs, label, prefix, nsizes, choices,
                      pack_weights, own_layout_outputs)


def finish(plans: list) -> list:
    """Build every plan's C++ as ONE library (one gcc run), then make each wrapper."""
    parts = [c.text for p in plans for c in p.seg_codes.values()]
    lib = so = None
    cached = False
    if parts:
        fastcall.prebuild()          # its one-time gcc run overlaps this graph's
        prelude = cpp.prelude()
        source = prelude + "\n\n" + "\n\n".join(parts) + "\n"
        lib, so, cached = _build.build(source, prelude, parts)
    out = []
    for p in plans:
        info = p.info
        if p.seg_codes:
            info.so_path = so
            info.from_disk_cache = cached
            info.used_gcc = not cached
            counters.bump("kernels_compiled", info.kernel_count)
        counters.bump("aten_fallbacks", len(info.aten_fallbacks))
        wsrc, consts, serializable = wrapper.render_wrapper(p.sched, p.lowered, p.seg_codes, p.num_inputs)
        info.wrapper_source = wsrc
        info.passes["build"] = so or "(no C++: every step is an ATen call)"
        info.passes["wrap"] = wsrc
        call = instantiate(wsrc, lib, p.seg_codes, p.lowered.constants, consts, p.label)
        info.packed_weights = call.packed_weights
        info.segment_calls = call.segment_calls
        info.allocator = call.allocator
        log = logs.get("code")
        if log.isEnabledFor(20):
            log.info("%s: %s\n--- wrapper ---\n%s\n--- C++ ---\n%s\n--- fusion ---\n%s",
                     p.label, info.summary(), wsrc, info.cpp_source, info.fusion_report)
        out.append((call, info))
    return out


def compile_graph(gm, num_outputs: int, mutated: list, num_inputs: int, label: str = "graph",
                  pack_weights=frozenset()):
    """Returns (call, info): ``call(*inputs)`` -> tuple of outputs (user outputs, then saved).
    ``pack_weights``: the inputs whose weights GEMMs may read packed (LowerOptions)."""
    return finish([plan_graph(gm, num_outputs, mutated, num_inputs, label,
                              pack_weights=pack_weights)])[0]


_INDEX_ERRORS = {"IndexError": IndexError, "RuntimeError": RuntimeError}


def _index_error(err: int, checks: tuple):
    """A kernel found an index out of range: raise the error eager raises for that op
    (``err``: the segment's bits of failed checks; ``checks``: its (error, message) pairs in
    emission order; ir.failed_check)."""
    error, message = failed_check(err, checks) or ("IndexError", "index out of range in a tempa kernel")
    raise _INDEX_ERRORS[error](message)


def instantiate(wsrc: str, lib, seg_codes: dict, constants: dict, consts: list, label: str = "graph"):
    seg_funcs = {}
    for si, code in seg_codes.items():
        f = getattr(lib, code.name)
        f.argtypes = [ctypes.c_void_p] * len(code.params) + [ctypes.c_int64] * getattr(code, "nsizes", 0)
        f.restype = ctypes.c_int
        seg_funcs[si] = fastcall.kernel(f, len(f.argtypes)) or f
    ptrs = {k: v.data_ptr() for k, v in constants.items()}
    # each call of the wrapper gets its own caches of packed weights (render: packed_weight)
    consts = [PackedWeightCache(c.input_index, c.rows, c.stored_kn) if isinstance(c, PackedWeight)
              else c for c in consts]
    ns: dict = {}
    exec(compile(wsrc, source_file(wsrc, f"wrapper {label}"), "exec"), ns)
    alloc = nativeautograd.empty_strided()
    call = ns["make"](seg_funcs, constants, ptrs, consts, alloc, torch.as_strided, _index_error)
    call.allocator = "torch.empty_strided" if alloc is torch.empty_strided else "extension"
    call._keepalive = (lib, constants)
    call.packed_weights = [c for c in consts if isinstance(c, PackedWeightCache)]
    kinds = {"ctypes" if isinstance(f, ctypes._CFuncPtr) else "extension" for f in seg_funcs.values()}
    call.segment_calls = "+".join(sorted(kinds))
    return call
