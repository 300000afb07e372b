"""Rebuilding the captured function's return value on every call.

At the end of capture the return value is a Python structure holding TensorVars. It is
turned into (a) the list of graph outputs and (b) a Python expression that rebuilds a fresh
structure of the same shape from those outputs (``___o``) each call: tuples, lists, dicts,
dataclasses and HuggingFace ``ModelOutput`` objects included.
"""
from __future__ import annotations

import itertools
from collections import OrderedDict

from .breaks import Unsupported
from .guards import GuardSet, is_constant_type
import types

import torch

from . import runtime
from .values import TensorVar, NULL, TensorMethod, GradModeExit, CapturedIter, LazyIter, \
    contains_tensor


_BUILTIN_METHOD = type([].append)
_MAX_ITEMS = 100_000   # items an iterator may hand over at a break (an endless one cannot)


def rebuild_object(cls, attrs: dict, items):
    """A new ``cls`` instance with these attributes (and dict items, for dict subclasses),
    without running ``__init__``: the captured run already validated the fields."""
    obj = cls.__new__(cls)
    if isinstance(obj, list):
        list.extend(obj, items)
    elif items is not None:
        # The C-level mapping under the class (OrderedDict keeps its own key order).
        setitem = next(b.__setitem__ for b in cls.__mro__ if b in (OrderedDict, dict))
        for k, v in items:
            setitem(obj, k, v)
    obj.__dict__.update(attrs)
    return obj


def rebuild_exception(cls, args: tuple, attrs: dict):
    """An exception built in the compiled code: its ``args`` (what ``str`` shows) and
    attributes."""
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(attrs)
    return exc


def rebuild_lazy(kind: type, fn, sources: list, kwargs: dict):
    """``map(fn, *sources)`` / ``filter(fn, source)`` / ``zip(*sources)`` again."""
    if kind is zip:
        return zip(*sources, **kwargs)
    return kind(fn, *sources, **kwargs)


def rebuild_iterator(cls, items: list):
    """An iterator that yields ``items``, an ``enumerate`` for an enumerate."""
    if cls is enumerate:
        return enumerate([v for _, v in items], items[0][0] if items else 0)
    return iter(items)


class OutputPlan:
    def __init__(self, guards: GuardSet, is_internal, external_copies=None, sizes=None):
        self.guards = guards
        self.sizes = sizes
        self.is_internal = is_internal
        self.external_copies = external_copies or {}
        self.outputs: list[TensorVar] = []
        self._slot: dict[int, int] = {}
        self._rebuilt_lazy: set[int] = set()

    def slot(self, t: TensorVar) -> str:
        i = self._slot.get(id(t))
        if i is None:
            i = len(self.outputs)
            self._slot[id(t)] = i
            self.outputs.append(t)
        return f"___o[{i}]"

    def _size_expr(self, value) -> str:
        from .shapes import render
        sizes = self.sizes
        expr = sizes.env.replace(value.node.expr)
        names = {sym: f"{src[0][0]}.shape[{src[0][1]}]" for sym, src in sizes.sources.items()}
        return render(expr, names)

    def expr(self, value, depth: int = 0) -> str:
        """A Python expression (over ``___o`` and bound constants) that rebuilds ``value``."""
        if depth > 20:
            raise Unsupported("unsupported construct", "return value nested too deeply")
        if isinstance(value, TensorVar):
            return self.slot(value)
        if isinstance(value, torch.SymInt):
            return self._size_expr(value)
        copied = self.external_copies.get(id(value))
        if copied is not None and copied[0] is value:
            return copied[1]   # the caller's own list/dict, not our copy of it
        owner = getattr(value, "__self__", None)
        if owner is not None and type(value) is _BUILTIN_METHOD:
            copied = self.external_copies.get(id(owner))
            if copied is not None and copied[0] is owner:
                return f"{copied[1]}.{value.__name__}"
        if value is NULL:
            raise Unsupported("unsupported construct", "NULL in the return value")
        t = type(value)
        if t is tuple:
            inner = ", ".join(self.expr(v, depth + 1) for v in value)
            return f"({inner},)" if len(value) == 1 else f"({inner})"
        if t is list:
            return "[" + ", ".join(self.expr(v, depth + 1) for v in value) + "]"
        if t is dict:
            return "{" + ", ".join(f"{self.expr(k, depth + 1)}: {self.expr(v, depth + 1)}"
                                   for k, v in value.items()) + "}"
        if isinstance(value, tuple) and hasattr(value, "_fields"):  # namedtuple
            return f"{self.guards.const(t, 'C')}(" + ", ".join(
                self.expr(v, depth + 1) for v in value) + ")"
        if t is torch.Size and any(isinstance(v, torch.SymInt) for v in value):
            return f"{self.guards.const(torch.Size, 'C')}([" + ", ".join(
                self.expr(v, depth + 1) for v in value) + "])"
        if t is TensorMethod:
            return f"{self.slot(value.tensor)}.{value.name}"
        if t is CapturedIter:
            return "iter([" + ", ".join(self.expr(v, depth + 1) for v in value.remaining()) + "])"
        if t is GradModeExit:
            ctx = value.context
            if ctx.kind == "grad":
                return f"{self.guards.const(runtime.enter_grad, 'F')}({ctx.target}, {ctx.prev})"
            a = ctx.autocast
            return (f"{self.guards.const(runtime.enter_autocast, 'F')}({a.device!r}, "
                    f"{self.guards.const(a.fast_dtype, 'D')}, {a._enabled}, {a._cache_enabled})")
        if t is types.MethodType:
            return (f"{self.guards.const(runtime.bound_method, 'F')}("
                    f"{self.expr(value.__func__, depth + 1)}, {self.expr(value.__self__, depth + 1)})")
        if t is types.FunctionType and self.is_internal(value):
            for cell in value.__closure__ or ():
                try:
                    contents = cell.cell_contents
                except ValueError:
                    continue
                if _contains_var(contents):
                    raise Unsupported("unsupported construct", "a closure over tensors lives "
                                      "across the graph break")
            return self.guards.const(value, "R")
        if t.__module__.startswith("torch.return_types"):   # structseqs: values, indices
            return f"{self.guards.const(t, 'C')}((" + ", ".join(
                self.expr(v, depth + 1) for v in value) + ",))"
        if is_constant_type(value) or not self.is_internal(value) and not _holds_tensor(value):
            return self.guards.const(value, "R")
        if t is LazyIter:
            # Python's own lazy iterator over what its sources have left: items not yet
            # consumed are computed when the caller (or the code after a break) asks.
            # Each expression builds a new one, so a second reference would not share it.
            if id(value) in self._rebuilt_lazy:
                raise Unsupported("unsupported construct", f"a {value.kind.__name__} iterator "
                                  "referenced twice lives across the graph break")
            self._rebuilt_lazy.add(id(value))
            sources = "[" + ", ".join(self.expr(v, depth + 1) for v in value.sources) + "]"
            return (f"{self.guards.const(rebuild_lazy, 'F')}({self.guards.const(value.kind, 'C')}"
                    f", {self.expr(value.fn, depth + 1)}, {sources}, "
                    f"{self.expr(value.kwargs, depth + 1)})")
        if t is enumerate or hasattr(value, "__next__"):
            # An iterator of this capture (enumerate, iter(range)): the items it has left.
            left = list(itertools.islice(value, _MAX_ITEMS + 1))
            if len(left) > _MAX_ITEMS:
                raise Unsupported("unsupported construct", f"a huge or endless {t.__name__} "
                                  "leaves the compiled code")
            items = "[" + ", ".join(self.expr(v, depth + 1) for v in left) + "]"
            rebuild = self.guards.const(rebuild_iterator, "F")
            return f"{rebuild}({self.guards.const(t, 'C')}, {items})"
        if isinstance(value, BaseException):
            args = "(" + "".join(self.expr(v, depth + 1) + ", " for v in value.args) + ")"
            attrs = "{" + ", ".join(f"{k!r}: {self.expr(v, depth + 1)}"
                                    for k, v in vars(value).items()) + "}"
            rebuild = self.guards.const(rebuild_exception, "F")
            return f"{rebuild}({self.guards.const(t, 'C')}, {args}, {attrs})"
        if hasattr(value, "__dict__"):
            attrs = "{" + ", ".join(f"{k!r}: {self.expr(v, depth + 1)}"
                                    for k, v in vars(value).items()) + "}"
            items = "None"
            if isinstance(value, list):
                items = "[" + ", ".join(self.expr(v, depth + 1) for v in value) + "]"
            if isinstance(value, dict):
                items = "[" + ", ".join(f"({self.expr(k, depth + 1)}, {self.expr(v, depth + 1)})"
                                        for k, v in dict.items(value)) + "]"
            return (f"{self.guards.const(rebuild_object, 'F')}("
                    f"{self.guards.const(t, 'C')}, {attrs}, {items})")
        raise Unsupported("unsupported construct", f"returning a {t.__name__} built inside the "
                          "compiled function")


def _holds_tensor(value) -> bool:
    d = getattr(value, "__dict__", None)
    if d and any(isinstance(v, TensorVar) for v in d.values()):
        return True
    if isinstance(value, dict):
        return any(isinstance(v, TensorVar) for v in value.values())
    return False


def _contains_var(value) -> bool:
    return contains_tensor(value) or _holds_tensor(value)
