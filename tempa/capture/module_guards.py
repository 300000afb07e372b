"""Guards on what calling a module or a function means: module state is state.

A module call inlined into the graph assumes its class, its ``__call__`` (not overridden),
no hooks (the module's own and the global ones) and the ``forward`` it saw; a function
assumes its ``__code__`` and, for the compiled function, its defaults objects. Each is a
cheap identity or emptiness check; where hooks exist, capture refuses (the module then
runs with its hooks, outside the graph).
"""
from __future__ import annotations

import types

import torch

from .breaks import Unsupported

_MODULE_CALL = torch.nn.Module.__call__


_HOOK_TABLES = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")


_GLOBAL_HOOK_TABLES = ("_global_forward_hooks", "_global_forward_pre_hooks",
                       "_global_backward_hooks", "_global_backward_pre_hooks")


def guard_root_module_call(tracer, mod: torch.nn.Module, fn) -> None:
    """The compiled module itself, whose forward ``fn`` is the captured code: calling the
    module must still mean exactly ``fn(mod, ...)`` (else it runs eagerly, as called)."""
    if _guard_module_class(tracer, mod):
        if type(mod).__call__ is fn:
            return   # the compiled code is the override itself; its super().__call__ guards the rest
        raise Unsupported("module call", f"{type(mod).__name__} overrides __call__")
    forward = guard_module_call(tracer, mod)
    if getattr(forward, "__func__", None) is not fn:
        raise Unsupported("module call", f"{type(mod).__name__}.forward was replaced "
                                         "after compiling")


def _guard_module_class(tracer, mod) -> bool:
    """Guard ``mod``'s class and its ``__call__``; True when ``__call__`` is overridden."""
    cls = type(mod)
    g = tracer.guards
    # type(m), not m.__class__: a module's attribute reads go through its __getattr__ hook
    # (3x slower); they differ only for a class that fakes __class__, which a module is not
    g.add("module", f"type({tracer.expr_of(mod)}) is {g.const(cls, 'T')}",
          f"{tracer.path_of(mod)} is a {cls.__name__}")
    g.add("module", f"{g.const(cls, 'T')}.__call__ is {g.const(cls.__call__, 'F')}",
          f"{cls.__name__}.__call__ is the same function")
    return cls.__call__ is not _MODULE_CALL


def guard_module_call(tracer, mod: torch.nn.Module):
    """What ``Module.__call__`` would do besides ``forward``, guarded to stay nothing: no
    hooks (the module's own and the global ones; hook dicts are bound as constants and
    tested for emptiness, in one native call for all of an entry's where it can) and no instance attribute ``forward`` other than
    the one seen. Returns the forward to inline; raises Unsupported where hooks exist."""
    g = tracer.guards
    d = mod.__dict__
    tables = [d.get(name) for name in _HOOK_TABLES]
    where = tracer.path_of(mod)
    if any(tables) or _global_hooks():
        raise Unsupported("hooks", f"{type(mod).__name__} has forward/backward hooks")
    g.all_empty(tables, f"{where} has no hooks")
    g.all_empty(_global_hook_tables(), "no global module hooks")
    forward = d.get("forward")
    if forward is None:
        g.add("module", f"'forward' not in {g.const(d, 'ID')}", f"{where}.forward is not overridden")
        cls = type(mod)
        g.add("module", f"{g.const(cls, 'T')}.forward is {g.const(cls.forward, 'F')}",
              f"{cls.__name__}.forward is the same function")
        return types.MethodType(cls.forward, mod)
    g.add("module", f"{g.const(d, 'ID')}.get('forward') is {g.const(forward, 'F')}",
          f"{where}.forward is the same")
    return forward


def _global_hook_tables() -> list:
    from torch.nn.modules import module as m
    return [getattr(m, name) for name in _GLOBAL_HOOK_TABLES]


def _global_hooks() -> bool:
    return any(_global_hook_tables())


def guard_function(guards, fn, *, defaults: bool = False) -> None:
    """A Python function's code (``f.__code__ = ...`` keeps the function object) and, with
    ``defaults``, its ``__defaults__``/``__kwdefaults__`` objects: the compiled function's
    entry binds the defaults it was built with. (An inlined callee's defaults are read
    from their source when used: ``bind_arguments``.)"""
    f = guards.const(fn, "F")
    guards.add("identity", f"{f}.__code__ is {guards.const(fn.__code__, 'CODE')}",
               f"{fn.__qualname__}.__code__ is the same code")
    for attr in ("__defaults__", "__kwdefaults__") if defaults else ():
        value = getattr(fn, attr)
        if value is not None:
            guards.add("identity", f"{f}.{attr} is {guards.const(value, 'DEF')}",
                       f"{fn.__qualname__}.{attr} is unchanged")
