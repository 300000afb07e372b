"""Opcode handlers for calls: calling (``CALL``, ``CALL_KW``, ``CALL_FUNCTION_EX``),
making functions, returning, yielding and ``yield from``, and imports. Mixed into
``interpreter.Frame``, whose services (``push``, ``pop``, ``popn``, ``call``, ``get_iter``)
they use; a call goes to ``Frame.call``, then ``calls.py``."""
from __future__ import annotations

import types

from .frame_exits import _Suspend
from .instructions import PY, NULL_BEFORE_CALLABLE
from .values import NULL


class CallOpcodes:
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
