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


# One per mode: the resume function that receives it guards it by identity.
_RESTORE_GRAD_MODE = {True: RestoreGradMode(True), False: RestoreGradMode(False)}


def enter_grad(inside: bool, outside: bool) -> RestoreGradMode:
    """Re-enter a grad-mode block the graph left (graphs leave global state as they found
    it) and return what its ``__exit__`` must do."""
    torch._C._set_grad_enabled(inside)
    return _RESTORE_GRAD_MODE[outside]


class RestoreAutocast:
    """Stands in for a ``with torch.autocast(...):`` block's ``__exit__`` in a resume
    function, as ``RestoreGradMode`` does for grad mode: leaves the autocast nesting level
    and restores the state from before the block."""
    __slots__ = ("device", "enabled", "dtype", "cache_enabled")

    def __init__(self, device, enabled, dtype, cache_enabled):
        self.device, self.enabled, self.dtype = device, enabled, dtype
        self.cache_enabled = cache_enabled

    def __call__(self, *exc_info):
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled(self.device, self.enabled)
        torch.set_autocast_dtype(self.device, self.dtype)
        torch.set_autocast_cache_enabled(self.cache_enabled)
        return False


_RESTORE_AUTOCAST: dict = {}


def enter_autocast(device_type, dtype, enabled, cache_enabled):
    """Re-enter an autocast block the graph left; the exit is one object per state before
    the block (guards fix that state), so the resume function's identity guard holds."""
    before = (device_type, torch.is_autocast_enabled(device_type),
              torch.get_autocast_dtype(device_type), torch.is_autocast_cache_enabled())
    torch.autocast(device_type, dtype=dtype, enabled=enabled,
                   cache_enabled=cache_enabled).__enter__()
    restore = _RESTORE_AUTOCAST.get(before)
    if restore is None:
        restore = _RESTORE_AUTOCAST[before] = RestoreAutocast(*before)
    return restore


def global_state(autocast_devices=(), grad=None) -> tuple:
    """Grad mode (``grad``, or the current one) and (for these device types) the autocast
    state, for ``restore_global_state``."""
    autocast = None
    if autocast_devices:
        nesting = torch.autocast_increment_nesting() - 1
        torch.autocast_decrement_nesting()
        autocast = (nesting, torch.is_autocast_cache_enabled(),
                    tuple((d, torch.is_autocast_enabled(d), torch.get_autocast_dtype(d))
                          for d in autocast_devices))
    return torch.is_grad_enabled() if grad is None else grad, autocast


def restore_global_state(state: tuple) -> None:
    """Compiled code raised: leave grad mode and autocast as they were before it ran, as
    eager's ``with`` blocks do on the way out (the autocast nesting level included, whose
    cast cache is dropped when it returns to zero)."""
    grad, autocast = state
    torch._C._set_grad_enabled(grad)
    if autocast is None:
        return
    nesting, cache_enabled, devices = autocast
    level = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    while level > nesting:
        level = torch.autocast_decrement_nesting()
        if level == 0:
            torch.clear_autocast_cache()
    torch.set_autocast_cache_enabled(cache_enabled)
    for device, enabled, dtype in devices:
        torch.set_autocast_enabled(device, enabled)
        torch.set_autocast_dtype(device, dtype)


def bound_method(func, obj):
    return types.MethodType(func, obj)


def make_function(code, globals_, base_closure, cells, qualname):
    """A resume function over this call's cells for the frame's cell variables (the resumed
    code may rebind them, and closures made before the break must see that)."""
    fn = types.FunctionType(code, globals_, code.co_name, None,
                            tuple(base_closure or ()) + tuple(cells) or None)
    fn.__qualname__ = qualname
    return fn
