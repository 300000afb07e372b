"""Graph breaks as data: every reason capture stops has a type, a reason, a place and a hint.

``Unsupported`` is raised inside the interpreter; the capture driver turns it into a graph
break (issue: graph breaks) or, where no break is possible, an eager fallback. Either way the
user sees the type, the one-line reason, their file and line, and what to change.
"""
from __future__ import annotations

from dataclasses import dataclass

# type -> hint shown to the user
BREAK_TYPES = {
    "data-dependent branch": "the branch depends on a tensor's value; compute both sides with "
                             "torch.where, or move the check out of the compiled function",
    "data-dependent value": ".item()/.tolist()/int(tensor) need the tensor's value at run time; "
                            "keep the value as a tensor if you can",
    "print / side effect": "remove the print or logging from forward, or accept the break",
    "non-torch library call": "calls into numpy/math/other libraries run in Python; use the "
                              "torch equivalent to keep one graph",
    "interpreter invariant": "tempa's interpreter reached a state that valid bytecode never "
                             "produces (a bug in tempa, please report it); the code runs "
                             "eagerly meanwhile",
    "zero-argument super": "super() with no arguments needs the __class__ cell of a method "
                           "defined in a class body; call super(Class, self) explicitly",
    "operator on a container of tensors": "tempa does not apply this operator (a dict or set "
                                          "operator) to containers that hold tensors; build "
                                          "the container another way (dict.update, a "
                                          "comprehension), or outside the compiled function",
    "tensor in native code": "a library function tempa runs natively (not interpreted) was "
                             "handed a graph tensor and iterated it; iterate the tensor in "
                             "your own code, or mark the helper @tempa.disable",
    "impure call": "the call reads or changes state outside the program (random numbers, the "
                   "clock, the environment, an outside iterator, warnings, I/O); it runs in "
                   "Python on every call and the rest stays compiled",
    "unsupported call": "tempa does not know how to capture this callable; wrap it with "
                        "@tempa.disable to run it eagerly on purpose",
    "autograd.Function": "this user autograd.Function does something one graph operation "
                         "cannot show (see the reason); it runs eagerly, with its own backward",
    "disabled by tempa.disable": "the function is marked @tempa.disable; it runs eagerly",
    "disabled by torch.compiler.disable": "the function is marked @torch.compiler.disable; it "
                                          "runs eagerly",
    "mutation of outside state": "the code changes an object that lives outside the call; "
                                 "return the value instead, or accept the break",
    "user exception": "the code raised an exception while being captured",
    "generator": "generators are run in Python; use a list comprehension",
    "try block": "a try/except around tensor code is run in Python",
    "hooks": "forward hooks on this module are not captured; remove them or accept eager",
    "unsupported opcode": "tempa's interpreter has no handler for this bytecode instruction "
                          "yet; write the statement another way, or move it into a helper "
                          "marked @tempa.disable",
    "forced break": "a test asked for a break at this instruction (interpreter.FORCED_BREAKS)",
    "instruction limit": "capture runs the bytecode and stops after 5 million instructions; "
                         "make the long Python loop tensor operations, or move it out of the "
                         "compiled function",
    "huge or endless iterator": "capture unrolls loops over what it iterates; iterate "
                                "something bounded (a range, a list), or move the loop out of "
                                "the compiled function",
    "tensor attribute": "this attribute of a graph tensor (.grad_fn, ._version, ._base, the "
                        ".grad of a tensor computed in the graph, an attribute set on it; "
                        "setting .data, .requires_grad or a .grad of another shape) is not "
                        "part of a graph; read or set it outside the compiled function",
    "value leaving compiled code": "a value made in the compiled code that Python receives "
                                   "(after a graph break, or as the return value) is rebuilt "
                                   "there; a generator, lazy iterator, @contextmanager or "
                                   "closure over tensors cannot be: consume it (list(...)) or "
                                   "finish with it before the break, or make it outside",
    "unguardable container": "a container subclass of the caller's that tempa reads as "
                             "itself (one with a hash or slots, a dict or set subclass) holds "
                             "other containers or too many items to guard one by one; pass a "
                             "plain list, tuple or dict, or accept the break",
    "deeply nested input": "an argument nested deeper than tempa guards; pass a flatter "
                           "structure",
    "module call": "a module whose __call__ is overridden, or whose forward was replaced on "
                   "the instance after compiling, runs eagerly; define forward on the class",
    "cannot resume": "tempa cannot continue this function after the break at this place; put "
                     "the call that breaks in a statement of its own, outside loops and "
                     "with-blocks, or into a helper marked @tempa.disable",
    "aliased inputs written in place": "arguments that share memory, written in place, run "
                                       "eagerly; pass tensors that do not overlap (clone "
                                       "one), or return new tensors instead",
    "lazy module initialisation": "call the lazy module once before compiling (or compile "
                                  "with dynamic=False) so that its parameters exist",
    "async code": "coroutines and async generators run eagerly; await them outside the "
                  "compiled function",
    "call depth": "calls nest deeper than tempa inlines (recursion?); write the recursion as "
                  "a loop, or mark the recursive function @tempa.disable",
    "context manager": "tempa captures no_grad / enable_grad / set_grad_enabled(constant) / "
                       "autocast, warnings.catch_warnings with no break inside, and "
                       "context managers written in Python (classes, "
                       "@contextmanager functions called in the compiled code); enter this "
                       "one outside the compiled function, or accept the break",
    "module created in forward": "a module with parameters made in forward gets new "
                                 "parameters on every call; create it in __init__",
    "class created in forward": "define the class outside the compiled function",
    "symbolic size": "a size expression tempa cannot turn into a guard or a graph node; mark "
                     "the dimension static (tempa.mark_static) or compile with dynamic=False",
}


@dataclass
class BreakReason:
    type: str
    reason: str
    filename: str = "?"
    lineno: int | None = None
    function: str = "?"

    @property
    def hint(self) -> str:
        return BREAK_TYPES.get(self.type, "")

    @property
    def where(self) -> str:
        return f"{self.filename}:{self.lineno} in {self.function}"

    def __str__(self) -> str:
        return f"{self.type}: {self.reason} ({self.where}). Hint: {self.hint}"


class Unsupported(Exception):
    """Capture cannot continue here. ``where`` is filled in by the frame that saw it."""

    def __init__(self, type: str, reason: str):
        assert type in BREAK_TYPES, type
        super().__init__(reason)
        self.break_type = type
        self.reason = reason
        self.location: BreakReason | None = None
        self.root_count: int | None = None   # instructions the root frame ran before it
        self.root_offset: int | None = None

    def at(self, filename: str, lineno: int | None, function: str) -> "Unsupported":
        if self.location is None:
            self.location = BreakReason(self.break_type, self.reason, filename, lineno, function)
        return self

    def __str__(self) -> str:
        return str(self.location) if self.location else f"{self.break_type}: {self.reason}"


class GraphBreakError(RuntimeError):
    """Raised with ``fullgraph=True`` at the first graph break."""

    def __init__(self, reason: BreakReason):
        super().__init__(
            f"tempa: graph break with fullgraph=True: {reason.type}: {reason.reason}\n"
            f"  at {reason.filename}:{reason.lineno} in {reason.function}\n"
            f"  hint: {reason.hint}")
        self.reason = reason


# fullgraph=True promises one graph or an error. A function whose call ends in an uncaught
# exception of the user's code is not one graph, so under fullgraph that call raises a
# GraphBreakError; but it is still the user's error, and `except TypeError:` around the call
# must keep working. So the error raised is an instance of both classes: eager's exception
# (same class, same args and attributes, so the same message) and GraphBreakError, with
# eager's exception chained as its cause. (torch.compile raises its Unsupported here, which
# an `except TypeError:` misses.)
_FULLGRAPH_CLASSES: dict[type, type] = {}


def _fullgraph_class(cls: type) -> type:
    """``cls`` and GraphBreakError in one class (cls first in the MRO, so its ``__str__`` and
    methods win), made once per class."""
    combined = _FULLGRAPH_CLASSES.get(cls)
    if combined is None:
        combined = type(f"GraphBreakError[{cls.__name__}]", (cls, GraphBreakError), {})
        combined.__module__, combined.__qualname__ = "tempa", combined.__name__
        _FULLGRAPH_CLASSES[cls] = combined
    return combined


def fullgraph_error(exc: Exception, reason: BreakReason) -> Exception:
    """The error a fullgraph call raises where the user's code raised ``exc`` (see above).
    Built without calling ``__init__`` (a user class's signature need not fit its args);
    where the class cannot be combined or copied, a plain GraphBreakError from ``exc``."""
    try:
        cls = _fullgraph_class(type(exc))
        err = cls.__new__(cls, *exc.args)
        err.args = exc.args
        if isinstance(exc, (AttributeError, NameError)):   # their fields outside args
            err.name = exc.name
        if isinstance(exc, AttributeError):
            err.obj = exc.obj
        err.__dict__.update(getattr(exc, "__dict__", {}))
        err.__notes__ = list(getattr(exc, "__notes__", ()))   # a copy: eager's stays as it is
    except Exception:   # a final class, a layout that cannot be combined, an odd __new__
        err = GraphBreakError(reason)
    err.reason = reason
    err.add_note(f"tempa: fullgraph=True and the compiled function raised {type(exc).__name__} "
                 f"({reason.where}): not one graph")
    err.__cause__ = exc
    return err.with_traceback(exc.__traceback__)


class UserError(Exception):
    """An exception the user's own code raised while being captured: re-raised unchanged."""

    def __init__(self, exc: BaseException):
        super().__init__(repr(exc))
        self.exc = exc


class InternalError(Exception):
    """tempa's own code failed while capturing (a bug in tempa: a NameError in a handler, an
    attribute typo on one of its objects). Never handed to the interpreted code as its
    exception, which an ``except`` there could catch and take another path on: the call
    runs eagerly, counted and logged with this traceback (``context.py``), or it is raised
    under ``config.raise_on_failure``. ``where`` is the user's line capture was at."""

    def __init__(self, error: BaseException, where: str = "?"):
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error
        self.where = where
