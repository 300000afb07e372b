"""One capture: the state shared by every frame of it (graph, guards, objects made inside).

The interpreter (``interpreter.py``) runs frames; this module answers the questions frames
ask: what is this value loaded from outside (and what must be guarded about it), what is
``obj.attr``, and what does calling this callable do (record a graph op, inline Python
code, or evaluate a pure function on constants). What a value read from outside becomes,
and the guards it gets, is ``outside.py``'s (the Tracer's base class).
"""
from __future__ import annotations

import inspect
import linecache
import sys
import types

import torch

from . import calls, calls_builtins, numpy_values
from .breaks import Unsupported
from .frame_exits import _PyException
from .graph import GraphBuilder
from .outside import _BUILTIN_METHOD, OutsideValues, is_library_module
from .selections import Selections
from .side_effects import SideEffects, DELETED, MISSING, is_data_descriptor
from .values import NdarrayVar, StorageVar, TensorVar, TensorMethod, python_getattribute

# Tensor attributes read from the fake tensor's metadata (static under static shapes).
TENSOR_METADATA_ATTRS = {
    "shape", "dtype", "device", "ndim", "is_cuda", "is_cpu", "is_meta", "is_sparse",
    "is_quantized", "is_mkldnn", "is_nested", "layout", "is_leaf", "requires_grad",
    "is_mps", "is_xpu",
}


class Tracer(OutsideValues):
    def __init__(self, builder: GraphBuilder, *, fullgraph: bool = False, dynamic=None,
                 symbolic_ints=frozenset(), replaced_buffers=frozenset()):
        self.builder = builder
        # buffers an earlier capture of this code assigned anew (context.py keeps them), and
        # those of them this capture read by source: (id(module), name)
        self.replaced_buffers = replaced_buffers
        self.buffers_by_source: set = set()
        # Which input dims are symbolic: True (all), or {expression: dims}; plus any dims the
        # user marked with tempa.mark_dynamic.
        self.dynamic = dynamic
        # The expressions whose Python ints are symbols (their value changed between calls;
        # True: every int read from the arguments, under dynamic=True), and every Python int
        # read from outside, by expression (what the next recompile compares,
        # context.CompileContext._symbolic_ints)
        self.symbolic_ints = symbolic_ints
        self.input_ints: dict[str, int] = {}
        self.guards = builder.guards
        self.fullgraph = fullgraph
        self._internal: dict[int, object] = {}      # objects created during capture
        # Our copies of the caller's lists/dicts: id(copy) -> (copy, expression of the original)
        self.external_copies: dict[int, tuple] = {}
        self._contents_guarded: set[int] = set()   # ids of containers read whole by C code
        # The caller's containers read as themselves (subclasses, and the containers in
        # them), handed on as themselves: id -> (object, expression)
        self.outside_containers: dict[int, tuple] = {}
        self._copy_of: dict[int, tuple] = {}   # id(original) -> (original, copy, expression)
        self.param_ids: set[int] = set()
        self.depth = 0
        self.instructions_run = 0
        self.side_effects = SideEffects()   # writes to outside objects, replayed after the graph
        self.paths: dict[int, str] = {}   # id(module) -> "self.h.0.attn", for readable names
        self.ndarrays: dict[int, tuple] = {}   # id(outside ndarray) -> (it, its NdarrayVar)
        # Objects made at capture by a library call that eager makes anew on every call
        # (a collections.namedtuple class): id -> (object, fn, args, kwargs), so the entry
        # calls fn again where the object leaves the capture.
        self.recipes: dict[int, tuple] = {}
        # The caller's plain objects guarded by type at their source, not by identity (a KV
        # cache made anew by every generate()): id -> (object, expression). Their reads go
        # through that expression; a use that depends on which object it is pins it.
        self.sourced: dict[int, tuple] = {}
        self._pinned: set[int] = set()
        self.current_frame = None   # the frame running an instruction (interpreter.Frame.run)
        self.selections = Selections()   # max()/min() over tensors made torch.where
        builder.graph.where = self.user_stack

    def user_stack(self) -> str:
        """Where the user's code is now: the frames being interpreted, outermost first,
        written as a traceback writes them (a graph node's ``stack_trace``)."""
        frames, frame = [], self.current_frame
        while frame is not None:
            frames.append(frame)
            frame = frame.parent
        lines = []
        for frame in reversed(frames):
            code = frame.code
            lineno = getattr(frame.current, "lineno", None) or code.co_firstlineno
            lines.append(f'  File "{code.co_filename}", line {lineno}, in {code.co_name}\n')
            text = linecache.getline(code.co_filename, lineno).strip()
            if text:
                lines.append(f"    {text}\n")
        return "".join(lines)

    # -- internal objects -------------------------------------------------------------
    def mark_internal(self, obj):
        self._internal[id(obj)] = obj
        return obj

    def is_internal(self, obj) -> bool:
        return self._internal.get(id(obj)) is obj


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
        """An expression for a fixed object: the object itself, bound as a constant; for
        our copy of a caller's function, the caller's function (its defaults are read there),
        and of a caller's list or tuple subclass, the caller's object."""
        if type(obj) is types.FunctionType:
            copied = self.external_copies.get(id(obj))
            if copied is not None and copied[0] is obj:
                return copied[1]
        copied = self._subclass_copy_source(obj)
        if copied is not None:
            return copied
        sourced = self.sourced.get(id(obj))
        if sourced is not None and sourced[0] is obj:
            return sourced[1]
        return self.guards.const(obj)

    # -- attributes ------------------------------------------------------------------
    def load_attr(self, obj, name: str, frame, *, generic: bool = False):
        """``obj.name`` as the code reads it; ``generic``: ``object.__getattribute__(obj,
        name)``, past the class's own Python ``__getattribute__``."""
        hook = python_getattribute(obj)
        if hook is not None and not generic and not self.is_internal(obj):
            if self.side_effects.has_writes_to(obj):
                # a Python __getattribute__ (a config's key aliasing) over an object this
                # capture wrote runs traced: the object.__getattribute__ it ends in (a generic
                # read) sees the pending writes, the real one would not
                return self._traced_getattribute(obj, name, frame, hook)
            if frame is not None and not isinstance(obj, _OWN_ATTRIBUTE_PROTOCOL):
                traced = self._getattribute_traced_if_pure(obj, name, frame, hook)
                if traced is not _UNTRACED:
                    return traced
        if self.side_effects:
            written = self.side_effects.pending_attr(obj, name)
            if written is DELETED:
                raise AttributeError(f"'{type(obj).__name__}' object has no attribute '{name}'")
            if written is not MISSING:
                return written
            own = self.side_effects.instance_dict(obj)
            if own is not None and not is_data_descriptor(type(obj), name, read=True):
                if name in own:
                    return own[name]   # obj.__dict__ was read (and maybe written) as our copy
                if name in obj.__dict__:
                    raise Unsupported("mutation of outside state", f"reading {name!r} after "
                                      "deleting it from the object's __dict__")
        if isinstance(obj, TensorVar):
            return self.tensor_attr(obj, name)
        if type(obj) is NdarrayVar:
            return numpy_values.array_attr(self, obj, name)
        if type(obj) is StorageVar:
            return calls.storage_attr(obj, name)
        getter = object.__getattribute__ if generic and hook is not None else getattr
        if self.is_internal(obj) or obj.__class__ in (list, tuple, dict) or \
                id(obj) in self.external_copies or _method_of_copy(self, obj):
            hook = self._class_hook_of_copy(obj, name) if frame is not None else None
            if hook is not None:
                return self._class_getattr_of_copy(obj, name, frame, hook)
            return self._static_or_concrete(obj, name, frame,
                                            guard=self._class_attr_of_copy(obj, name), getter=getter)
        if isinstance(obj, torch.nn.Module):
            return self.module_attr(obj, name, frame)
        if isinstance(obj, types.ModuleType):
            if is_library_module(obj):
                value = getattr(obj, name)
                if isinstance(value, torch.Tensor):
                    return self.external(value, f"{self.expr_of(obj)}.{name}", user=False)
                if not isinstance(value, types.ModuleType) and frame is not None and \
                        not self.is_library_globals(frame.f_globals):
                    # the user's own read of torch.get_device_module (F.gelu, ...): a patch
                    # of it (mock.patch) is then seen. The library's reads inside its own
                    # code are its business, as in eager only a patch the code reads counts.
                    expr = f"{self.expr_of(obj)}.{name}"
                    self.guards.identity(expr, value, expr)
                return value
            return self._guarded_getattr(obj, name, lambda: getattr(obj, name))
        return self._static_or_concrete(obj, name, frame, guard=True, getter=getter)

    def _class_attr_of_copy(self, obj, name: str) -> bool:
        """``obj.name`` on our copy of a caller's list or tuple subclass finds the class's
        method or constant (not one set on the object, which the copy holds at its source,
        nor a descriptor reading the copy, a namedtuple's field): guarded as on the caller's
        object, so a patched ``Seq.total`` is seen."""
        if self._subclass_copy_source(obj) is None or name in getattr(obj, "__dict__", {}) or \
                name.startswith("__") and name.endswith("__"):
            return False
        try:
            static = inspect.getattr_static(type(obj), name)
        except AttributeError:
            return True   # (its absence, guarded)
        return isinstance(static, types.FunctionType) or not hasattr(type(static), "__get__")

    def _class_hook_of_copy(self, obj, name: str):
        """``obj.name`` on our copy of a caller's list or tuple subclass that the class
        answers with code of its own: a descriptor that is no plain function (a classmethod,
        staticmethod, property) or, the name being nowhere on the class, its Python
        ``__getattr__``. Guarded as the class holds it (a patched ``Seq.scale`` or
        ``Seq.__getattr__`` is seen; their values are read from the copy, never in a
        guard). Returns the ``__getattr__`` to run traced, ``False`` for a descriptor (read
        as usual), None where neither applies."""
        if self._subclass_copy_source(obj) is None or name in getattr(obj, "__dict__", {}) or \
                name.startswith("__") and name.endswith("__"):
            return None
        cls, g = type(obj), self.guards
        static = inspect.getattr_static(cls, name, _ABSENT)
        if static is _ABSENT:
            fallback = inspect.getattr_static(cls, "__getattr__", _ABSENT)
            if not isinstance(fallback, types.FunctionType):
                return None
            g.add("module", f"{g.const(class_attribute, 'F')}({g.const(cls, 'T')}, "
                  f"'__getattr__') is {g.const(fallback, 'F')}",
                  f"{cls.__name__}.__getattr__ is the same function")
            g.add("module", f"{g.const(class_attribute, 'F')}({g.const(cls, 'T')}, {name!r}) "
                  f"is {g.const(_ABSENT)}", f"{cls.__name__}.{name} does not exist")
            return fallback
        if isinstance(static, types.FunctionType) or not hasattr(type(static), "__get__"):
            return None
        g.add("module", f"{g.const(class_attribute, 'F')}({g.const(cls, 'T')}, {name!r}) is "
              f"{g.const(static)}", f"{cls.__name__}.{name} is the same {type(static).__name__}")
        return False

    def _class_getattr_of_copy(self, obj, name: str, frame, fallback):
        """``obj.name`` as the class's descriptor or ``__getattr__`` answers it on our copy
        (``_class_hook_of_copy`` guarded which): the ``__getattr__`` runs traced, so what it
        reads is this call's and what it does happens on every call; an AttributeError it
        raises is the read's, which ``getattr(obj, name, default)`` and hasattr catch."""
        if fallback is False:
            return self._static_or_concrete(obj, name, frame, guard=False)
        try:
            return frame.call(fallback, [obj, name], {})
        except _PyException as e:
            raise _as_attribute_error(e) from None

    def _subclass_copy_source(self, obj):
        """The caller's expression our copy ``obj`` of a list or tuple subclass stands for."""
        copied = self.external_copies.get(id(obj))
        if copied is None or copied[0] is not obj or type(obj) in (list, tuple) or \
                not isinstance(obj, (list, tuple)):
            return None
        return copied[1]

    def _getattribute_traced_if_pure(self, obj, name: str, frame, hook):
        """``obj.name`` through the class's Python ``__getattribute__``, run traced: the
        guards then read what the hook read (the instance dict and class entries through
        ``object.__getattribute__``, a table it looks the key up in), at C speed and under
        version tags (capture/cache.py ``versioned_roots``), instead of the hook running on
        every call (an HF config's two chained hooks: ~0.8 µs a read, ~1.4 µs a missing one).
        A hook the interpreter cannot run is read as before: the concrete value, guarded by
        the expression that runs the hook (_UNTRACED then); one that writes outside state
        is a graph break (its writes happen on every read in eager)."""
        # what decides that this hook runs: the object's class, and the class's hook
        g, cls = self.guards, type(obj)
        c = g.const(cls, "T")
        g.add("module", f"type({self.expr_of(obj)}) is {c}", f"{self.expr_of(obj)} is a {cls.__name__}")
        g.add("module", f"{c}.__getattribute__ is {g.const(hook, 'F')}",
              f"{cls.__name__}.__getattribute__ is the same function")
        writes = self.side_effects.writes
        before, mark, ints = dict(writes), g.mark(), dict(self.input_ints)
        try:
            value = self._traced_getattribute(obj, name, frame, hook)
        except Unsupported:
            # what the abandoned trace read is read again by the hook itself, which may
            # change it (a hook that counts its reads): its guards would be stale
            g.forget_since(mark)
            self.input_ints.clear()
            self.input_ints.update(ints)
            value = _UNTRACED
        except AttributeError:
            _refuse_new_writes(writes, before, obj, name)
            raise
        _refuse_new_writes(writes, before, obj, name)
        return value

    def _traced_getattribute(self, obj, name: str, frame, hook):
        # As Python does, an AttributeError tries __getattr__; one that escapes is raised
        # as a plain AttributeError, which getattr(obj, name, default) and hasattr catch.
        fallback = getattr(type(obj), "__getattr__", None)
        try:
            return frame.call(hook, [obj, name], {})
        except _PyException as e:
            if not (isinstance(e.exc, AttributeError) and isinstance(fallback, types.FunctionType)):
                raise _as_attribute_error(e) from None
        try:
            return frame.call(fallback, [obj, name], {})
        except _PyException as e:
            raise _as_attribute_error(e) from None

    def _guarded_getattr(self, obj, name: str, read, getter=getattr):
        """``read()`` = ``getter(obj, name)`` of an outside object: guarded by value when
        present, by its absence when it raises AttributeError (``getattr(cfg, "x",
        default)``)."""
        o = self.expr_of(obj)
        expr = f"{o}.{name}" if getter is getattr else \
            f"{self.guards.const(getter, 'F')}({o}, {name!r})"
        try:
            value = read()
        except AttributeError:
            has = self.guards.const(hasattr if getter is getattr else has_object_attribute, 'F')
            self.guards.add("constant", f"not {has}({o}, {name!r})", f"{expr} does not exist")
            raise
        # A tensor held by a plain object (a KV cache's layer, an optimizer's state) is
        # data, not a weight: a graph input read through its source on every call and
        # guarded on its metadata, so the object may hold a new tensor on the next call.
        # A module object's tensors (a library's constant) keep their identity guard.
        data = not isinstance(obj, (types.ModuleType, torch.nn.Module, type))
        result = self.external(value, expr, user=data)
        if name == "__dict__" and id(result) in self.external_copies:
            if isinstance(obj, torch.nn.Module):
                self.side_effects.refuse_writes(result)
            else:
                self.side_effects.track_instance_dict(obj, result)
        return result

    def _static_or_concrete(self, obj, name, frame, *, guard: bool, getter=getattr):
        # Properties and Python-level descriptors run their Python code in the interpreter
        # (they may touch tensors); everything else is read directly, by ``getter``
        # (``object.__getattribute__`` for a generic read, past the class's own).
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
        get = getattr(type(static), "__get__", None)
        if isinstance(get, types.FunctionType) and self.side_effects.has_writes_to(obj):
            # a Python descriptor over an object this capture wrote: its code must see the
            # pending writes, so it runs in the interpreter
            return frame.call(get, [static, obj, type(obj)], {})
        if isinstance(static, (classmethod,)) and isinstance(static.__func__, types.FunctionType):
            return types.MethodType(static.__func__, obj if isinstance(obj, type) else type(obj))
        if isinstance(static, staticmethod):
            return static.__func__
        if not guard:
            get = _python_descriptor_get(obj, name, static)
            if get is not None:   # lazy_property and the like: their code runs traced
                return frame.call(get, [static, obj, type(obj)], {})
            return getter(obj, name)  # may raise AttributeError: the frame handles it
        value = getter(obj, name) if inspect.isroutine(static) else None
        if value is not None and getter(obj, name) is not value:
            return value   # a C method, bound afresh on each read: its class decides it
        return self._guarded_getattr(obj, name, lambda: getter(obj, name), getter)

    def _guard_class_method(self, obj, name: str, fn, inst_dict) -> None:
        """``obj.name`` resolved to the class's function ``fn``: guard the class (a
        ``__class__`` swap), the class attribute (a patched method) and that no instance
        attribute shadows it (``obj.name = other``)."""
        g, cls = self.guards, type(obj)
        o, c = self.expr_of(obj), g.const(cls, "T")
        g.add("module", f"{o}.__class__ is {c}", f"{o} is a {cls.__name__}")
        g.add("module", f"{c}.{name} is {g.const(fn, 'F')}", f"{cls.__name__}.{name} is the same function")
        if isinstance(inst_dict, dict):
            # an object guarded by type: its own __dict__, read at its source
            own = f"{o}.__dict__" if id(obj) in self.sourced or id(obj) in self.external_copies \
                else g.const(inst_dict, 'ID')
            g.add("module", f"{name!r} not in {own}", f"{o}.{name} is not overridden on the instance")

    def module_attr(self, mod: torch.nn.Module, name: str, frame):
        """``mod.name`` as ``Module.__getattr__`` finds it, guarded at its source: the entry
        of ``_parameters``/``_buffers``/``_modules`` (bound as constants: a direct write such
        as ``m._modules["fc"] = new`` or ``del m.fc`` is seen, not only ``setattr``)."""
        d = mod.__dict__
        g = self.guards
        for table in ("_parameters", "_buffers", "_modules"):
            entries = d.get(table)
            copied = self._copy_of.get(id(entries)) if entries is not None else None
            if copied is not None and copied[0] is entries:
                # The code read this table as a dict (`m._parameters["w"] = new`, what
                # functional_call does): its writes live in our copy, whose entries were
                # guarded at their sources when it was made, so read it there.
                if name in copied[1]:
                    return copied[1][name]
                if name in entries and name not in d and not hasattr(type(mod), name):
                    # deleted from the table by this call (`del m._buffers["b"]`)
                    raise AttributeError(f"'{type(mod).__name__}' object has no attribute '{name}'")
                continue
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
            if table == "_buffers" and (id(mod), name) in self.replaced_buffers:
                # a new tensor on every call (an EMA by assignment, a KV cache grown by
                # torch.cat): read at its source like an argument, guarded by its metadata;
                # by identity, every call would recapture
                self.buffers_by_source.add((id(mod), name))
                g.name(src, where)
                return self.builder.user_input(value, src, self.dynamic_dims(value, src))
            const = g.const(value, 'P' if table != '_modules' else 'O')
            g.name(const, where)
            g.add("module", f"{src} is {const}", f"{where} is the same {table[1:-1]}")
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
        if name == "__class__":   # as type(x) answers (a Parameter's class is Parameter)
            return calls_builtins._tensor_type(self, t)
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
        if name in ("grad_fn", "_version", "data_ptr", "_base"):
            if name == "data_ptr":
                raise Unsupported("data-dependent value", f"tensor.{name} needs the real storage")
            raise Unsupported("tensor attribute", f"reading tensor.{name} inside a graph")
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
        self.selections.note_identity((key,))
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
            raise Unsupported("tensor attribute", "reading .grad of a tensor computed "
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


def _python_descriptor_get(obj, name: str, static):
    """The Python ``__get__`` that ``obj.name`` runs (a class attribute whose type defines
    it in Python, not shadowed by the instance dict unless it is a data descriptor), or None."""
    if static is None or isinstance(obj, type):
        return None
    get = getattr(type(static), "__get__", None)
    if not isinstance(get, types.FunctionType):
        return None
    is_data = hasattr(type(static), "__set__") or hasattr(type(static), "__delete__")
    inst = getattr(obj, "__dict__", None)
    if not is_data and isinstance(inst, dict) and name in inst:
        return None
    return get



def _method_of_copy(tracer, obj) -> bool:
    """``out.append`` of our copy of a caller's list: its attributes (``__self__``) are ours."""
    return type(obj) is _BUILTIN_METHOD and id(getattr(obj, "__self__", None)) in \
        tracer.external_copies


def _as_attribute_error(e: _PyException) -> Exception:
    return e.exc if isinstance(e.exc, AttributeError) else e


_ABSENT = object()


def class_attribute(cls: type, name: str):
    """Guard helper: what ``cls`` holds at ``name`` (its own or a base's), without running
    a descriptor; ``_ABSENT`` where it holds nothing."""
    return inspect.getattr_static(cls, name, _ABSENT)


_UNTRACED = object()   # _getattribute_traced_if_pure: the hook was not run traced


def _refuse_new_writes(writes: dict, before: dict, obj, name: str) -> None:
    """A traced ``__getattribute__`` recorded writes to outside state (``writes``, since
    ``before``): eager's hook writes on every read, which the capture cannot replay as a
    read; the code around the read runs eagerly (a graph break)."""
    if writes.keys() != before.keys() or any(writes[k] is not v for k, v in before.items()):
        raise Unsupported("mutation of outside state", f"{type(obj).__name__}.__getattribute__ "
                          f"writes while reading {name!r}")
# Objects whose attribute reads have their own protocol here (module_attr, class and module
# attributes): their Python __getattribute__, if any, is read as before.
_OWN_ATTRIBUTE_PROTOCOL = (torch.nn.Module, type, types.ModuleType)


def has_object_attribute(obj, name: str) -> bool:
    """``hasattr`` as ``object.__getattribute__`` answers it (past the class's own)."""
    try:
        object.__getattribute__(obj, name)
    except AttributeError:
        return False
    return True
