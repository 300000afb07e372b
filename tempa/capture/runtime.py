"""Helpers that generated entry functions call at run time (around graph breaks)."""
from __future__ import annotations

import types

import torch


class RestoreGradMode:
    """Stands in for a ``with torch.no_grad():`` block's ``__exit__`` in a resume function:
    the block was entered inside a compiled graph, and exits in Python."""
    __slots__ = ("mode",)

    def __init__(self, mode: bool):
        self.mode = mode

    def __call__(self, *exc_info):
        torch._C._set_grad_enabled(self.mode)
        return False


def enter_grad(inside: bool, outside: bool) -> RestoreGradMode:
    """Re-enter a grad-mode block the graph left (graphs leave global state as they found
    it) and return what its ``__exit__`` must do."""
    torch._C._set_grad_enabled(inside)
    return RestoreGradMode(outside)


def enter_autocast(device_type, dtype, enabled, cache_enabled):
    ctx = torch.autocast(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
    ctx.__enter__()
    return ctx.__exit__


def bound_method(func, obj):
    return types.MethodType(func, obj)


def make_function(code, globals_, base_closure, cells, qualname):
    """A resume function over this call's cells for the frame's cell variables (the resumed
    code may rebind them, and closures made before the break must see that)."""
    fn = types.FunctionType(code, globals_, code.co_name, None,
                            tuple(base_closure or ()) + tuple(cells) or None)
    fn.__qualname__ = qualname
    return fn
