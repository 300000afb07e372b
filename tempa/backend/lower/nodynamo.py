"""Run PyTorch's Python decompositions without importing the dynamo package.

Why: many reference implementations in ``torch._refs`` (gelu, the elementwise ops behind
layer norm, ...) are wrapped by ``torch._compile._disable_dynamo``, whose wrapper imports
PyTorch's bytecode compiler (the package tempa rebuilds) on its first call: 1.7-2.2 s on
this machine, one third of GPT-124M's whole inference compile, only to make the function
opaque to that compiler's trace. tempa's tracer is not such a trace and needs none of it.

The wrapper caches what it would call as ``fn.__dynamo_disable``; while ``resolved()`` is
active that attribute is set to ``fn`` itself on every wrapped function we can find, so
the wrapper calls ``fn`` directly. The attributes are removed again on exit, so code that
later runs under that compiler gets the normal behaviour. A function whose wrapper has
already resolved its attribute keeps it; a function this walk misses still works: its
wrapper imports the compiler as before (slower, same result).
"""
from __future__ import annotations

import contextlib
import sys
import types

_ATTR = "__dynamo_disable"
_PREFIXES = ("torch._refs", "torch._prims", "torch._decomp")
_wrapped: list | None = None
_walked_modules = 0


def _inner_code():
    import torch._compile
    return torch._compile._disable_dynamo(lambda: None).__code__


def _find() -> list:
    """The functions behind every ``_disable_dynamo`` wrapper reachable from the
    decomposition modules: module-level functions, their ``__wrapped__`` chains and the
    functions their closures hold (decorators nest: out_wrapper(type_promotion(fn)))."""
    from torch._decomp import decomposition_table
    inner = _inner_code()
    stack = [v for v in decomposition_table.values() if isinstance(v, types.FunctionType)]
    for name, mod in list(sys.modules.items()):
        if mod is not None and name.startswith(_PREFIXES):
            stack.extend(v for v in list(vars(mod).values()) if isinstance(v, types.FunctionType))
    seen, found = set(), []
    while stack:
        f = stack.pop()
        if id(f) in seen:
            continue
        seen.add(id(f))
        if f.__code__ is inner:
            found.append(f.__wrapped__)
        w = f.__dict__.get("__wrapped__")
        if isinstance(w, types.FunctionType):
            stack.append(w)
        for cell in f.__closure__ or ():
            try:
                x = cell.cell_contents
            except ValueError:          # an empty cell
                continue
            if isinstance(x, types.FunctionType):
                stack.append(x)
    return found


def _targets() -> list:
    global _wrapped, _walked_modules
    n = sum(1 for name in list(sys.modules) if name.startswith(_PREFIXES))
    if _wrapped is None or n != _walked_modules:   # decomposition modules imported since: walk again (~10 ms)
        _wrapped, _walked_modules = _find(), n
    return _wrapped


@contextlib.contextmanager
def resolved():
    """Inside: ``_disable_dynamo``-wrapped decompositions call straight through (outside a
    compiler trace the wrapper's resolved callable does the same)."""
    mine = [f for f in _targets() if _ATTR not in f.__dict__]
    for f in mine:
        f.__dict__[_ATTR] = f
    try:
        yield
    finally:
        for f in mine:
            if f.__dict__.get(_ATTR) is f:
                del f.__dict__[_ATTR]
