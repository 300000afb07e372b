"""How a ``Frame``'s run loop is left other than by returning.

The interpreted code's own exception that its frame does not handle travels as
``_PyException`` (so that one that is not an ``Exception``, ``GeneratorExit`` raised by the
code, still reaches the code's handlers while a real Ctrl-C during capture does not); a
generator's ``yield`` stops its frame with ``_Suspend``; ``_MAX_INSTRUCTIONS`` ends an
endless loop. Raised by the opcode handlers and caught by the run loop
(``interpreter.py``), by ``GeneratorRun`` and by ``capture.py``. An exception of tempa's own
code leaves as ``breaks.InternalError``, never as the code's (``raised_by_tempa``).
"""
from __future__ import annotations

import dis
import os
import re
import sys
import types

_MAX_INSTRUCTIONS = 5_000_000

_TEMPA_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
# Instructions whose failure inside tempa's code is tempa's bug whatever the program does:
# looking up one of its own names (NameError, UnboundLocalError) ...
_NAME_LOOKUPS = frozenset({
    "LOAD_GLOBAL", "LOAD_NAME", "LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_LOAD_FAST",
    "LOAD_DEREF", "LOAD_CLOSURE", "LOAD_FROM_DICT_OR_DEREF", "LOAD_FROM_DICT_OR_GLOBALS",
    "DELETE_FAST", "DELETE_DEREF", "DELETE_GLOBAL", "DELETE_NAME"})
# ... and a fixed attribute name written in its code (AttributeError, on its own objects).
_ATTRIBUTE_OPS = frozenset({"LOAD_ATTR", "LOAD_METHOD", "LOAD_SUPER_ATTR", "STORE_ATTR",
                            "DELETE_ATTR"})
# ... and a call whose arguments do not fit a function of its own (TypeError).
_SIGNATURE_ERROR = re.compile(r"([\w.]+)\(\) (takes \d+|missing \d+ required|got an unexpected "
                              r"keyword|got multiple values)")


class _PyException(Exception):
    """A Python exception raised by the interpreted code and not handled in its frame."""

    def __init__(self, exc: BaseException):
        super().__init__(repr(exc))
        self.exc = exc


class _Suspend(Exception):
    """YIELD_VALUE of a generator run step by step: the frame stops, resumable."""


def raised_by_tempa(exc: BaseException, handler_code: types.CodeType | None = None) -> bool:
    """Whether tempa's own code raised ``exc`` by mistake, rather than the interpreted program.

    The opcode handlers evaluate the program's operations natively, so what they raise is
    mostly the program's exception (``d[k]``'s KeyError, ``a + b``'s TypeError, an error of a
    C function or of the user's code they called). It is tempa's when it was raised in a
    frame of tempa's code (or of the handler itself, ``handler_code``) by an instruction that
    can fail there only through a bug: a name tempa's code looks up, a fixed attribute of one
    of tempa's objects or modules, an ``assert`` of tempa's, a call of one of its functions
    with arguments that do not fit it. An exception tempa raises on purpose for the program
    (``raise NameError(...)`` for a missing global) is raised by a ``raise`` statement, which
    none of these is. (Taking a program's exception for tempa's costs an eager run of the
    call, which raises it again; the other way round is a wrong answer.)"""
    tb = exc.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    if code is not handler_code and not code.co_filename.startswith(_TEMPA_DIR):
        return False
    lasti = tb.tb_lasti
    op = dis.opname[code.co_code[lasti]] if 0 <= lasti < len(code.co_code) else ""
    if isinstance(exc, NameError):
        return op in _NAME_LOOKUPS
    if isinstance(exc, AttributeError):
        return op in _ATTRIBUTE_OPS and _is_tempas(getattr(exc, "obj", None))
    if isinstance(exc, AssertionError):
        return _asserts_on_line(code, tb.tb_lineno)
    if isinstance(exc, TypeError):
        return op.startswith("CALL") and _calls_tempas_function_wrongly(str(exc))
    return False


def _calls_tempas_function_wrongly(message: str) -> bool:
    """The TypeError of a call whose arguments do not fit the signature of a function of
    tempa's (``Tracer.call() takes 5 positional arguments but 6 were given``: a caller
    left behind by a changed signature), named by its qualified name."""
    match = _SIGNATURE_ERROR.match(message)
    if match is None:
        return False
    head, *rest = match.group(1).split(".")
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] != "tempa" or head not in getattr(module, "__dict__", {}):
            continue
        obj = module.__dict__[head]
        for part in rest:
            obj = getattr(obj, part, None)
        if getattr(obj, "__qualname__", None) == match.group(1):
            return True
    return False


def _is_tempas(obj) -> bool:
    """One of tempa's own objects (a TensorVar, the tracer, a frame) or modules."""
    if isinstance(obj, types.ModuleType):
        return obj.__name__.split(".")[0] == "tempa"
    return type(obj).__module__.split(".")[0] == "tempa"


def _asserts_on_line(code: types.CodeType, line: int | None) -> bool:
    """The line raises an AssertionError of its own making (``assert``, ``raise
    AssertionError(...)``), not one the program raised and tempa passes on."""
    return any(ins.positions.lineno == line and (
        ins.opname == "LOAD_ASSERTION_ERROR" or
        ins.opname in ("LOAD_GLOBAL", "LOAD_NAME") and ins.argval == "AssertionError")
        for ins in dis.get_instructions(code))
