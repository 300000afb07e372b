"""Grad-mode, autocast and warnings contexts inside captured code.

``with torch.no_grad():`` and ``with torch.autocast(...):`` change how later operations run.
During capture the change is applied for real (so fake tensors get the right requires_grad
and dtype) and recorded in the graph as ``_set_grad_enabled`` / ``_enter_autocast`` nodes,
which the backend replays, so the compiled graph switches modes exactly where eager did.

``with warnings.catch_warnings(...):`` around captured code saves the warnings module's
state and restores it at the end: around a graph it changes nothing a program reads, so it
is captured as nothing (as torch.compile does). What it could change stays eager: a
``warnings`` call inside the block is an impure call, and a break inside the block is
refused (the rest would run outside the block), as is ``as log`` with ``record=True`` (the
list of what was warned). Left out: warnings that ATen kernels raise while the graph runs
are shown rather than recorded, and the filters' version is not bumped (which makes
warnings shown once per place show again), as under torch.compile.
"""
from __future__ import annotations

import contextlib
import logging
import warnings

import torch
from torch.amp import autocast_mode

from .breaks import Unsupported, UserError
from .values import GradModeExit

GRAD_CONTEXT_CLASSES = {torch.no_grad, torch.enable_grad, torch.set_grad_enabled,
                        torch.inference_mode}
# Profiler labels (Optimizer.step runs in one): they change no value, so captured code runs
# without them, as under torch.compile (its default, capture_profiler_record_function=False).
PROFILER_LABEL_CLASSES = {torch.autograd.profiler.record_function}
# One stateless object for all of them: a break inside the block hands the resume function
# this same object (a fresh one per call would fail its identity guard on every call).
_NO_LABEL = contextlib.nullcontext()
_log = logging.getLogger("tempa.graphs")


def is_autocast_class(cls) -> bool:
    return isinstance(cls, type) and issubclass(cls, autocast_mode.autocast)


class CapturedContext:
    """A grad-mode/autocast context manager object created in captured code."""

    def __init__(self, kind: str, target=None, autocast=None):
        self.kind = kind            # "grad" | "autocast" | "warnings"
        self.target = target        # grad mode to switch to
        self.autocast = autocast    # the real torch.autocast object
        self.prev = None
        self.node = None
        self.exited = True

    def enter(self, tracer):
        builder = tracer.builder
        if self.kind == "warnings":
            self.exited = False
            return GradModeExit(self._exit, self), None
        if self.kind == "grad":
            self.prev = torch.is_grad_enabled()
            _set_grad(tracer, self.target)
            self.exited = False
            return GradModeExit(self._exit, self), None
        a = self.autocast
        args = (a.device, a.fast_dtype, a._enabled, a._cache_enabled)
        self.node = builder.graph.call_function(autocast_mode._enter_autocast, args)
        a.__enter__()
        tracer.active_contexts.append(self)
        self.exited = False
        return GradModeExit(self._exit, self), None

    def _exit(self, tracer):
        if self.exited:
            return
        self.exited = True
        if self.kind == "warnings":
            return
        if self.kind == "grad":
            _set_grad(tracer, self.prev)
            return
        tracer.builder.graph.call_function(autocast_mode._exit_autocast, (self.node,))
        self.autocast.__exit__(None, None, None)
        if self in tracer.active_contexts:
            tracer.active_contexts.remove(self)


def catch_warnings_block(tracer, ctx: warnings.catch_warnings, value_used: bool):
    """Entering a ``warnings.catch_warnings`` object made in this capture (see above)."""
    if value_used and ctx._record:
        raise Unsupported("context manager", "warnings.catch_warnings(record=True) as a name: "
                                             "the list of warnings it records")
    if ctx._entered:
        raise UserError(RuntimeError(f"Cannot enter {ctx!r} twice"))
    ctx._entered = True
    return CapturedContext("warnings")


def _set_grad(tracer, mode: bool) -> None:
    tracer.builder.graph.call_function(torch._C._set_grad_enabled, (mode,))
    torch._C._set_grad_enabled(mode)


def make(tracer, cls, args, kwargs):
    """Calling a context class (or ``torch.set_grad_enabled``) inside captured code."""
    if cls is torch.no_grad:
        return tracer.mark_internal(CapturedContext("grad", False))
    if cls is torch.enable_grad:
        return tracer.mark_internal(CapturedContext("grad", True))
    if cls is torch.inference_mode:
        mode = args[0] if args else kwargs.get("mode", True)
        # Values are the same as under no_grad; only the inference-tensor flag differs.
        return tracer.mark_internal(CapturedContext("grad", not mode))
    if cls is torch.set_grad_enabled:
        mode = args[0] if args else kwargs["mode"]
        if not isinstance(mode, bool):
            raise Unsupported("context manager", "set_grad_enabled with a non-constant mode")
        ctx = CapturedContext("grad", mode)
        # set_grad_enabled(mode) switches immediately, even without `with`.
        ctx.prev = torch.is_grad_enabled()
        _set_grad(tracer, mode)
        return tracer.mark_internal(_AlreadyEntered(ctx))
    if cls in PROFILER_LABEL_CLASSES:
        _log.info("tempa: the profiler label %r inside compiled code is not recorded",
                  args[0] if args else kwargs.get("name"))
        return _NO_LABEL
    if is_autocast_class(cls):
        real = cls(*args, **kwargs)
        return tracer.mark_internal(CapturedContext("autocast", autocast=real))
    raise Unsupported("context manager", f"context manager {cls.__name__}")


class _AlreadyEntered(CapturedContext):
    """``torch.set_grad_enabled(m)``: the switch already happened; ``with`` only restores."""

    def __init__(self, inner: CapturedContext):
        super().__init__("grad", inner.target)
        self.prev = inner.prev

    def enter(self, tracer):
        self.exited = False
        return GradModeExit(self._exit, self), None

