"""Opcode handlers for names: loads, stores and deletes of locals, globals, cells and
attributes (``super().name`` included). Mixed into ``interpreter.Frame``, whose services
(``push``, ``pop``, ``push_callable``, ``call``, ``store_attr``) they use. A global, a cell
or an attribute read from outside the call is read through the tracer (``external``,
``load_attr``), which records its source and guard; a write to one is a side effect
(``side_effects.py``), replayed after the graph."""
from __future__ import annotations

import types

import torch

from .breaks import Unsupported
from .side_effects import DELETED, MISSING, check_outside_attr_write
from .values import NULL, SuperProxy


class LoadStoreOpcodes:
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
        tracer = self.tracer
        g = tracer.guards
        tables = ("_parameters", "_buffers", "_modules") if isinstance(obj, torch.nn.Module) else ()
        for table in ("__dict__",) + tables:
            entries = obj.__dict__ if table == "__dict__" else obj.__dict__.get(table, {})
            if name in entries:
                # an object reached by a source (an argument: a new one each call) is
                # guarded in its own __dict__, not in the first call's (which the replayed
                # deletion empties: every later call would miss)
                sourced = id(obj) in tracer.sourced or id(obj) in tracer.external_copies
                where = f"{tracer.expr_of(obj)}.__dict__" if sourced and table == "__dict__" \
                    else g.const(entries, 'ID')
                g.add("constant", f"{name!r} in {where}",
                      f"{type(obj).__name__}.{name} is an instance attribute")
                return
        raise Unsupported("mutation of outside state", f"deleting {name!r}, which is not an "
                          f"instance attribute of the {type(obj).__name__}")
