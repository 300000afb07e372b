"""The symbolic stack machine: runs one code object's bytecode over symbolic values.

One ``Frame`` per activation (the captured function and every function inlined into it).
Handlers are methods named after the normalised opcode (``instructions.py``); each returns
the index of the next instruction, or None to fall through. Where a handler's behaviour
depends on the CPython version it says so next to the code, with the version constant from
``instructions``; the dis documentation (docs.python.org/3/library/dis.html) is the spec.
"""
from __future__ import annotations

import operator
import types

import torch

from . import operators
from .breaks import Unsupported, UserError
from .graph import is_data_dependent_guard
from .context import CapturedContext
from .instructions import PY, NULL_BEFORE_CALLABLE, decode
from . import numpy_values, scalars
from .opcodes_data import DataOpcodes
from .side_effects import DELETED, MISSING, check_outside_attr_write, check_tensor_attr_write
from .values import NULL, TensorVar, SuperProxy, GradModeExit, CapturedIter, LazyIter, \
    GeneratorContext, GeneratorContextExit, check_own_iterator, contains_tensor, \
    python_descriptor_setter

_MAX_INSTRUCTIONS = 5_000_000
# (code, offset) pairs where capture breaks as if the instruction were unsupported: the
# differential test of resume functions (tests/capture/test_resume_differential.py).
FORCED_BREAKS: set = set()

_BINARY = {
    "ADD": operator.add, "SUBTRACT": operator.sub, "MULTIPLY": operator.mul,
    "TRUE_DIVIDE": operator.truediv, "FLOOR_DIVIDE": operator.floordiv,
    "REMAINDER": operator.mod, "POWER": operator.pow, "MATRIX_MULTIPLY": operator.matmul,
    "LSHIFT": operator.lshift, "RSHIFT": operator.rshift, "AND": operator.and_,
    "OR": operator.or_, "XOR": operator.xor,
}
_INPLACE = {
    "ADD": operator.iadd, "SUBTRACT": operator.isub, "MULTIPLY": operator.imul,
    "TRUE_DIVIDE": operator.itruediv, "FLOOR_DIVIDE": operator.ifloordiv,
    "REMAINDER": operator.imod, "POWER": operator.ipow, "MATRIX_MULTIPLY": operator.imatmul,
    "LSHIFT": operator.ilshift, "RSHIFT": operator.irshift, "AND": operator.iand,
    "OR": operator.ior, "XOR": operator.ixor,
}


class _PyException(Exception):
    """A Python exception raised by the interpreted code and not handled in its frame."""

    def __init__(self, exc: BaseException):
        super().__init__(repr(exc))
        self.exc = exc


def _is_repetition(a, b) -> bool:
    """``seq * n`` / ``n * seq`` of a list or tuple and an int."""
    return isinstance(a, (list, tuple)) and type(b) in (int, bool) or \
        isinstance(b, (list, tuple)) and type(a) in (int, bool)


class _Suspend(Exception):
    """YIELD_VALUE of a generator run step by step: the frame stops, resumable."""


class GeneratorRun:
    """A generator made in captured code: its frame run one step at a time, as CPython
    runs a generator, so its code and its consumer's interleave as in eager (a generator
    reading a list its consumer appends to sees each append). ``send`` resumes it at its
    ``yield`` (the value sent is the yield's result), ``throw`` raises an exception there
    (``@contextmanager``'s exit). Exceptions come out as Python's would (``StopIteration``
    at the end). Its items are never taken early: one alive when the capture ends is
    refused (``values.has_pending_calls``)."""
    runs_code = True

    def __init__(self, frame: "Frame"):
        self.frame = frame
        self.next_index = 0        # where to continue; None once finished
        self.started = False

    def __iter__(self):
        return self

    def __next__(self):
        return self.send(None)

    def send(self, value):
        frame = self.frame
        if self.next_index is None:
            raise StopIteration
        if self.started:
            frame.push(value)
        elif value is not None:
            raise TypeError("can't send non-None value to a just-started generator")
        self.started = True
        return self._continue(self.next_index)

    def throw(self, exc: BaseException):
        if self.next_index is None or not self.started:
            self.next_index = None
            raise exc
        frame = self.frame
        try:
            index = frame._raise(exc, frame.current)   # raised at the suspended yield
        except _PyException:
            index = None
        if index is None:   # not handled in the generator: it comes back out, unchanged
            self.next_index = None
            raise exc
        return self._continue(index)

    def close(self):
        if self.next_index is not None and self.started:
            try:
                self.throw(GeneratorExit())
            except (GeneratorExit, StopIteration):
                return
            raise RuntimeError("generator ignored GeneratorExit")
        self.next_index = None

    def _continue(self, index: int):
        frame = self.frame
        failure = None
        frame.tracer.depth += 1   # (a generator that makes generators: recursion's limit)
        try:
            frame.run(index)
        except _PyException as e:
            failure = e.exc
        finally:
            frame.tracer.depth -= 1
        if failure is not None:   # raised here, outside the except: no added __context__
            self.next_index = None
            if isinstance(failure, StopIteration):   # PEP 479 (3.12+ does it in bytecode)
                raise RuntimeError("generator raised StopIteration") from failure
            raise failure
        if frame.done:
            self.next_index = None
            raise StopIteration(frame.result)
        self.next_index = frame.current.index + 1
        return frame.suspended_value


def tensor_iter(builder, v: TensorVar) -> CapturedIter:
    """``iter(t)``, as Tensor.__iter__: the rows of ``t.unbind(0)``. A row is the same view
    as ``t[i]``, which is what the graph records (one op a row, as torch.compile), unless
    ``t`` requires grad: then an in-place op on a row of unbind's multi-output views raises
    in eager where one on ``t[i]`` does not, so the graph keeps unbind (and
    ``GraphBuilder.finish`` goes back to unbind for rows that an in-place op with an
    operand that requires grad writes into, for the same reason)."""
    if v.fake.dim() == 0:
        raise UserError(TypeError("iteration over a 0-d tensor"))
    rows = v.fake.shape[0]
    if v.fake.requires_grad or not isinstance(rows, int):
        return CapturedIter(list(builder.call("call_method", "unbind", (v, 0), {})))
    group = object()
    out = [builder.call("call_function", operator.getitem, (v, i), {}) for i in range(rows)]
    for row in out:
        row.node.meta["unbind_rows"] = group
    return CapturedIter(out)


class Frame(DataOpcodes):
    def __init__(self, tracer, code: types.CodeType, f_globals: dict, bound_locals: dict,
                 closure, *, name: str, parent=None, is_generator: bool = False,
                 stop_before: int | None = None):
        self.tracer = tracer
        self.code = code
        self.decoded = decode(code)
        self.instrs = self.decoded.instrs
        self.f_globals = f_globals
        self.name = name
        self.parent = parent
        self.is_generator = is_generator   # run by a GeneratorRun: it stops at each yield
        self.locals = dict(bound_locals)
        self.cells: dict[str, types.CellType] = {}
        for cname in code.co_cellvars:
            cell = types.CellType()
            if cname in self.locals:
                cell.cell_contents = self.locals.pop(cname)
            self.cells[cname] = tracer.mark_internal(cell)
        for cname, cell in zip(code.co_freevars, closure or ()):
            self.cells[cname] = cell
        self.stack: list = []
        self.kw_names = None
        self.exc_stack: list = []
        self.current = None
        self.result = None
        self.done = False
        # Graph breaks: the root frame counts the instructions it executes so that a second
        # capture can stop right before the one that broke (``stop_before``).
        self.executed = 0
        self.stop_before = stop_before
        self.stopped_at = None
        self.locals_dict = None     # what locals() returned (3.11/3.12 refresh that dict)
        self.suspended_value = None

    # -- the loop --------------------------------------------------------------------------
    def run(self, start: int = 0):
        tracer = self.tracer
        caller, tracer.current_frame = tracer.current_frame, self
        try:
            return self._run(start)
        finally:
            tracer.current_frame = caller

    def _run(self, start: int):
        instrs, i, tracer = self.instrs, start, self.tracer
        while not self.done:
            ins = instrs[i]
            self.current = ins
            if self.executed == self.stop_before:
                self.stopped_at = ins
                return None
            self.executed += 1
            tracer.instructions_run += 1
            try:
                if FORCED_BREAKS and (self.code, ins.offset) in FORCED_BREAKS:
                    raise Unsupported("forced break", "a break forced by a test")
                handler = getattr(self, ins.opname, None)
                if handler is None:
                    raise Unsupported("unsupported opcode", f"opcode {ins.opname}")
                try:
                    nxt = handler(ins)
                except Exception as e:
                    if is_data_dependent_guard(e):   # `if len(unique(x)) > 2:`, not the user's
                        raise Unsupported("data-dependent branch", "a decision on a size "
                                          "computed from tensor values") from None
                    raise
            except _Suspend:
                return None
            except Unsupported as u:
                if self.parent is None and u.root_count is None:
                    u.root_count, u.root_offset = self.executed - 1, ins.offset
                raise u.at(self.code.co_filename, ins.lineno, self.name)
            except UserError as e:
                nxt = self._raise(e.exc, ins)
            except _PyException as e:
                nxt = self._raise(e.exc, ins)
            except Exception as e:  # an exception of the interpreted code (AttributeError...)
                nxt = self._raise(e, ins)
            i = ins.index + 1 if nxt is None else nxt
        if tracer.instructions_run > _MAX_INSTRUCTIONS:
            raise Unsupported("instruction limit", "too many instructions (endless loop?)")
        return self.result

    def _raise(self, exc: BaseException, ins) -> int:
        entry = self.decoded.handler_for(ins.offset)
        if entry is None:
            raise _PyException(exc)
        del self.stack[entry.depth:]
        if entry.lasti:
            self.push(ins.offset)
        self.push(exc)
        return self.decoded.index_of_offset[entry.target]

    # -- stack helpers ---------------------------------------------------------------------
    def push(self, v):
        self.stack.append(v)

    def pop(self):
        return self.stack.pop()

    def popn(self, n: int) -> list:
        if n == 0:
            return []
        out = self.stack[-n:]
        del self.stack[-n:]
        return out

    def push_callable(self, fn):
        # 3.11/3.12: [NULL, callable]; 3.13: [callable, NULL].
        if NULL_BEFORE_CALLABLE:
            self.push(NULL)
            self.push(fn)
        else:
            self.push(fn)
            self.push(NULL)

    # -- services for calls.py / tracer.py -------------------------------------------------
    def call(self, fn, args, kwargs):
        if type(fn) is GradModeExit:
            fn.restore(self.tracer)
            return None
        if type(fn) is GeneratorContextExit:
            from . import stdlib
            return stdlib.exit_generator_context(self, fn, *args)
        return self.tracer.call(self, fn, list(args), dict(kwargs))

    def truth(self, v) -> bool:
        if isinstance(v, TensorVar):
            raise Unsupported("data-dependent branch", "a condition on a tensor's value")
        if v is NULL:
            raise Unsupported("unsupported construct", "truth of NULL")
        result = operators.truth(self, v)
        return bool(v) if result is operators.NATIVE else result

    def get_iter(self, v):
        if isinstance(v, TensorVar):
            return tensor_iter(self.tracer.builder, v)
        if numpy_values.is_array(v):
            return CapturedIter(numpy_values.iterate(self.tracer, v))
        if isinstance(v, torch.nn.Module):
            self.tracer.guard_module_contents(v)
            items = list(iter(v))
            out = []
            for i, item in enumerate(items):
                if isinstance(item, torch.nn.Module):
                    self.tracer.builder.modules[id(item)] = item
                    self.tracer.paths.setdefault(id(item), f"{self.tracer.path_of(v)}.{i}")
                if isinstance(item, torch.Tensor):
                    item = self.tracer.builder.attr_input(item, "param")
                out.append(item)
            return CapturedIter(out)
        if type(v) is CapturedIter:
            return v
        if type(v) is LazyIter:
            return CapturedIter([], source=v)
        it = getattr(type(v), "__iter__", None)
        if isinstance(it, types.FunctionType):
            return self.get_iter(self.call(it, [v], {}))
        if isinstance(v, (types.GeneratorType,)):
            raise Unsupported("generator", "iterating a generator created outside the graph")
        if hasattr(v, "__next__"):
            check_own_iterator(self.tracer, v, "iterating")
            return CapturedIter([], source=v)   # built in this capture: stays lazy
        if isinstance(v, (list, tuple, dict, range, str, set, frozenset, type({}.items()),
                          type({}.keys()), type({}.values()), torch.Size)):
            items = []
            for item in iter(v):
                items.append(item)
                if len(items) > 100_000:
                    raise Unsupported("huge or endless iterator",
                                      "iterating a huge or endless iterable")
            return CapturedIter(items)
        return iter(v)

    def zero_arg_super(self):
        cls_cell = self.cells.get("__class__")
        if cls_cell is None or not self.code.co_varnames:
            raise Unsupported("unsupported construct", "super() without __class__ cell")
        first = self.code.co_varnames[0]
        obj = self.locals.get(first, NULL)
        if obj is NULL and first in self.cells:
            obj = self.cells[first].cell_contents
        return SuperProxy(cls_cell.cell_contents, obj)

    def binary_op(self, name: str, a, b):
        inplace = name.startswith("NB_INPLACE_")
        key = name[len("NB_INPLACE_"):] if inplace else name[len("NB_"):]
        fn = (_INPLACE if inplace else _BINARY)[key]
        if scalars.is_scalar(a) or scalars.is_scalar(b):
            return scalars.operator_call(self.tracer, fn, (a, b))
        if numpy_values.is_array(a) or numpy_values.is_array(b):
            inplace = inplace and numpy_values.is_array(a)
            return numpy_values.operator_call(self.tracer, fn if inplace else _BINARY[key], (a, b),
                                              inplace=inplace)
        if isinstance(a, TensorVar) or isinstance(b, TensorVar):
            if not inplace or not isinstance(a, TensorVar):
                fn = _BINARY[key] if not isinstance(a, TensorVar) else fn
            return self.tracer.builder.call("call_function", fn, (a, b), {})
        if inplace and id(a) in self.tracer.external_copies:
            if not isinstance(a, (list, set, dict)):
                raise Unsupported("mutation of outside state",
                                  f"{name} on a caller's {type(a).__name__}")
            self.tracer.side_effects.mutated_copy(a)   # `out += [...]`: written back after the call
        result = operators.binary(self, key, inplace, a, b)
        if result is not operators.NATIVE:
            return result
        if contains_tensor(a) or contains_tensor(b):
            if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
                return fn(a, b)
            if key == "MULTIPLY" and _is_repetition(a, b):   # [x] * 4: references, repeated
                return fn(a, b)
            raise Unsupported("unsupported construct", f"{key} on containers of tensors")
        return fn(a, b)

    def store_attr(self, obj, name, value):
        tracer = self.tracer
        if isinstance(obj, TensorVar):
            # ``x.flag = v``, ``y.grad = g``: written on the tensor after the graph ran (a
            # graph output or the input itself), read back from the record until then.
            check_tensor_attr_write(tracer, obj, name, value)
            tracer.side_effects.store_attr(obj, name, value)
            return
        setter = python_descriptor_setter(obj, name)
        if setter is not None:   # a property / __set__ descriptor: its code runs, traced
            self.call(setter, [obj, value], {})
            return
        if tracer.is_internal(obj):
            setter = getattr(type(obj), "__setattr__", object.__setattr__)
            if isinstance(setter, types.FunctionType):
                self.call(setter, [obj, name, value], {})
            else:
                setattr(obj, name, value)
            return
        check_outside_attr_write(obj, name, value, "setting")
        # An attribute write on an outside object (a module counter, a cache's tensor):
        # later reads in this capture see the new value, and the entry applies it after the
        # graph (side_effects.py), so the object ends up as eager leaves it.
        tracer.side_effects.store_attr(obj, name, value)

    # -- opcodes: loads and stores ---------------------------------------------------------
    def NOP(self, ins):
        return None

    def LOAD_CONST(self, ins):
        self.push(ins.argval)

    def LOAD_FAST(self, ins):
        v = self.locals.get(ins.argval, NULL)
        if v is NULL:
            raise UnboundLocalError(f"local variable '{ins.argval}' referenced before assignment")
        self.push(v)

    def LOAD_FAST_AND_CLEAR(self, ins):  # 3.12+: inlined comprehensions save/restore a local
        self.push(self.locals.pop(ins.argval, NULL))

    def STORE_FAST(self, ins):
        v = self.pop()
        if v is NULL:
            self.locals.pop(ins.argval, None)
        else:
            self.locals[ins.argval] = v

    def DELETE_FAST(self, ins):
        del self.locals[ins.argval]

    def LOAD_GLOBAL(self, ins):
        value = self._global_value(ins.argval)
        if ins.push_null:
            self.push_callable(value)
        else:
            self.push(value)

    def _global_value(self, name: str):
        g = self.f_globals
        written = self.tracer.side_effects.pending_global(g, name) if self.tracer.side_effects \
            else MISSING
        if written is not MISSING and written is not DELETED:
            return written   # assigned earlier in this capture
        if name in g and written is not DELETED:
            tracer = self.tracer
            expr = f"{tracer.expr_of(g)}[{name!r}]"
            tracer.guards.name(expr, name)                  # guards say the global's name
            value = tracer.external(g[name], expr, user=False)
        else:
            b = g.get("__builtins__", __builtins__)
            b = b if isinstance(b, dict) else b.__dict__
            if name not in b:
                raise NameError(f"name '{name}' is not defined")
            value = b[name]
            tracer = self.tracer
            if not tracer.is_library_globals(g) and written is not DELETED:
                # a global defined later shadows it
                tracer.guards.add("global", f"{name!r} not in {tracer.expr_of(g)}",
                                  f"global {name} is not defined (the builtin is used)")
        return value

    def STORE_GLOBAL(self, ins):
        self.tracer.side_effects.store_global(self.f_globals, ins.argval, self.pop())

    def DELETE_GLOBAL(self, ins):
        name, g = ins.argval, self.f_globals
        written = self.tracer.side_effects.pending_global(g, name)
        if written is DELETED or written is MISSING and name not in g:
            self.tracer.guards.add("global", f"{name!r} not in {self.tracer.expr_of(g)}",
                                   f"global {name} is not defined")
            raise NameError(f"name '{name}' is not defined")
        if written is MISSING:
            self._global_value(name)   # guards that it exists
        self.tracer.side_effects.store_global(g, name, DELETED)

    def LOAD_DEREF(self, ins):
        cell = self.cells[ins.argval]
        written = self.tracer.side_effects.pending_cell(cell) if self.tracer.side_effects \
            else MISSING
        if written is DELETED:
            raise NameError(f"free variable '{ins.argval}' referenced before assignment")
        if written is not MISSING:
            self.push(written)   # assigned earlier in this capture (`nonlocal n; n += 1`)
            return
        try:
            value = cell.cell_contents
        except ValueError:
            raise NameError(f"free variable '{ins.argval}' referenced before assignment") from None
        copied = self.tracer.external_copies.get(id(cell))
        if copied is not None and copied[0] is cell:   # a cell of a caller's function
            value = self.tracer.external(value, f"{copied[1]}.cell_contents")
        elif not self.tracer.is_internal(cell) and ins.argval != "__class__":
            expr = f"{self.tracer.expr_of(cell)}.cell_contents"
            self.tracer.guards.name(expr, ins.argval)      # guards say the variable's name
            value = self.tracer.external(value, expr, user=False)
        self.push(value)

    def STORE_DEREF(self, ins):
        cell = self.cells[ins.argval]
        if not self.tracer.is_internal(cell):
            self.tracer.side_effects.store_cell(cell, self.pop())   # replayed after the graph
            return
        cell.cell_contents = self.pop()

    def DELETE_DEREF(self, ins):
        cell = self.cells[ins.argval]
        if not self.tracer.is_internal(cell):
            self.tracer.side_effects.store_cell(cell, DELETED)
            return
        del cell.cell_contents

    def LOAD_CLOSURE(self, ins):
        self.push(self.cells[ins.argval])

    def LOAD_ATTR(self, ins):
        obj = self.pop()
        if isinstance(obj, SuperProxy):
            value = self._super_attr(obj, ins.argval)
        else:
            value = self.tracer.load_attr(obj, ins.argval, self)
        if ins.method:
            self.push_callable(value)
        else:
            self.push(value)

    def LOAD_SUPER_ATTR(self, ins):  # 3.12+: super().name without building a super object
        obj = self.pop()
        cls = self.pop()
        self.pop()  # the global `super`
        value = self._super_attr(SuperProxy(cls, obj), ins.argval)
        if ins.method:
            self.push_callable(value)
        else:
            self.push(value)

    def _super_attr(self, sp: SuperProxy, name: str):
        obj = sp.obj
        mro = type(obj).__mro__ if not isinstance(obj, type) else obj.__mro__
        start = mro.index(sp.cls) + 1 if sp.cls in mro else 0
        for klass in mro[start:]:
            if name in klass.__dict__:
                attr = klass.__dict__[name]
                if isinstance(attr, types.FunctionType):
                    return types.MethodType(attr, obj)
                if isinstance(attr, property):
                    return self.call(attr.fget, [obj], {})
                if isinstance(attr, classmethod):
                    return types.MethodType(attr.__func__, type(obj))
                if isinstance(attr, staticmethod):
                    return attr.__func__
                if hasattr(attr, "__get__"):
                    return attr.__get__(obj, type(obj))
                return attr
        raise AttributeError(f"'super' object has no attribute '{name}'")

    def STORE_ATTR(self, ins):
        obj = self.pop()
        value = self.pop()
        self.store_attr(obj, ins.argval, value)

    def DELETE_ATTR(self, ins):
        self.delete_attr(self.pop(), ins.argval)

    def delete_attr(self, obj, name: str):
        if self.tracer.is_internal(obj):
            delattr(obj, name)
            return
        check_outside_attr_write(obj, name, DELETED, "deleting")
        tracer = self.tracer
        tracer.load_attr(obj, name, self)   # AttributeError as eager, if it is not there
        own = tracer.side_effects.instance_dict(obj)
        if tracer.side_effects.pending_attr(obj, name) is MISSING and not (own and name in own):
            self._guard_instance_attribute(obj, name)
        tracer.side_effects.store_attr(obj, name, DELETED)

    def _guard_instance_attribute(self, obj, name: str):
        """``del obj.name`` deletes an instance attribute (one of a class raises): guard
        that ``name`` is one, where the deletion finds it."""
        g = self.tracer.guards
        tables = ("_parameters", "_buffers", "_modules") if isinstance(obj, torch.nn.Module) else ()
        for table in ("__dict__",) + tables:
            entries = obj.__dict__ if table == "__dict__" else obj.__dict__.get(table, {})
            if name in entries:
                g.add("constant", f"{name!r} in {g.const(entries, 'ID')}",
                      f"{type(obj).__name__}.{name} is an instance attribute")
                return
        raise Unsupported("mutation of outside state", f"deleting {name!r}, which is not an "
                          f"instance attribute of the {type(obj).__name__}")

    # -- calls -------------------------------------------------------------------------------
    def CALL(self, ins):
        args = self.popn(ins.arg)
        fn, args = self._callable_and_args(args)
        kwargs = {}
        if self.kw_names:
            n = len(self.kw_names)
            kwargs = dict(zip(self.kw_names, args[len(args) - n:]))
            args = args[:len(args) - n]
            self.kw_names = None
        self.push(self.call(fn, args, kwargs))

    def CALL_KW(self, ins):  # 3.13
        self.kw_names = self.pop()
        return self.CALL(ins)

    def _callable_and_args(self, args):
        a, b = self.popn(2)
        if NULL_BEFORE_CALLABLE:     # [NULL|method, callable|self, *args]
            if a is NULL:
                return b, args
            return a, [b, *args]
        if b is NULL:                 # 3.13: [callable, NULL|self, *args]
            return a, args
        return a, [b, *args]

    def CALL_FUNCTION_EX(self, ins):
        kwargs = self.pop() if ins.arg & 1 else {}
        args = self.pop()
        a, b = self.popn(2)
        if NULL_BEFORE_CALLABLE:
            fn = b if a is NULL else a
        else:
            fn = a
        if not isinstance(args, (list, tuple)):
            args = list(self.get_iter(args))
        self.push(self.call(fn, list(args), dict(self._as_mapping(kwargs))))

    def MAKE_FUNCTION(self, ins):
        code = self.pop()
        flags = ins.arg or 0
        closure = self.pop() if flags & 0x08 else None
        annotations = self.pop() if flags & 0x04 else None
        kwdefaults = self.pop() if flags & 0x02 else None
        defaults = self.pop() if flags & 0x01 else None
        fn = types.FunctionType(code, self.f_globals, code.co_name, defaults, closure)
        if kwdefaults:
            fn.__kwdefaults__ = kwdefaults
        if annotations is not None and isinstance(annotations, dict):
            fn.__annotations__ = annotations
        fn.__qualname__ = code.co_qualname
        self.push(self.tracer.mark_internal(fn))

    def SET_FUNCTION_ATTRIBUTE(self, ins):  # 3.13
        fn = self.pop()
        value = self.pop()
        if ins.arg == 0x08:
            fn = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, value)
            fn.__qualname__ = fn.__code__.co_qualname
            self.tracer.mark_internal(fn)
        elif ins.arg == 0x01:
            fn.__defaults__ = value
        elif ins.arg == 0x02:
            fn.__kwdefaults__ = value
        elif ins.arg == 0x04:
            fn.__annotations__ = value if isinstance(value, dict) else {}
        self.push(fn)

    def RETURN_VALUE(self, ins):
        self.result = self.pop()
        self.done = True

    def RETURN_GENERATOR(self, ins):
        self.push(None)

    def YIELD_VALUE(self, ins):
        self.suspended_value = self.pop()
        raise _Suspend   # GeneratorRun.send resumes after it, with the value sent pushed

    def GET_YIELD_FROM_ITER(self, ins):
        self.push(self.get_iter(self.pop()))

    def SEND(self, ins):
        # `yield from it` inside a generator being run to completion: pull the next item.
        self.pop()  # the value sent in (always None here)
        try:
            self.push(next(self.stack[-1]))
        except StopIteration as stop:
            if PY < (3, 12):
                self.pop()          # 3.11 pops the receiver too
            self.push(stop.value)   # 3.12+: END_SEND removes the receiver afterwards
            return ins.jump_index

    def END_SEND(self, ins):  # 3.12+
        value = self.pop()
        self.pop()
        self.push(value)

    def IMPORT_NAME(self, ins):
        fromlist = self.pop()
        level = self.pop()
        self.push(__import__(ins.argval, self.f_globals, None, fromlist, level))

    def IMPORT_FROM(self, ins):
        self.push(getattr(self.stack[-1], ins.argval))

    # -- control flow ------------------------------------------------------------------------
    def JUMP_FORWARD(self, ins):
        return ins.jump_index

    def JUMP_BACKWARD(self, ins):
        if self.tracer.instructions_run > _MAX_INSTRUCTIONS:
            raise Unsupported("instruction limit", "too many instructions (endless loop?)")
        return ins.jump_index

    JUMP = JUMP_FORWARD
    JUMP_NO_INTERRUPT = JUMP_BACKWARD

    def POP_JUMP_IF_TRUE(self, ins):
        if self.truth(self.pop()):
            return ins.jump_index

    def POP_JUMP_IF_FALSE(self, ins):
        if not self.truth(self.pop()):
            return ins.jump_index

    def POP_JUMP_IF_NONE(self, ins):
        if self.pop() is None:
            return ins.jump_index

    def POP_JUMP_IF_NOT_NONE(self, ins):
        if self.pop() is not None:
            return ins.jump_index

    def JUMP_IF_TRUE_OR_POP(self, ins):  # 3.11
        if self.truth(self.stack[-1]):
            return ins.jump_index
        self.pop()

    def JUMP_IF_FALSE_OR_POP(self, ins):  # 3.11
        if not self.truth(self.stack[-1]):
            return ins.jump_index
        self.pop()

    def GET_ITER(self, ins):
        self.push(self.get_iter(self.pop()))

    def FOR_ITER(self, ins):
        it = self.stack[-1]
        # GET_ITER made the iterators of this frame's loops; a comprehension's code (3.11)
        # loops over its argument ``.0`` instead, which may come from outside the capture.
        check_own_iterator(self.tracer, it, "iterating")
        try:
            value = next(it)
        except StopIteration:
            if PY < (3, 12):
                self.pop()          # 3.11 pops the iterator and jumps past the loop
            else:
                self.push(NULL)     # 3.12+: jump to END_FOR, which pops (3.13: + POP_TOP)
            return ins.jump_index
        self.push(value)

    def END_FOR(self, ins):
        self.pop()
        if PY < (3, 13):
            self.pop()  # 3.12's END_FOR pops the value and the iterator

    # -- with blocks and exceptions ----------------------------------------------------------
    def BEFORE_WITH(self, ins):
        ctx = self.pop()
        if isinstance(ctx, CapturedContext):
            exit_fn, value = ctx.enter(self.tracer)
            self.push(exit_fn)
            self.push(value)
            return
        if type(ctx) is GeneratorContext:
            from . import stdlib
            exit_fn, value = stdlib.enter_generator_context(self, ctx)
            self.push(exit_fn)
            self.push(value)
            return
        import contextlib
        if isinstance(ctx, contextlib._GeneratorContextManager):
            raise Unsupported("context manager",
                              "entering a @contextmanager object made "
                              "outside the compiled call (its generator is outside state)")
        enter = getattr(type(ctx), "__enter__", None)
        exit_ = getattr(type(ctx), "__exit__", None)
        if not (isinstance(enter, types.FunctionType) and isinstance(exit_, types.FunctionType)):
            raise Unsupported("context manager", f"with {type(ctx).__name__}(): a context "
                                                 "manager tempa cannot see into")
        self.push(types.MethodType(exit_, ctx))
        self.push(self.call(enter, [ctx], {}))

    def WITH_EXCEPT_START(self, ins):
        exc = self.stack[-1]
        exit_fn = self.stack[-4] if PY < (3, 13) else self.stack[-5 if False else -4]
        if type(exit_fn) is GradModeExit:
            exit_fn.restore(self.tracer)
            self.push(False)
            return
        self.push(self.call(exit_fn, [type(exc), exc, exc.__traceback__], {}))

    def PUSH_EXC_INFO(self, ins):
        exc = self.pop()
        self.push(self.exc_stack[-1] if self.exc_stack else None)
        self.exc_stack.append(exc)
        self.push(exc)

    def POP_EXCEPT(self, ins):
        self.pop()
        if self.exc_stack:
            self.exc_stack.pop()

    def CHECK_EXC_MATCH(self, ins):
        cls = self.pop()
        self.push(isinstance(self.stack[-1], cls))

    # The interpreted code's own exceptions travel as _PyException, so that one that is not
    # an Exception (GeneratorExit, KeyboardInterrupt raised by the code) still reaches the
    # code's handlers (`except BaseException:`), while a real Ctrl-C during capture does not.
    def RERAISE(self, ins):
        raise _PyException(self.pop())

    def RAISE_VARARGS(self, ins):
        if ins.arg == 0:
            if not self.exc_stack:
                raise RuntimeError("No active exception to reraise")
            raise _PyException(self.exc_stack[-1])
        cause = self.pop() if ins.arg == 2 else None
        exc = self.pop()
        if isinstance(exc, type):
            exc = exc()
        if not isinstance(exc, BaseException):
            raise TypeError("exceptions must derive from BaseException")
        if cause is not None:
            exc.__cause__ = cause if not isinstance(cause, type) else cause()
        raise _PyException(exc)

    def LOAD_ASSERTION_ERROR(self, ins):
        self.push(AssertionError)
