"""What users and tools can look at: ``tempa.explain``, the cache entries behind a compiled
module or function (``tempa.entries``), and why code recompiled or ran eagerly."""
from __future__ import annotations

import types
from dataclasses import dataclass

import torch

from .capture.explain import ExplainOutput, has_ops
from .context import CompileContext, calling, where
from .optimized_module import OptimizedModule


def explain(fn_or_module):
    """``tempa.explain(model)(*args, **kwargs)``: run once, capturing graphs (run through FX,
    no kernels compiled) and report graphs, breaks with their places, ops and guards."""
    if not (isinstance(fn_or_module, (torch.nn.Module, types.FunctionType, types.MethodType))
            or hasattr(fn_or_module, "__tempa_context__")):
        raise TypeError(f"tempa.explain expects an nn.Module or a Python function, got "
                        f"{type(fn_or_module).__name__}: tempa.explain(model)(*inputs)")

    def run(*args, **kwargs):
        context = CompileContext(fullgraph=False, dynamic=None, backend="eager", mode=None,
                                 options=None)
        context.record = True
        target = fn_or_module
        if isinstance(target, OptimizedModule):
            target = target._orig_mod
        if isinstance(target, torch.nn.Module):
            OptimizedModule(target, context)(*args, **kwargs)
        elif isinstance(target, types.MethodType):   # as tempa.compile: the function, bound
            context.dispatcher(target.__func__, target.__func__)(target.__self__, *args, **kwargs)
        else:
            compile_target = target.__wrapped__ if hasattr(target, "__tempa_context__") else target
            if isinstance(compile_target, types.MethodType):
                # a bound method (``opt.step``): its function, with the object as its first
                # argument, as tempa.compile does
                function = compile_target.__func__
                context.dispatcher(function, function)(compile_target.__self__, *args, **kwargs)
            else:
                if not hasattr(compile_target, "__code__"):
                    compile_target = calling(compile_target)
                context.dispatcher(compile_target, compile_target)(*args, **kwargs)
        guards = [[d for _, d in e.guards] for c in context.all_caches() for e in c.entries]
        out = ExplainOutput(
            graphs=[gm for _, gm in context.graph_log if has_ops(gm)],
            graph_functions=[f.__qualname__ for f, gm in context.graph_log if has_ops(gm)],
            recompile_reasons=list(context.recompile_log),
            graph_break_count=len(context.break_log),
            break_reasons=[r for _, r in context.break_log],
            guards=guards,
            eager_fallbacks=[f"{where(f)}: {r}" for f, r in context.fallback_log],
            notes=_option_notes(fn_or_module),
        )
        context.clear()
        return out
    return run


def _option_notes(compiled) -> list[str]:
    """What the options ``compiled`` was compiled with imply for its results (nothing for a
    plain module or function): freezing's count of packed weights so far and its contract."""
    try:
        context = context_of(compiled)
    except TypeError:
        return []
    if not context.options.get("freezing"):
        return []
    packed = sum(len(getattr(getattr(e.kernels, "inference", None), "packed_weights", ()))
                 for e in entries(compiled))
    return [f"freezing: {packed} weights packed (in the inference graphs compiled so far); "
            "in-place changes through .data are not seen"]


@dataclass
class EntryInfo:
    """One compiled cache entry, for users and tools (`tempa explain`, reports)."""
    function: str
    guards: list[str]
    graph: torch.fx.GraphModule
    graph_code: str
    compiled: object            # the backend's callable (tempa's carries .tempa_info)
    break_reason: object        # BreakReason, or None when the whole function is one graph
    entry_source: str           # the generated guard + runner function

    @property
    def kernels(self):
        return getattr(self.compiled, "tempa_info", None)


def entries(compiled) -> list[EntryInfo]:
    """The cache entries behind a compiled module or function, across every code object
    compiled under it (resume functions and separately compiled callees included)."""
    context = context_of(compiled)
    out = []
    for cache in context.all_caches():
        for e in cache.entries:
            out.append(EntryInfo(cache.name, [d for _, d in e.guards], e.captured.gm,
                                 e.captured.gm.code, e.compiled, e.captured.break_reason,
                                 e.source))
    return out


def stance_decisions(compiled) -> list[str]:
    """What stance "auto" chose for each code object under ``compiled`` so far, and why."""
    return list(context_of(compiled).stance_log)


def recompile_reasons(compiled) -> list[tuple[str, str]]:
    """(function, the guard that failed) for every recompile under ``compiled`` so far."""
    return list(context_of(compiled).recompile_log)


def eager_reasons(compiled) -> list[str]:
    """Why code under ``compiled`` runs eagerly (one line per code object), if it does."""
    context = context_of(compiled)
    return [f"{c.name}: {c.eager_reason}" for c in context.all_caches() if c.eager_reason]


def context_of(compiled) -> "CompileContext":
    if isinstance(compiled, OptimizedModule):
        return compiled.__dict__["_tempa_context"]
    context = getattr(compiled, "__tempa_context__", None)
    if context is None:
        raise TypeError("tempa.entries: pass what tempa.compile returned")
    return context
