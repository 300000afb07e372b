"""Opcode handlers for control flow: jumps, conditional jumps, loops (``GET_ITER``,
``FOR_ITER``), ``with`` blocks, and raising and handling exceptions. Mixed into
``interpreter.Frame``, whose services (``push``, ``pop``, ``truth``, ``get_iter``,
``call``) they use; a condition on a tensor's value is a graph break (``Frame.truth``)."""
from __future__ import annotations

import types
import warnings

from .breaks import Unsupported
from .context import CapturedContext, catch_warnings_block
from .frame_exits import _MAX_INSTRUCTIONS, _PyException
from .instructions import PY
from .values import NULL, GradModeExit, GeneratorContext, check_own_iterator


class ControlOpcodes:
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
        if type(ctx) is warnings.catch_warnings and self.tracer.is_internal(ctx):
            discarded = self.instrs[ins.index + 1].opname == "POP_TOP"
            ctx = catch_warnings_block(self.tracer, ctx, value_used=not discarded)
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
