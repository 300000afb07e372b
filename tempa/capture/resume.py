"""Resume functions: continue a function's execution mid-way, built from its own bytecode.

When capture breaks at some instruction of a frame, the runner calls the graph compiled so
far, runs the breaking operation in plain Python, and then calls a *resume function* that
continues the ORIGINAL function at a given offset, as if CPython had been there with a
given value stack and given locals. This module builds those functions, following Dynamo's
recipe (shared/research/frontend.md section 2) with the ``bytecode`` library. It never
imports torch.

API
---
``make_resume_code(code, offset, *, stack_size, null_positions=(), live_locals, name=None)``
    -> :class:`ResumeCode`. Cached: equal arguments return the same object.

    - ``offset``: where execution continues (an instruction start as ``dis`` reports it; an
      EXTENDED_ARG prefix offset means the instruction it extends). To continue after a
      breaking CALL, use ``offset_after(code, call_offset)`` and push the call's result as
      the top stack value.
    - ``stack_size``: the number of *real* (non-NULL) stack values the caller passes.
    - ``null_positions``: indices into the *full* stack at ``offset`` (0 = bottom) that
      hold NULL, e.g. the NULL of the 3.11/3.12 ``[NULL, callable, args...]`` call layout or
      the 3.13 ``[callable, NULL, args...]`` one. The full depth is
      ``stack_size + len(null_positions)`` and must equal ``stack_depth_at(code, offset)``
      (checked; ``ValueError`` otherwise). NULLs are never passed: the prefix re-creates
      them with PUSH_NULL.
    - ``live_locals``: names of plain locals (``co_varnames``, not cell variables) to pass,
      in the order the caller will pass them. Pass the locals that are live
      (``live_locals_at``) *and bound* at the break: an omitted local is simply unbound in
      the resume function, so reading it raises UnboundLocalError exactly as the original
      would (on 3.12+ every LOAD_FAST is rewritten to LOAD_FAST_CHECK, and 3.13's
      LOAD_FAST_LOAD_FAST / STORE_FAST_LOAD_FAST superinstructions are split, so an unpassed
      local can never be read as NULL and crash the interpreter).
    - Generator, coroutine and async-generator code raises :class:`ResumeUnsupported`
      (a ``NotImplementedError``).

``ResumeCode``
    ``.code`` (CodeType), ``.argnames`` (``("___stack0", ..., "___stack{n-1}",
    *live_locals)``: call it positionally in that order), ``.freevars`` (the original's
    ``co_freevars`` followed by its ``co_cellvars``: in the resume function every cell is a
    free variable), ``.offset``, ``.original``, and helpers:

    - ``make_function(globals, closure_cells)`` -> ``types.FunctionType``; ``closure_cells``
      is one cell per ``.freevars`` entry, in order.
    - ``closure_for(fn_closure, cellvar_cells)`` -> the tuple of cells to pass:
      ``fn.__closure__`` (the original function's free-variable cells) followed by one cell
      per original cellvar, taken from ``cellvar_cells`` (a mapping name -> cell or value).
      A value that is not a ``types.CellType`` is wrapped in a fresh cell; a missing name
      gets an empty cell. Pass the *same* cell objects that closures created before the
      break captured, if any exist; otherwise a later rebinding of the variable would not
      be seen by those closures.

``instruction_at``, ``offset_after``, ``stack_depth_at``, ``live_locals_at`` are
re-exported from :mod:`tempa.capture.liveness`.

What the resume code looks like
-------------------------------
::

    COPY_FREE_VARS n          (if the original has free or cell variables)
    RESUME 0
    LOAD_FAST ___stack0 | PUSH_NULL      (one per stack slot, bottom first)
    ...
    DELETE_FAST ___stack0 ...            (so locals() shows the original's locals only)
    JUMP_FORWARD target
    <the original instructions, prologue (COPY_FREE_VARS / MAKE_CELL / RESUME) removed>
    target: <the instruction at offset> ...

The original instructions, exception table and line numbers are kept, so loops jump back
into code before the target, a later exception is caught by the original ``try`` handler,
and tracebacks show the user's file and lines. ``with`` blocks work by passing the bound
``__exit__`` of the (already entered) context manager as the stack value of the with slot:
the original cleanup code calls it on normal exit and WITH_EXCEPT_START on exceptions.
Zero-argument ``super()`` is rewritten to ``super(__class__, <first arg>)`` because the
implicit form reads the frame's first local slot, which in a resume function is
``___stack0`` or whichever live local comes first. Line numbers are kept everywhere
(only the prefix has none), so no line event or traceback ever points at the prefix.

Stack slots, by kind (``liveness.stack_kinds_at`` labels them):

- for-loop / comprehension iterator: pass the iterator object itself.
- with block: pass the bound ``__exit__`` of the entered context manager (for
  ``with cm as x`` after BEFORE_WITH: ``cm.__exit__``; ``__enter__`` was already called).
- inside an ``except`` body (``exc_info``): the exception that was being handled before
  the handler was entered (usually ``None``). The resume function is then *not* handling
  the exception itself: a bare ``raise`` or ``sys.exc_info()`` in the rest of that except
  body differ from the original. Treat breaks inside except bodies as unsupported, or run
  them eagerly.
- NULL: not passed, listed in ``null_positions``.

Known gaps: a resume function cannot reproduce the identity of the original frame's
cells unless the caller passes the same cell objects (``closure_for`` takes them);
``locals()``/``exec``/``eval`` in the rest of the function see only the passed locals
(``live_locals_at`` counts every local as live where they can run);
generators and coroutines are refused.
"""

from __future__ import annotations

import inspect
import sys
import types
from dataclasses import dataclass
from typing import Any, Mapping

from bytecode import Bytecode, CellVar, FreeVar, Instr, Label

from . import liveness
from .liveness import instruction_at, live_locals_at, offset_after, stack_depth_at

__all__ = [
    "ResumeCode",
    "ResumeUnsupported",
    "make_resume_code",
    "clear_resume_cache",
    "instruction_at",
    "offset_after",
    "stack_depth_at",
    "live_locals_at",
]

PY = sys.version_info[:2]

CO_VARARGS = inspect.CO_VARARGS
CO_VARKEYWORDS = inspect.CO_VARKEYWORDS
CO_GENERATOR = inspect.CO_GENERATOR
CO_COROUTINE = inspect.CO_COROUTINE
CO_ITERABLE_COROUTINE = inspect.CO_ITERABLE_COROUTINE
CO_ASYNC_GENERATOR = inspect.CO_ASYNC_GENERATOR
_UNSUPPORTED_FLAGS = CO_GENERATOR | CO_COROUTINE | CO_ITERABLE_COROUTINE | CO_ASYNC_GENERATOR

_PROLOGUE_OPS = ("COPY_FREE_VARS", "MAKE_CELL")


class ResumeUnsupported(NotImplementedError):
    """This code object/offset cannot be resumed (the frontend treats it as unsupported)."""


@dataclass(frozen=True, eq=False)
class ResumeCode:
    code: types.CodeType
    argnames: tuple
    freevars: tuple
    offset: int
    original: types.CodeType
    stack_size: int
    null_positions: tuple

    def make_function(self, globals: dict, closure_cells=()) -> types.FunctionType:
        cells = tuple(closure_cells or ())
        if len(cells) != len(self.freevars):
            raise ValueError(
                f"{self.code.co_name}: expected {len(self.freevars)} closure cells "
                f"{self.freevars}, got {len(cells)}"
            )
        return types.FunctionType(self.code, globals, self.code.co_name, None, cells or None)

    def closure_for(self, fn_closure, cellvar_cells: Mapping[str, Any] = None) -> tuple:
        """Cells for ``make_function``: ``fn_closure`` then one per original cellvar.

        ``cellvar_cells`` maps each cell variable to its cell (reused as is) or to its
        current value (wrapped in a fresh cell). A cell variable that is missing gets an
        EMPTY cell: correct only if it is unbound at the break; if it is bound, the rest
        of the function fails with NameError when it reads it."""
        cellvar_cells = cellvar_cells or {}
        cells = list(fn_closure or ())
        if len(cells) != len(self.original.co_freevars):
            raise ValueError(
                f"{self.original.co_name}: expected {len(self.original.co_freevars)} "
                f"closure cells for {self.original.co_freevars}, got {len(cells)}"
            )
        for name in self.original.co_cellvars:
            if name in cellvar_cells:
                v = cellvar_cells[name]
                cells.append(v if isinstance(v, types.CellType) else types.CellType(v))
            else:
                cells.append(types.CellType())
        return tuple(cells)


_CACHE: dict = {}
_BY_ID: dict = {}


def clear_resume_cache() -> None:
    _CACHE.clear()
    _BY_ID.clear()


def make_resume_code(
    code: types.CodeType,
    offset: int,
    *,
    stack_size: int,
    null_positions=(),
    live_locals,
    name: str | None = None,
) -> ResumeCode:
    null_positions = tuple(sorted(null_positions))
    live_locals = tuple(live_locals)
    rest = (offset, stack_size, null_positions, live_locals, name)
    # Identity fast path: the cached ResumeCode holds ``code``, so the id stays unique.
    hit = _BY_ID.get((id(code), rest))
    if hit is not None and hit.original is code:
        return hit
    key = (code, code.co_filename, rest)
    hit = _CACHE.get(key)
    if hit is None:
        hit = _CACHE[key] = _build(code, offset, stack_size, null_positions, live_locals, name)
    _BY_ID[(id(code), rest)] = hit
    return hit


def _check_args(code, offset, stack_size, null_positions, live_locals):
    if code.co_flags & _UNSUPPORTED_FLAGS:
        raise ResumeUnsupported(
            f"cannot resume {code.co_name} ({code.co_filename}:{code.co_firstlineno}): "
            "generators, coroutines and async generators are not supported"
        )
    ins = instruction_at(code, offset)  # ValueError if not an instruction start
    depth = stack_depth_at(code, ins.offset)
    if stack_size < 0 or stack_size + len(null_positions) != depth:
        raise ValueError(
            f"{code.co_name}@{offset} ({ins.opname}): the stack holds {depth} entries there, "
            f"but stack_size={stack_size} + {len(null_positions)} NULLs were given"
        )
    if len(set(null_positions)) != len(null_positions) or any(
        not 0 <= p < depth for p in null_positions
    ):
        raise ValueError(f"bad null_positions {null_positions} for stack depth {depth}")
    cells = set(code.co_cellvars) | set(code.co_freevars)
    for v in live_locals:
        if v not in code.co_varnames or v in cells:
            raise ValueError(
                f"{code.co_name}: {v!r} is not a plain local (cell variables travel as cells)"
            )
    if len(set(live_locals)) != len(live_locals):
        raise ValueError(f"duplicate names in live_locals {live_locals}")
    return ins, depth


def _to_free(arg):
    return FreeVar(arg.name) if isinstance(arg, CellVar) else arg


def _rewrite(instr, cellvars):
    """The instructions that replace one original instruction in a resume function."""
    name = instr.name
    if name in _PROLOGUE_OPS:
        return []
    if isinstance(instr.arg, CellVar):
        instr = Instr(name, _to_free(instr.arg), location=instr.location)
    elif name == "LOAD_FAST" and isinstance(instr.arg, str) and instr.arg in cellvars:
        # 3.13 loads a cell object for a closure with LOAD_FAST (LOAD_CLOSURE is gone);
        # when the cell variable is also an argument, the bytecode library names it by
        # its plain name. In the resume function that slot is a free variable.
        return [Instr(name, FreeVar(instr.arg), location=instr.location)]
    if PY >= (3, 12):
        if name == "LOAD_FAST" and isinstance(instr.arg, str):
            return [Instr("LOAD_FAST_CHECK", instr.arg, location=instr.location)]
        if name == "LOAD_FAST_LOAD_FAST":
            a, b = instr.arg
            return [
                Instr("LOAD_FAST_CHECK", a, location=instr.location),
                Instr("LOAD_FAST_CHECK", b, location=instr.location),
            ]
        if name == "STORE_FAST_LOAD_FAST":
            a, b = instr.arg
            return [
                Instr("STORE_FAST", a, location=instr.location),
                Instr("LOAD_FAST_CHECK", b, location=instr.location),
            ]
    return [instr]


def _zero_arg_super_call(items, k):
    """Index of the CALL 0 (and on 3.11 the PRECALL 0 before it) following LOAD_GLOBAL
    super at k, or None."""
    j = k + 1
    while j < len(items) and not isinstance(items[j], Instr):
        j += 1
    if j >= len(items):
        return None
    nxt = items[j]
    if PY < (3, 12):
        if nxt.name == "PRECALL" and nxt.arg == 0:
            return j
        return None
    if nxt.name == "CALL" and nxt.arg == 0:
        return j
    return None


def _build(code, offset, stack_size, null_positions, live_locals, name):
    target_ins, depth = _check_args(code, offset, stack_size, null_positions, live_locals)
    a = liveness._analysis(code)

    bc = Bytecode.from_code(code, conserve_exception_block_stackdepth=True)
    items = list(bc)
    instr_idx = [i for i, x in enumerate(items) if isinstance(x, Instr)]
    real = [ins for ins in a.insts if ins.opname != "EXTENDED_ARG"]
    if len(real) != len(instr_idx) or any(
        items[i].name != ins.opname for i, ins in zip(instr_idx, real)
    ):
        raise ResumeUnsupported(
            f"{code.co_name}: cannot align the bytecode library's instructions with dis"
        )
    target_pos = instr_idx[[ins.offset for ins in real].index(target_ins.offset)]

    cells = set(code.co_cellvars)
    freevars = tuple(code.co_freevars) + tuple(code.co_cellvars)
    first_arg = code.co_varnames[0] if (code.co_argcount or code.co_flags & CO_VARARGS) else None
    has_class_cell = "__class__" in code.co_freevars or "__class__" in cells

    # Patch zero-argument super(): LOAD_GLOBAL super; [PRECALL 0;] CALL 0
    #   -> LOAD_GLOBAL super; LOAD_DEREF __class__; LOAD_FAST first; [PRECALL 2;] CALL 2
    super_patch = {}
    if has_class_cell and first_arg is not None:
        for k, it in enumerate(items):
            if isinstance(it, Instr) and it.name == "LOAD_GLOBAL" and it.arg[1] == "super":
                j = _zero_arg_super_call(items, k)
                if j is not None:
                    super_patch[k] = j

    # A loop's exit, END_FOR (3.12+; on 3.13 with the POP_TOP after it): CPython's FOR_ITER
    # jumps over it when the iterator is exhausted, so it never runs, and the entry below the
    # iterator that it would pop may be a NULL (Py_DECREF(NULL): a segfault). Resume after it
    # instead, without the iterator and that entry.
    skipped = 0
    while target_ins.opname == "END_FOR" or (skipped and target_ins.opname == "POP_TOP"
                                             and sys.version_info >= (3, 13)):
        target_ins = next(ins for ins in real if ins.offset > target_ins.offset)
        skipped += 1
    dropped = 2 if skipped else 0
    if skipped:
        target_pos = instr_idx[[ins.offset for ins in real].index(target_ins.offset)]

    label = Label()
    out = []
    # Prefix.
    if freevars:
        out.append(Instr("COPY_FREE_VARS", len(freevars), lineno=None))
    first_resume = next(x for x in items if isinstance(x, Instr) and x.name == "RESUME")
    out.append(Instr("RESUME", 0, location=first_resume.location))
    k = 0
    for pos in range(depth - dropped):
        if pos in null_positions:
            out.append(Instr("PUSH_NULL", lineno=None))
        else:
            out.append(Instr("LOAD_FAST", f"___stack{k}", lineno=None))
            k += 1
    # The stack arguments are unbound once pushed: locals(), vars() and eval() in the rest
    # of the function see the original's locals only.
    for i in range(stack_size):
        out.append(Instr("DELETE_FAST", f"___stack{i}", lineno=None))
    out.append(Instr("JUMP_FORWARD", label, lineno=None))

    # The original body.
    seen_resume = False
    calls_to_patch = set(super_patch.values())
    for k, it in enumerate(items):
        if k == target_pos:
            out.append(label)
        if not isinstance(it, Instr):
            out.append(it)
            continue
        if not seen_resume and it.name == "RESUME":
            seen_resume = True
            continue  # replaced by the prefix's RESUME
        if k in calls_to_patch:
            cls_arg = FreeVar("__class__")
            if first_arg in cells:
                load_first = Instr("LOAD_DEREF", FreeVar(first_arg), location=it.location)
            else:
                op = "LOAD_FAST_CHECK" if PY >= (3, 12) else "LOAD_FAST"
                load_first = Instr(op, first_arg, location=it.location)
            out.append(Instr("LOAD_DEREF", cls_arg, location=it.location))
            out.append(load_first)
            if PY < (3, 12):
                out.append(Instr("PRECALL", 2, location=it.location))
                continue  # the CALL 0 after it is patched below
            out.append(Instr("CALL", 2, location=it.location))
            continue
        if PY < (3, 12) and it.name == "CALL" and it.arg == 0 and (k - 1) in calls_to_patch:
            out.append(Instr("CALL", 2, location=it.location))
            continue
        out.extend(_rewrite(it, cells))

    stack_names = tuple(f"___stack{i}" for i in range(stack_size))
    argnames = stack_names + live_locals

    new = Bytecode(out)
    new._copy_attr_from(bc)
    new.argnames = list(argnames)
    new.argcount = len(argnames)
    new.posonlyargcount = 0
    new.kwonlyargcount = 0
    new.flags = bc.flags & ~(CO_VARARGS | CO_VARKEYWORDS)
    new.cellvars = []
    new.freevars = list(freevars)
    rname = name or f"{code.co_name}_resume_at_{offset}"
    new.name = rname
    if hasattr(new, "qualname"):
        new.qualname = name or f"{code.co_qualname}_resume_at_{offset}"
    stacksize = code.co_stacksize + (2 if super_patch else 0)
    try:
        new_code = new.to_code(stacksize=stacksize, compute_exception_stack_depths=False)
    except Exception as e:  # a bug here must not take the frontend down
        raise ResumeUnsupported(f"{code.co_name}@{offset}: could not assemble: {e!r}") from e
    if tuple(new_code.co_freevars) != freevars or new_code.co_cellvars:
        raise ResumeUnsupported(
            f"{code.co_name}@{offset}: unexpected cell layout {new_code.co_freevars}"
        )
    if tuple(new_code.co_varnames[: len(argnames)]) != argnames:
        raise ResumeUnsupported(f"{code.co_name}@{offset}: unexpected argument layout")
    return ResumeCode(
        code=new_code,
        argnames=argnames,
        freevars=freevars,
        offset=offset,
        original=code,
        stack_size=stack_size,
        null_positions=null_positions,
    )
