"""One capture: the state shared by every frame of it (graph, guards, objects made inside).

The interpreter (``interpreter.py``) runs frames; this module answers the questions frames
ask: what is this value loaded from outside (and what must be guarded about it), what is
``obj.attr``, and what does calling this callable do (record a graph op, inline Python
code, or evaluate a pure function on constants).
"""
from __future__ import annotations

import builtins
import collections
import inspect
import sys
import types

import torch

from . import calls
from .breaks import Unsupported
from .graph import GraphBuilder
from .guards import is_constant_type
from .values import TensorVar, TensorMethod

# Tensor attributes read from the fake tensor's metadata (static under static shapes).
TENSOR_METADATA_ATTRS = {
    "shape", "dtype", "device", "ndim", "is_cuda", "is_cpu", "is_meta", "is_sparse",
    "is_quantized", "is_mkldnn", "is_nested", "layout", "is_leaf", "requires_grad",
    "is_mps", "is_xpu",
}
_BUILTIN_METHOD = type([].append)
# Library packages whose module objects (only the real ones, found in sys.modules under
# their own name) are not guarded: their attributes are code, not user state. Nothing is
# exempt by name alone (a user's ``remote_cfg`` or ``torch_utils`` is guarded like any object).
_LIBRARY_PACKAGES = frozenset({
    "torch", "math", "cmath", "operator", "builtins", "functools", "itertools", "collections",
    "typing", "transformers", "numpy", "warnings", "logging", "inspect", "dataclasses",
    "contextlib", "enum", "copy", "abc", "types", "re", "einops", "sys"})
# Containers deeper than this are not guarded item by item: capture gives up on the frame
# (it runs eagerly, and says so) instead of recursing towards the interpreter's limit.
_MAX_GUARD_DEPTH = 32


def is_library_module(value) -> bool:
    name = getattr(value, "__name__", None)
    return isinstance(value, types.ModuleType) and isinstance(name, str) and \
        name.partition(".")[0] in _LIBRARY_PACKAGES and sys.modules.get(name) is value


class Tracer:
    def __init__(self, builder: GraphBuilder, *, fullgraph: bool = False, dynamic=None):
        self.builder = builder
        # Which input dims are symbolic: True (all), or {expression: dims}; plus any dims the
        # user marked with tempa.mark_dynamic.
        self.dynamic = dynamic
        self.guards = builder.guards
        self.fullgraph = fullgraph
        self._internal: dict[int, object] = {}      # objects created during capture
        # Our copies of the caller's lists/dicts: id(copy) -> (copy, expression of the original)
        self.external_copies: dict[int, tuple] = {}
        self._copy_of: dict[int, tuple] = {}   # id(original) -> (original, copy, expression)
        self.param_ids: set[int] = set()
        self.depth = 0
        self.instructions_run = 0
        self.attr_writes: dict[tuple[int, str], tuple] = {}  # (id, name) -> (obj, name, value)
        self.paths: dict[int, str] = {}   # id(module) -> "self.h.0.attn", for readable names

    # -- internal objects -------------------------------------------------------------
    def mark_internal(self, obj):
        self._internal[id(obj)] = obj
        return obj

    def is_internal(self, obj) -> bool:
        return self._internal.get(id(obj)) is obj

    # -- values entering from outside the captured code -----------------------------
    def external(self, value, expr: str, *, user: bool = True, depth: int = 0):
        """Wrap ``value`` read at ``expr`` (an expression valid in the guard function) and
        record what the graph assumes about it."""
        if isinstance(value, torch.Tensor):
            if user:
                return self.builder.user_input(value, expr, self.dynamic_dims(value, expr))
            self.guards.identity(expr, value, expr)
            return self.builder.attr_input(value, expr)
        if is_constant_type(value):
            self.guards.constant(expr, value)
            return value
        if depth >= _MAX_GUARD_DEPTH and isinstance(value, (list, tuple, dict, set, frozenset)):
            raise Unsupported("unsupported construct", f"{expr[:60]}...: a container nested "
                              f"more than {_MAX_GUARD_DEPTH} deep")
        t = type(value)
        guards = self.guards
        if t is list or t is dict:
            copied = self._copy_of.get(id(value))
            if copied is not None and copied[0] is value:
                # The same list/dict reached twice (`out` and `out.append.__self__`): one
                # copy, so `is` answers as in eager, and a guard that they stay one object.
                guards.add("length", f"{expr} is {copied[2]}", f"{expr} is {copied[2]}")
                return copied[1]
        if t is tuple or t is list:
            guards.add("length", f"{expr}.__class__ is {guards.const(t, 'T')} and "
                       f"len({expr}) == {len(value)}", f"{expr} is a {t.__name__} of "
                       f"length {len(value)}")
            items = [self.external(v, f"{expr}[{i}]", user=user, depth=depth + 1)
                     for i, v in enumerate(value)]
            if t is tuple:
                return tuple(items)
            self.external_copies[id(items)] = (items, expr)
            self._copy_of[id(value)] = (value, items, expr)
            return items
        if t in (dict, collections.OrderedDict, collections.defaultdict):
            return self._external_dict(value, expr, user, depth)
        if (t is set or t is frozenset) and all(is_constant_type(v) for v in value):
            guards.add("constant", f"{expr}.__class__ is {guards.const(t, 'T')} and "
                       f"{expr} == {guards.const(frozenset(value), 'V')}", f"{expr} == {value!r}")
            copy = set(value) if t is set else value
            if t is set:
                self.external_copies[id(copy)] = (copy, expr)
                self._copy_of[id(value)] = (value, copy, expr)
            return copy
        owner = getattr(value, "__self__", None)
        if t is _BUILTIN_METHOD and type(owner) in (list, dict):
            # `out.append` passed in (a resume function's argument): a new bound method on
            # every call, so guard its list instead, and call it on our copy of that list
            # (where a mutation is a graph break, never a change made once at capture).
            guards.add("constant", f"{expr}.__class__ is {guards.const(t, 'T')} and "
                       f"{expr}.__name__ == {value.__name__!r}", f"{expr} is "
                       f"{type(owner).__name__}.{value.__name__} of {expr}.__self__")
            return getattr(self.external(owner, f"{expr}.__self__", user=user, depth=depth + 1),
                           value.__name__)
        if isinstance(value, torch.nn.Module):
            guards.identity(expr, value, expr)
            self.builder.modules[id(value)] = value
            return value
        if t is types.MethodType:
            # A bound method is a new object on every `obj.method` read (a resume function's
            # `cm.__exit__` argument): its function and its object are what is the same.
            guards.add("identity", f"{expr}.__class__ is {guards.const(t, 'T')} and "
                       f"{expr}.__func__ is {guards.const(value.__func__, 'F')}",
                       f"{expr} is {value.__func__.__qualname__} bound")
            owner = self.external(value.__self__, f"{expr}.__self__", user=user, depth=depth + 1)
            return value if owner is value.__self__ else types.MethodType(value.__func__, owner)
        if is_library_module(value):
            return value
        guards.identity(expr, value, expr)
        return value

    def _external_dict(self, value: dict, expr: str, user: bool, depth: int) -> dict:
        """A caller's dict (any keys; OrderedDict and defaultdict too): its type and keys in
        order are guarded, each value by its own source; capture works on a copy, so a
        write to it is seen (and breaks the graph) instead of reaching the caller's dict."""
        guards, t = self.guards, type(value)
        keys = tuple(value.keys())
        if all(is_constant_type(k) for k in keys):
            check = f"{expr}.__class__ is {guards.const(t, 'T')} and tuple({expr}) == {guards.const(keys, 'K')}"
        else:
            # Objects as keys (an optimizer's state, keyed by parameters) are the same objects:
            # `==` on tensors would compare values, and raise for more than one element.
            check = (f"{expr}.__class__ is {guards.const(t, 'T')} and "
                     f"{guards.const(same_keys, 'F')}({expr}, {guards.const(keys, 'K')})")
        if not all(type(k) is str for k in keys):
            # 1 == True == 1.0 as keys: the key types are part of what the code saw
            check += f" and tuple(map(type, {expr})) == {guards.const(tuple(map(type, keys)), 'K')}"
        if t is collections.defaultdict:
            check += f" and {expr}.default_factory is {guards.const(value.default_factory)}"
        guards.add("length", check, f"{expr} is a {t.__name__} with keys {keys}")
        items = [(k, self.external(v, f"{expr}[{guards.const(k, 'K')}]" if type(k) is not str
                                   else f"{expr}[{k!r}]", user=user, depth=depth + 1))
                 for k, v in value.items()]
        if t is collections.defaultdict:
            copy = _CapturedDefaultDict(value.default_factory, items)
        else:
            copy = t(items)
        self.external_copies[id(copy)] = (copy, expr)
        self._copy_of[id(value)] = (value, copy, expr)
        return copy

    @staticmethod
    def is_library_globals(g: dict) -> bool:
        """``g`` is the global namespace of a real library module (torch's own code)."""
        mod = sys.modules.get(g.get("__name__") or "")
        return mod is not None and is_library_module(mod) and mod.__dict__ is g

    def dynamic_dims(self, tensor: torch.Tensor, expr: str) -> set:
        if self.builder.sizes is None:
            return set()
        dims = set(getattr(tensor, "_tempa_dynamic_dims", ()))
        if self.dynamic is True:
            dims |= set(range(tensor.dim()))
        elif isinstance(self.dynamic, dict):
            dims |= set(self.dynamic.get(expr, ()))
        dims -= set(getattr(tensor, "_tempa_static_dims", ()))
        # dims remembered from an earlier call of another rank (a bias (4,) after (3, 4))
        return dims & set(range(tensor.dim()))

    def expr_of(self, obj) -> str:
        """An expression for a fixed object: the object itself, bound as a constant."""
        return self.guards.const(obj)

    # -- attributes ------------------------------------------------------------------
    def load_attr(self, obj, name: str, frame):
        if self.attr_writes:
            written = self.attr_writes.get((id(obj), name))
            if written is not None and written[0] is obj:
                return written[2]
        if isinstance(obj, TensorVar):
            return self.tensor_attr(obj, name)
        if self.is_internal(obj) or obj.__class__ in (list, tuple, dict) or \
                id(obj) in self.external_copies or _method_of_copy(self, obj):
            return self._static_or_concrete(obj, name, frame, guard=False)
        if isinstance(obj, torch.nn.Module):
            return self.module_attr(obj, name, frame)
        if isinstance(obj, types.ModuleType):
            if is_library_module(obj):
                value = getattr(obj, name)
                return value if not isinstance(value, torch.Tensor) else \
                    self.external(value, f"{self.expr_of(obj)}.{name}", user=False)
            return self._guarded_getattr(obj, name, lambda: getattr(obj, name))
        return self._static_or_concrete(obj, name, frame, guard=True)

    def _guarded_getattr(self, obj, name: str, read):
        """``read()`` = ``obj.name`` of an outside object: guarded by value when present,
        by its absence when it raises AttributeError (``getattr(cfg, "x", default)``)."""
        expr = f"{self.expr_of(obj)}.{name}"
        try:
            value = read()
        except AttributeError:
            self.guards.add("constant", f"not {self.guards.const(hasattr, 'F')}({self.expr_of(obj)}, "
                            f"{name!r})", f"{expr} does not exist")
            raise
        return self.external(value, expr, user=False)

    def _static_or_concrete(self, obj, name, frame, *, guard: bool):
        # Properties and Python-level descriptors run their Python code in the interpreter
        # (they may touch tensors); everything else is read directly.
        try:
            static = inspect.getattr_static(obj, name)
        except AttributeError:
            static = None
        if isinstance(static, property) and static.fget is not None and \
                isinstance(static.fget, types.FunctionType):
            return frame.call(static.fget, [obj], {})
        if isinstance(static, types.FunctionType) and not (isinstance(obj, type)):
            inst_dict = getattr(obj, "__dict__", None)
            if not (isinstance(inst_dict, dict) and name in inst_dict):
                if guard:
                    self._guard_class_method(obj, name, static, inst_dict)
                return types.MethodType(static, obj)
        if isinstance(static, (classmethod,)) and isinstance(static.__func__, types.FunctionType):
            return types.MethodType(static.__func__, obj if isinstance(obj, type) else type(obj))
        if isinstance(static, staticmethod):
            return static.__func__
        if not guard:
            return getattr(obj, name)  # may raise AttributeError: the frame handles it
        value = getattr(obj, name) if inspect.isroutine(static) else None
        if value is not None and getattr(obj, name) is not value:
            return value   # a C method, bound afresh on each read: its class decides it
        return self._guarded_getattr(obj, name, lambda: getattr(obj, name))

    def _guard_class_method(self, obj, name: str, fn, inst_dict) -> None:
        """``obj.name`` resolved to the class's function ``fn``: guard the class (a
        ``__class__`` swap), the class attribute (a patched method) and that no instance
        attribute shadows it (``obj.name = other``)."""
        g, cls = self.guards, type(obj)
        o, c = self.expr_of(obj), g.const(cls, "T")
        g.add("module", f"{o}.__class__ is {c}", f"{o} is a {cls.__name__}")
        g.add("module", f"{c}.{name} is {g.const(fn, 'F')}", f"{cls.__name__}.{name} is the same function")
        if isinstance(inst_dict, dict):
            g.add("module", f"{name!r} not in {g.const(inst_dict, 'ID')}",
                  f"{o}.{name} is not overridden on the instance")

    def module_attr(self, mod: torch.nn.Module, name: str, frame):
        """``mod.name`` as ``Module.__getattr__`` finds it, guarded at its source: the entry
        of ``_parameters``/``_buffers``/``_modules`` (bound as constants: a direct write such
        as ``m._modules["fc"] = new`` or ``del m.fc`` is seen, not only ``setattr``)."""
        d = mod.__dict__
        g = self.guards
        for table in ("_parameters", "_buffers", "_modules"):
            entries = d.get(table)
            if entries is None or name not in entries:
                continue
            value = entries[name]
            # Sequential/ModuleList deletions replace the whole `_modules` dict: read it
            # through the instance dict each time; `_parameters`/`_buffers` change in place
            src = f"{g.const(d, 'ID')}['_modules'][{name!r}]" if table == "_modules" else \
                f"{g.const(entries, 'MD')}[{name!r}]"
            where = f"{self.path_of(mod)}.{name}"
            if value is None:
                g.add("module", f"{src} is None", f"{where} is None")
                return None
            g.add("module", f"{src} is {g.const(value, 'P' if table != '_modules' else 'O')}",
                  f"{where} is the same {table[1:-1]}")
            if table == "_parameters":
                self.param_ids.add(id(value))
            if table == "_modules":
                self.builder.modules[id(value)] = value
                self.paths.setdefault(id(value), where)
                return value
            return self.builder.attr_input(value, where)
        if name in d:
            value = d[name]
            if isinstance(value, torch.Tensor):
                self.guards.identity(f"{self.expr_of(mod)}.{name}", value)
                return self.builder.attr_input(value, f"{self.path_of(mod)}.{name}")
            return self.external(value, f"{self.expr_of(mod)}.{name}", user=False)
        return self._static_or_concrete(mod, name, frame, guard=True)

    def guard_module_contents(self, mod: torch.nn.Module) -> None:
        """A container module (Sequential, ModuleList, ParameterList, ...) iterated, indexed,
        measured or searched: its children and parameters, in order, are what the code saw
        (``del seq[1]``, ``seq.insert``, ``m._modules[k] = new`` are then seen)."""
        g = self.guards
        d = mod.__dict__
        for table in ("_modules", "_parameters"):
            entries = d.get(table)
            if entries:
                g.add("module", f"tuple({g.const(d, 'ID')}[{table!r}].items()) == "
                      f"{g.const(tuple(entries.items()), 'K')}",
                      f"{self.path_of(mod)} has the same {table[1:]}")

    def tensor_attr(self, t: TensorVar, name: str):
        fake = t.fake
        if name in TENSOR_METADATA_ATTRS:
            if name == "requires_grad" and t.node.op == "placeholder":
                # Reading requires_grad of an input: the graph depends on it.
                pass
            return getattr(fake, name)
        if name == "T":
            return self.builder.call("call_method", "permute", (t, *reversed(range(fake.dim()))), {})
        if name == "mT":
            return self.builder.call("call_method", "transpose", (t, -2, -1), {})
        if name == "data":
            return self.builder.call("call_method", "detach", (t,), {})
        if name in ("real", "imag", "H", "mH"):
            return self.builder.call("call_function", getattr, (t, name), {})
        if name == "grad":
            return self._grad_input(t)
        if name in ("grad_fn", "_version", "untyped_storage", "data_ptr", "_base"):
            if name in ("data_ptr", "untyped_storage"):
                raise Unsupported("data-dependent value", f"tensor.{name} needs the real storage")
            raise Unsupported("unsupported construct", f"reading tensor.{name} inside a graph")
        if hasattr(torch.Tensor, name):
            return TensorMethod(t, name)
        return self._tensor_instance_attr(t, name)

    def tensor_key(self, container, key: TensorVar):
        """``key`` used as a key of a dict or set (``d[p]``, ``p in d``, ``d.get(p)``): the
        tensor object it stands for, as eager hashes by identity. A caller's dict (an
        optimizer's ``state``, keyed by the parameters; its keys are guarded by identity in
        ``_external_dict``) holds the real tensors; a dict built during capture may hold the
        TensorVars themselves. A tensor computed in the graph is a new object in eager,
        so it is in no caller's dict."""
        if not isinstance(container, (dict, set, frozenset)):
            raise Unsupported("data-dependent value", "indexing a Python container with a tensor")
        source = self.builder.input_source(key)
        if source is not None and (source[0] in container or id(container) in self.external_copies):
            return source[0]
        if id(container) in self.external_copies:
            return object()   # never a key there
        return key

    def _grad_input(self, t: TensorVar):
        """``p.grad`` of an input tensor (a parameter an optimizer steps, an argument): read
        on every call as an input of its own, its absence (None) or metadata guarded. Each
        backward may leave a new tensor there, so it is read by expression, not bound."""
        source = self.builder.input_source(t)
        if source is None:
            raise Unsupported("unsupported construct", "reading .grad of a tensor computed "
                              "inside the graph")
        tensor, expr = source
        grad, grad_expr = tensor.grad, f"{expr}.grad"
        if grad is None:
            self.guards.add("constant", f"{grad_expr} is None", f"{grad_expr} is None")
            return None
        return self.builder.user_input(grad, grad_expr, self.dynamic_dims(grad, grad_expr))

    def _tensor_instance_attr(self, t: TensorVar, name: str):
        """``x.name`` set by the user on an argument tensor (``x.test = None``): read from
        the tensor's ``__dict__``, its presence or absence guarded."""
        real = self.builder.argument_tensor(t)
        attrs = getattr(real, "__dict__", None) if real is not None else None
        if attrs is None:
            raise AttributeError(f"'Tensor' object has no attribute '{name}'")
        expr = self.builder.argument_expr(t)
        if name not in attrs:
            self.guards.add("constant", f"{name!r} not in {expr}.__dict__", f"{expr}.{name} does not exist")
            raise AttributeError(f"'Tensor' object has no attribute '{name}'")
        return self.external(attrs[name], f"{expr}.__dict__[{name!r}]", user=False)

    def path_of(self, mod) -> str:
        return self.paths.get(id(mod), type(mod).__name__)

    # -- calls -----------------------------------------------------------------------
    def call(self, frame, fn, args: list, kwargs: dict):
        return calls.call(self, frame, fn, args, kwargs)


class _CapturedDefaultDict(collections.defaultdict):
    """Capture's copy of a caller's defaultdict: reading a missing key would insert into
    the caller's dict, a write capture cannot replay, so it breaks the graph instead."""

    def __missing__(self, key):
        missing = Unsupported("mutation of outside state", "a missing key of a caller's defaultdict")
        missing.transient = True   # eager inserts it (an optimizer's state on its first step)
        raise missing


def same_keys(d: dict, keys: tuple) -> bool:
    """Guard helper: ``d``'s keys are ``keys`` in order; objects by identity, constants
    (strings, numbers) by value."""
    return len(d) == len(keys) and all(
        a is b or is_constant_type(a) and type(a) is type(b) and a == b for a, b in zip(d, keys))


def _method_of_copy(tracer, obj) -> bool:
    """``out.append`` of our copy of a caller's list: its attributes (``__self__``) are ours."""
    return type(obj) is _BUILTIN_METHOD and id(getattr(obj, "__self__", None)) in \
        tracer.external_copies


def builtin(name: str):
    return getattr(builtins, name)
