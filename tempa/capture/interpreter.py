"""The symbolic stack machine: runs one code object's bytecode over symbolic values.

One ``Frame`` per activation (the captured function and every function inlined into it).
Handlers are methods named after the normalised opcode (``instructions.py``); each returns
the index of the next instruction, or None to fall through. Where a handler's behaviour
depends on the CPython version it says so next to the code, with the version constant from
``instructions``; the dis documentation (docs.python.org/3/library/dis.html) is the spec.

This file holds the ``Frame`` core: its state, the run loop, how an exception finds its
handler, the stack helpers and the services opcode handlers, ``calls.py`` and
``tracer.py`` use (``call``, ``truth``, ``get_iter``, ``binary_op``, ``store_attr``).
The handlers are mixins, one file per group: ``opcodes_load_store.py`` (locals, globals,
cells, attributes), ``opcodes_calls.py`` (calls, making functions, returns, yields,
imports), ``opcodes_control.py`` (jumps, loops, with blocks, exceptions) and
``opcodes_data.py`` (stack shuffling, containers, operators). How a run is left other than
by returning is in ``frame_exits.py``; a generator run step by step in ``generator_run.py``.
"""
from __future__ import annotations

import operator
import types

import torch

from . import operators
from .breaks import InternalError, Unsupported, UserError
from .graph import is_data_dependent_guard
from .instructions import NULL_BEFORE_CALLABLE, decode
from . import numpy_values, scalars
from .frame_exits import _MAX_INSTRUCTIONS, _PyException, _Suspend, raised_by_tempa
from .opcodes_calls import CallOpcodes
from .opcodes_control import ControlOpcodes
from .opcodes_data import DataOpcodes
from .opcodes_load_store import LoadStoreOpcodes
from .side_effects import check_outside_attr_write, check_tensor_attr_write
from .values import NULL, TensorVar, SuperProxy, GradModeExit, CapturedIter, LazyIter, \
    GeneratorContextExit, check_own_iterator, contains_tensor, python_descriptor_setter, \
    python_setattr

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


def _is_repetition(a, b) -> bool:
    """``seq * n`` / ``n * seq`` of a list or tuple and an int."""
    return isinstance(a, (list, tuple)) and type(b) in (int, bool) or \
        isinstance(b, (list, tuple)) and type(a) in (int, bool)


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


class Frame(LoadStoreOpcodes, CallOpcodes, ControlOpcodes, DataOpcodes):
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
            except InternalError:
                raise
            except UserError as e:
                nxt = self._raise(self._program_exception(e.exc, handler, ins), ins)
            except _PyException as e:
                nxt = self._raise(e.exc, ins)
            except Exception as e:  # an exception of the interpreted code (AttributeError...)
                nxt = self._raise(self._program_exception(e, handler, ins), ins)
            i = ins.index + 1 if nxt is None else nxt
        if tracer.instructions_run > _MAX_INSTRUCTIONS:
            raise Unsupported("instruction limit", "too many instructions (endless loop?)")
        return self.result

    def _program_exception(self, exc: BaseException, handler, ins) -> BaseException:
        """``exc``, which a handler raised, as the interpreted code's own exception; an
        InternalError where tempa's code raised it by mistake (``raised_by_tempa``), so
        that the code's ``except`` never takes another path on a bug of tempa's."""
        if isinstance(exc, InternalError):   # wrapped as UserError on its way out of a model
            raise exc
        if raised_by_tempa(exc, getattr(getattr(handler, "__func__", None), "__code__", None)):
            raise InternalError(exc, f"{self.code.co_filename}:{ins.lineno} in {self.name}") \
                from exc
        return exc

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
        if isinstance(v, torch.Tensor):
            # A real tensor with no TensorVar (an item a C method of the caller's object
            # returned, `dict(out.items())["a"]`): an input read live on every call, so
            # that what the code computes from it is in the graph, not evaluated now.
            v = self.tracer.builder.attr_input(v, "a tensor read by C code")
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
            raise Unsupported("interpreter invariant", "the truth of NULL (a stack slot of a call)")
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
            raise Unsupported("zero-argument super", "super() in a function without a __class__ "
                              "cell or without arguments")
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
        if inplace and self.tracer.is_outside_container(a):
            raise Unsupported("mutation of outside state", f"{name} on the caller's "
                              f"{type(a).__name__}")
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
            raise Unsupported("operator on a container of tensors", f"{key} on containers of tensors")
        return fn(a, b)

    def store_attr(self, obj, name, value):
        tracer = self.tracer
        if isinstance(obj, TensorVar):
            # ``x.flag = v``, ``y.grad = g``: written on the tensor after the graph ran (a
            # graph output or the input itself), read back from the record until then.
            check_tensor_attr_write(tracer, obj, name, value)
            tracer.side_effects.store_attr(obj, name, value)
            return
        hook = python_setattr(obj)
        if hook is not None and (tracer.is_internal(obj) or not isinstance(obj, torch.nn.Module)):
            # A Python __setattr__ (a config's key aliasing) runs traced; the
            # ``object.__setattr__`` it ends in comes back to ``object_store_attr``. An outside
            # module's (Module.__setattr__ itself) is modelled as the plain store below.
            self.call(hook, [obj, name, value], {})
            return
        self.object_store_attr(obj, name, value, generic=False)

    def object_store_attr(self, obj, name, value, *, generic: bool = True):
        """``object.__setattr__(obj, name, value)`` (``generic``; what a Python
        ``__setattr__`` ends in), or the store of a class without one: a data descriptor's
        code, else a plain store."""
        tracer = self.tracer
        setter = python_descriptor_setter(obj, name)
        if setter is not None:   # a property / __set__ descriptor: its code runs, traced
            self.call(setter, [obj, value], {})
            return
        if tracer.is_internal(obj):
            (object.__setattr__ if generic else setattr)(obj, name, value)
            return
        check_outside_attr_write(obj, name, value, "setting", generic=generic)
        # An attribute write on an outside object (a module counter, a cache's tensor):
        # later reads in this capture see the new value, and the entry applies it after the
        # graph (side_effects.py), so the object ends up as eager leaves it.
        tracer.side_effects.store_attr(obj, name, value)
