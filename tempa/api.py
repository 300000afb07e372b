"""The public surface: compile(), disable(), mark_dynamic(), reset(), stats(), and the
names of the modules it is made of (context.py: CompileContext and dispatch;
optimized_module.py: OptimizedModule; settings.py: tempa.compile's arguments and backends;
introspect.py: explain(), entries() and the reasons), importable from here as before.

The only layer that knows all the others: it hands capture a backend callable (settings.py)
and the context turns capture's outcomes into what the user sees.
"""
from __future__ import annotations

import functools
import types

import torch

from . import counters
from .capture import calls_inline
from .capture.cache import clear_watchers
from .context import CompileContext, calling, contexts
from .introspect import (EntryInfo, eager_reasons, entries, explain,  # noqa: F401 (re-exported)
                         recompile_reasons, stance_decisions)
from .optimized_module import OptimizedModule
from .settings import OPTIONS, resolve_backend as _resolve_backend  # noqa: F401 (the peer shim's)


def compile(model=None, *, fullgraph: bool = False, dynamic: bool | None = None,
            backend="tempa", mode: str | None = None, options: dict | None = None):
    """Compile an nn.Module or a function. Nothing happens until the first call."""
    if model is None:
        return lambda m: compile(m, fullgraph=fullgraph, dynamic=dynamic, backend=backend,
                                 mode=mode, options=options)
    context = CompileContext(fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode,
                             options=options)
    if isinstance(model, torch.nn.Module):
        return OptimizedModule(model, context)
    if isinstance(model, types.MethodType):
        dispatch = context.dispatcher(model.__func__, model.__func__)
        bound = functools.partial(dispatch, model.__self__)
        functools.update_wrapper(bound, model)
        bound.__tempa_context__ = context
        return bound
    if isinstance(model, types.FunctionType):
        dispatch = context.dispatcher(model, model)
        functools.update_wrapper(dispatch, model)
        dispatch.__tempa_context__ = context
        return dispatch
    if callable(model):
        # A builtin, an op overload, a functools.partial, an lru_cache wrapper, an object
        # with __call__: a small Python function that calls it is compiled instead, and
        # capture treats the call as it would inside any compiled code.
        call = calling(model)
        dispatch = context.dispatcher(call, call)
        functools.update_wrapper(dispatch, model, updated=())
        dispatch.__tempa_context__ = context
        return dispatch
    raise TypeError(f"tempa.compile expects an nn.Module or a function, got {type(model).__name__}")


def disable(fn=None, recursive: bool = True):
    """Mark ``fn`` to always run eagerly; inside a compiled function a call to it is a graph
    break with reason "disabled by tempa.disable"."""
    if fn is None:
        return lambda f: disable(f, recursive)
    target = fn.__func__ if isinstance(fn, types.MethodType) else fn
    if isinstance(target, torch.nn.Module):
        target = type(target).forward
    code = getattr(target, "__code__", None)
    if code is not None:
        calls_inline.DISABLED_CODES.add(code)
    return fn


def mark_dynamic(tensor: torch.Tensor, dim) -> None:
    """Capture ``dim`` (an int or a list of them) of this tensor as a symbolic size."""
    dims = {dim} if isinstance(dim, int) else set(dim)
    tensor._tempa_dynamic_dims = set(getattr(tensor, "_tempa_dynamic_dims", ())) | dims


def mark_static(tensor: torch.Tensor, dim=None) -> None:
    """Never make ``dim`` (default: every dim) of this tensor symbolic."""
    dims = set(range(tensor.dim())) if dim is None else ({dim} if isinstance(dim, int) else set(dim))
    tensor._tempa_static_dims = set(getattr(tensor, "_tempa_static_dims", ())) | dims


def reset() -> None:
    """Forget every compiled entry and counter (the disk cache stays: see `tempa cache`)."""
    for ctx in list(contexts):
        ctx.clear()
    clear_watchers()
    counters.clear()


def stats() -> counters.Stats:
    return counters.snapshot()
