"""What an entry does after its graph when capture broke: the graph-break runner.

Capture stopped right before the root frame's breaking instruction (a second pass of the
interpreter, so no half-executed instruction needs undoing). The entry then:
1. calls the graph captured so far,
2. rebuilds the frame's value stack and live locals from the graph's outputs,
3. runs the breaking instruction in plain Python, and
4. continues in a resume function built from the original bytecode (``resume.py``).

Four shapes, by instruction:
- ``call``: a call capture could not see into (print, numpy, a callee that itself breaks).
  The entry makes the call (Python callees through tempa, so they get graphs of their own)
  and resumes after it with the result on the stack.
- ``jump``: a branch on a tensor's value. The entry tests the real tensor and resumes at the
  branch that was taken.
- ``store``: ``container[key] = value`` that capture could not record (``os.environ[k] =
  v``, an outside object's ``__setitem__``). The entry does the store and resumes after it.
- ``rest``: anything else, a break inside ``try``, or a call of a builtin that reads the
  frame it is called from (``locals()``, ``eval``, ``exec``, ``vars``, ``dir``,
  ``globals()``): the resume function starts AT the breaking instruction and runs the rest
  of the frame eagerly, inside the original exception table, with its own locals.
Resume functions of ``call``/``jump``/``store`` are compiled in turn on their first call, unless the
break sits in a loop (each iteration would hand them a different iterator to guard on) or
the frame has cell variables (closures need fresh cells per call); those run eagerly.
"""
from __future__ import annotations

import builtins
import dis
from dataclasses import dataclass

from . import liveness
from . import runtime as runtime_mod
from .breaks import Unsupported
from .instructions import NULL_BEFORE_CALLABLE
from .output import OutputPlan
from .resume import make_resume_code, ResumeUnsupported
from .scalars import is_scalar
from .values import NULL, GradModeExit, TensorVar

_CALLS = {"CALL", "CALL_KW", "CALL_FUNCTION_EX"}
_JUMPS = {"POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE", "JUMP_IF_TRUE_OR_POP", "JUMP_IF_FALSE_OR_POP"}
# Builtins that read the frame they are called from (its locals, its globals).
_FRAME_READER_NAMES = ("locals", "globals", "vars", "dir", "eval", "exec")
_FRAME_READERS = tuple(getattr(builtins, name) for name in _FRAME_READER_NAMES)


_SLICE_OPCODES = {dis.opmap[name] for name in ("BINARY_SLICE", "STORE_SLICE") if name in dis.opmap}


def _real_stack(code, ins, stack: list) -> list:
    """The stack as CPython holds it at ``ins``: 3.12's BINARY_SLICE / STORE_SLICE are
    decoded as BUILD_SLICE 2 + a subscript (instructions.py), so a break at that subscript
    holds one slice object where CPython's instruction, which the resume function starts
    at, expects its start and stop."""
    if ins.opname in ("BINARY_SUBSCR", "STORE_SUBSCR") and \
            code.co_code[ins.offset] in _SLICE_OPCODES and type(stack[-1]) is slice:
        return stack[:-1] + [stack[-1].start, stack[-1].stop]
    return stack


@dataclass
class BreakPlan:
    mode: str                 # "call" | "jump" | "store" | "rest"
    lines: list[str]          # statements after the graph call, ending in `return ...`
    resume_compiled: bool


def plan_break(fn, frame, plan: OutputPlan, runtime, *, data_dependent: bool = False) -> BreakPlan:
    """``data_dependent``: the break is on a value computed from tensor data (``int(t)``,
    a branch on ``v > 0``): the breaking call's result is such a value too."""
    code = fn.__code__
    ins = frame.stopped_at
    stack = _real_stack(code, ins, list(frame.stack))
    if frame.exc_stack or any(k in ("exc", "exc_info", "lasti")
                              for k in liveness.stack_kinds_at(code, ins.offset)):
        # Inside an `except` body a resume function could not re-raise the active
        # exception (a bare `raise`, sys.exc_info()): run the whole frame eagerly instead.
        raise Unsupported("try block", "a graph break inside an except/finally body")
    mode = _mode(code, frame, ins, stack)
    compiled = mode != "rest" and not code.co_cellvars and not liveness.in_loop(code, ins.offset)
    guards = plan.guards
    # Code that may call locals()/eval(...) after the break gets every bound local (the
    # liveness analysis cannot see which ones it reads once the builtin is loaded).
    reads_frame = any(name in code.co_names for name in _FRAME_READER_NAMES)
    lines: list[str] = []
    counter = [0]

    def temp(value) -> str:
        name = f"___t{counter[0]}"
        counter[0] += 1
        lines.append(f"{name} = {plan.expr(value)}")
        return name

    def resume_call(offset: int, stack_values: list, indent: str = "", data=()) -> str:
        # Every value handed over is bound to a temporary before the `return`: in "jump"
        # mode both branches then refer to the same rebuilt objects (output.py).
        # ``data``: the positions in stack_values of numbers computed from tensor data.
        real, nulls, data_args = [], [], set()
        for i, v in enumerate(stack_values):
            if i in data:
                data_args.add(f"___stack{len(real)}")
            (nulls.append(i) if v is NULL else real.append(v))
        live_now = set(code.co_varnames) if reads_frame else liveness.live_locals_at(code, offset)
        live = [name for name in code.co_varnames if name in live_now and
                frame.locals.get(name, NULL) is not NULL]
        try:
            rc = make_resume_code(code, offset, stack_size=len(real), null_positions=nulls,
                                  live_locals=live)
        except (ResumeUnsupported, ValueError) as e:
            raise Unsupported("cannot resume", f"cannot resume {fn.__qualname__} at "
                                               f"offset {offset}: {e}") from None
        qualname = f"{fn.__qualname__}.<resume at line {_line(frame, offset)}>"
        args = [a if isinstance(a, str) else temp(a) for a in real]
        args += [temp(frame.locals[name]) for name in live]
        if code.co_cellvars:
            # The cell variables' cells are rebuilt for this call (output.py), shared with
            # the closures made before the break, and passed to a fresh resume function.
            cells = [temp(frame.cells[name]) for name in code.co_cellvars]
            make = (f"{guards.const(runtime_mod.make_function, 'F')}({guards.const(rc.code, 'CODE')}, "
                    f"{guards.const(fn.__globals__, 'G')}, {guards.const(fn.__closure__, 'CL')}, "
                    f"({', '.join(cells)},), {qualname!r})")
            return f"{indent}return {make}({', '.join(args)})"
        resume_fn = rc.make_function(fn.__globals__, fn.__closure__ or ())
        resume_fn.__qualname__ = qualname
        target = resume_fn
        if compiled:
            # A number computed from tensor data (an .item() the graph returns, int(t) run
            # here) is a symbol of the resume function's graph from its first capture on:
            # a new value is no recompile (automatic dynamic would guard the first one).
            data_args.update(name for name in live if is_scalar(frame.locals[name]))
            cache = runtime.cache_for(resume_fn)
            cache.dynamic_ints.update(data_args)
            target = runtime.dispatcher(resume_fn, resume_fn, cache)
        return f"{indent}return {guards.const(target, 'RESUME')}({', '.join(args)})"

    if mode == "call":
        below, fn_value, args, kwargs, _ = _split_call(frame, ins, stack)
        below_names = [v if v is NULL else temp(v) for v in below]
        call_fn = temp(fn_value)
        arg_exprs = [plan.expr(a) for a in args]
        if isinstance(kwargs, dict):
            arg_exprs += [f"**{{{', '.join(f'{k!r}: {plan.expr(v)}' for k, v in kwargs.items())}}}"]
        else:
            arg_exprs.append(f"**{kwargs}")
        lines.append(f"___r = {guards.const(runtime.call, 'F')}({call_fn}, {', '.join(arg_exprs)})")
        after = frame.instrs[ins.index + 1].offset
        data = _scalar_positions(below)
        if data_dependent and _holds_data((fn_value, args, kwargs)):
            data.add(len(below))   # int(t), max(v, 0): the result
        lines.append(resume_call(after, below_names + ["___r"], data=data))
    elif mode == "jump":
        jump = ins if ins.opname in _JUMPS else frame.instrs[ins.index + 1]
        cond, below = stack[-1], stack[:-1]
        below_names = [v if v is NULL else temp(v) for v in below]
        cond_name = temp(cond)
        target = jump.argval
        fall = frame.instrs[jump.index + 1].offset
        keep = jump.opname.endswith("_OR_POP")
        on_true_jumps = "TRUE" in jump.opname
        data = _scalar_positions(below)
        taken = resume_call(target, below_names + ([cond_name] if keep else []), "    ", data)
        not_taken = resume_call(fall, below_names, "    ", data)
        lines.append(f"if {cond_name}:")
        lines.append(taken if on_true_jumps else not_taken)
        lines.append("else:")
        lines.append(not_taken if on_true_jumps else taken)
    elif mode == "store":
        # STORE_SUBSCR holds [..., value, container, key]: the store runs here, as CPython
        # would run it (type(container).__setitem__), and the frame resumes after it.
        *below, value, container, key = stack
        below_names = [v if v is NULL else temp(v) for v in below]
        value_name, container_name, key_name = temp(value), temp(container), temp(key)
        lines.append(f"{container_name}[{key_name}] = {value_name}")
        lines.append(resume_call(frame.instrs[ins.index + 1].offset, below_names,
                                 data=_scalar_positions(below)))
    else:
        offset = _rest_offset(frame, ins)
        names = [v if v is NULL else temp(v) for v in stack]
        lines.append(resume_call(offset, names))
    return BreakPlan(mode, _restoring_contexts(lines, plan), compiled)


def _scalar_positions(values) -> set:
    """Where ``values`` holds numbers the graph computed from tensor data (ScalarVars)."""
    return {i for i, v in enumerate(values) if is_scalar(v)}


def _holds_data(values) -> bool:
    if isinstance(values, (list, tuple)):
        return any(_holds_data(v) for v in values)
    if isinstance(values, dict):
        return any(_holds_data(v) for v in values.values())
    return isinstance(values, TensorVar) or is_scalar(values)


def _restoring_contexts(lines: list[str], plan: OutputPlan) -> list[str]:
    """The runner re-enters the grad-mode/autocast blocks active at the break (the resume
    function exits them). If it raises before the resume function takes over (the breaking
    call itself), leave global state as eager's ``with`` exits would."""
    contexts = [v.context for v in plan.rebuilt() if type(v) is GradModeExit]
    if not contexts:
        return lines
    devices = tuple(sorted({c.autocast.device for c in contexts if c.kind == "autocast"}))
    # The outermost grad block's exit restores the mode from before it (the stack holds
    # the blocks outermost first).
    grad = next((c.prev for c in contexts if c.kind == "grad"), None)
    const = plan.guards.const
    return ([f"___state = {const(runtime_mod.global_state, 'F')}({devices!r}, {grad})", "try:"] +
            [f"    {line}" for line in lines] +
            ["except BaseException:",
             f"    {const(runtime_mod.restore_global_state, 'F')}(___state)",
             "    raise"])


def _mode(code, frame, ins, stack) -> str:
    if _in_try(code, ins.offset):
        return "rest"
    if ins.opname in _CALLS:
        callee = _split_call(frame, ins, stack)[1]
        if any(callee is reader for reader in _FRAME_READERS):
            return "rest"   # locals()/eval(...) must run in the resumed frame, not the entry
        return "call"
    if ins.opname in _JUMPS and stack and isinstance(stack[-1], TensorVar):
        return "jump"
    if ins.opname == "STORE_SUBSCR" and code.co_code[ins.offset] not in _SLICE_OPCODES:
        return "store"   # (3.12's STORE_SLICE is decoded as two instructions: "rest")
    if ins.opname == "TO_BOOL" and stack and isinstance(stack[-1], TensorVar):
        nxt = frame.instrs[ins.index + 1]
        if nxt.opname in ("POP_JUMP_IF_TRUE", "POP_JUMP_IF_FALSE"):
            return "jump"
    return "rest"


def _in_try(code, offset) -> bool:
    for entry in liveness.exception_entries(code):
        if entry.start <= offset < entry.end and liveness.handler_kind(code, entry.target) == "try":
            return True
    return False


def _split_call(frame, ins, stack):
    """(values below the call, callable, positional args, keyword args, kw names)."""
    if ins.opname == "CALL_FUNCTION_EX":
        has_kw = ins.arg & 1
        kwargs = stack[-1] if has_kw else {}
        args = stack[-1 - has_kw]
        a, b = stack[-3 - has_kw:-1 - has_kw]
        fn = (b if a is NULL else a) if NULL_BEFORE_CALLABLE else a
        return stack[:-3 - has_kw], fn, list(args), dict(kwargs), None
    n = ins.arg
    names = frame.kw_names
    items = stack[-(n + 2):]
    below = stack[:-(n + 2)]
    if ins.opname == "CALL_KW":
        names = stack[-1]
        items = stack[-(n + 3):-1]
        below = stack[:-(n + 3)]
    a, b, args = items[0], items[1], list(items[2:])
    if NULL_BEFORE_CALLABLE:
        fn, args = (b, args) if a is NULL else (a, [b, *args])
    else:
        fn, args = (a, args) if b is NULL else (a, [b, *args])
    kwargs = {}
    if names:
        kwargs = dict(zip(names, args[len(args) - len(names):]))
        args = args[:len(args) - len(names)]
    return below, fn, args, kwargs, names


def _rest_offset(frame, ins) -> int:
    # A CALL resumes at the instructions that prepare it: KW_NAMES (3.11/3.12) sets state
    # the resume function would otherwise lack, and dis counts the call's pops at 3.11's
    # PRECALL. The stack is the same there.
    if ins.opname not in ("CALL", "CALL_KW"):
        return ins.offset
    i = ins.index
    while i > 0 and liveness.instruction_at(frame.code, frame.instrs[i - 1].offset).opname in (
            "PRECALL", "KW_NAMES"):
        i -= 1
    return frame.instrs[i].offset


def _line(frame, offset):
    i = frame.decoded.index_of_offset.get(offset)
    return frame.instrs[i].lineno if i is not None else "?"
