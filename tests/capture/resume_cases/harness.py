"""Differential harness: resume a corpus function at an offset and compare with a full run.

``resumed_run(case, offset)`` executes the original function under ``sys.settrace`` with
opcode events; the first time the frame is about to execute ``offset`` it snapshots the
frame's locals, builds the resume function for that offset, calls it right there (with
the live locals, the frame's real cells, and the tracked iterators / bound ``__exit__``
methods that sit on the stack), records its result and ``LOG``, and aborts the original.
``reference_run(case)`` is a plain call. Both return (outcome, LOG, repr(args)).
"""

import sys
import types

from tempa.capture import liveness as L
from tempa.capture import resume as R

from . import corpus as C

SUPPORTED_SLOTS = ("iter", "with_exit", "exc_info")


class _Abort(BaseException):
    pass


def _outcome_of_exception(e):
    tb = e.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return ("raise", type(e).__name__, str(e), tb.tb_frame.f_code.co_filename, tb.tb_lineno)


def reference_run(case):
    fn, factory = C.CASES[case]
    C.reset()
    args, kw = factory()
    try:
        out = ("ok", repr(fn(*args, **kw)))
    except Exception as e:
        out = _outcome_of_exception(e)
    return out, list(C.LOG), repr((args, kw))


def resume_points(code):
    """(offset, depth) of every line start whose stack holds only for-iterators and
    with-exits (the slots the harness can reconstruct)."""
    out = []
    for off, depth in L.statement_starts_with_depth(code):
        if all(k in SUPPORTED_SLOTS for k in L.stack_kinds_at(code, off)):
            out.append((off, depth))
    return out


def skipped_points(code):
    return [
        (off, L.stack_kinds_at(code, off))
        for off, d in L.statement_starts_with_depth(code)
        if not all(k in SUPPORTED_SLOTS for k in L.stack_kinds_at(code, off))
    ]


def _offset_group(code, offset):
    """Offsets at which the frame counts as being 'at' offset (EXTENDED_ARG prefixes)."""
    group = {offset}
    ins = L.instruction_at(code, offset)
    group.add(ins.offset)
    return group


def _real_cells(code, f_locals):
    """The frame's own cell objects, found through closures stored in its locals."""
    found = {}
    for v in f_locals.values():
        if isinstance(v, types.FunctionType) and v.__closure__:
            for name, cell in zip(v.__code__.co_freevars, v.__closure__):
                if name in code.co_cellvars:
                    found.setdefault(name, cell)
    return found


def build_resume_call(fn, code, offset, f_locals):
    """(resume function, positional args) reproducing the frame state at ``offset``."""
    live = L.live_locals_at(code, offset)
    names = tuple(n for n in code.co_varnames if n in live and n in f_locals)
    cells = _real_cells(code, f_locals)
    cellvals = {}
    for name in code.co_cellvars:
        if name in cells:
            cellvals[name] = cells[name]
        elif name in f_locals:
            cellvals[name] = types.CellType(f_locals[name])
    stack = []
    for kind, prod in zip(L.stack_kinds_at(code, offset), L.stack_producers_at(code, offset)):
        line = L.instruction_at(code, prod).positions.lineno
        if kind == "iter":
            stack.append(C.REG[("iter", code.co_name, line)])
        elif kind == "with_exit":
            stack.append(C.REG[("with", code.co_name, line)].__exit__)
        elif kind == "exc_info":
            # Inside an ``except`` body: the exception that was being handled before this
            # handler was entered (none, in the corpus). NOTE: the resume function is not
            # "handling" the exception itself, so a bare ``raise`` there would fail.
            stack.append(None)
        else:
            raise AssertionError(kind)
    rc = R.make_resume_code(code, offset, stack_size=len(stack), live_locals=names)
    rfn = rc.make_function(fn.__globals__, rc.closure_for(fn.__closure__, cellvals))
    return rfn, (*stack, *(f_locals[n] for n in names))


def resumed_run(case, offset):
    fn, factory = C.CASES[case]
    code = fn.__code__
    C.reset()
    args, kw = factory()
    group = _offset_group(code, offset)
    result = {}

    def local(frame, event, arg):
        if event in ("opcode", "line") and not result and frame.f_lasti in group:
            f_locals = dict(frame.f_locals)
            rfn, rargs = build_resume_call(fn, code, offset, f_locals)
            try:
                out = ("ok", repr(rfn(*rargs)))
            except Exception as e:
                out = _outcome_of_exception(e)
            result["out"] = (out, list(C.LOG), repr((args, kw)))
            raise _Abort
        return local

    def tracer(frame, event, arg):
        if frame.f_code is code and not result:
            # 3.13 turns opcode events on for a frame only if f_trace is already set.
            frame.f_trace = local
            frame.f_trace_opcodes = True
            return local
        return None

    old = sys.gettrace()
    # 3.12 enables opcode events in sys.settrace() only once some frame has asked for
    # them: ask on this frame (which has no f_trace, so it gets none).
    me = sys._getframe()
    me.f_trace_opcodes = True
    sys.settrace(tracer)
    me.f_trace_opcodes = False
    try:
        fn(*args, **kw)
    except _Abort:
        pass
    except Exception:
        pass
    finally:
        sys.settrace(old)
    if not result:
        return None  # offset never executed with these inputs
    return result["out"]
