"""Python's operator protocol for objects whose class defines the operator in Python code.

``a + b`` on two user objects runs ``type(a).__add__`` (then ``type(b).__radd__`` when the
first answers NotImplemented, the reflected one first when ``b``'s class is a subclass
overriding it). Evaluating ``operator.add(a, b)`` at capture would run that Python code
outside the interpreter, on the real objects: its tensor work would be done once and baked
into every later call, its attribute reads unguarded. So where a Python-level method takes
part, these functions follow the protocol and call each method through the frame (traced);
C-level methods (``int.__add__``) are called directly, as they were. Each returns ``NATIVE``
when no Python code takes part, and the caller evaluates the operator as before.
"""
from __future__ import annotations

import inspect
import operator
import types

from .breaks import Unsupported, UserError
from .values import TensorVar

NATIVE = object()

_BINARY_NAMES = {
    "ADD": ("add", "+"), "SUBTRACT": ("sub", "-"), "MULTIPLY": ("mul", "*"),
    "TRUE_DIVIDE": ("truediv", "/"), "FLOOR_DIVIDE": ("floordiv", "//"),
    "REMAINDER": ("mod", "%"), "POWER": ("pow", "** or pow()"), "MATRIX_MULTIPLY": ("matmul", "@"),
    "LSHIFT": ("lshift", "<<"), "RSHIFT": ("rshift", ">>"), "AND": ("and", "&"),
    "OR": ("or", "|"), "XOR": ("xor", "^"),
}
# comparison -> (method, the reflected method tried on the right operand)
_COMPARE_NAMES = {"<": ("__lt__", "__gt__"), "<=": ("__le__", "__ge__"),
                  "==": ("__eq__", "__eq__"), "!=": ("__ne__", "__ne__"),
                  ">": ("__gt__", "__lt__"), ">=": ("__ge__", "__le__")}
_UNARY_NAMES = {"neg": "__neg__", "pos": "__pos__", "invert": "__invert__"}


def _method(obj, name: str):
    """``type(obj).name`` as the interpreter's slot lookup finds it (None when absent)."""
    try:
        return inspect.getattr_static(type(obj), name)
    except AttributeError:
        return None


def _is_python(method) -> bool:
    """User Python code; torch's own (SymInt's operators, which capture evaluates on
    symbolic sizes) and tempa's own capture values (a captured scalar's ``__bool__`` is a
    graph break) are not interpreted."""
    return isinstance(method, types.FunctionType) and \
        not (method.__module__ or "").startswith(("torch", "tempa."))


def _call(frame, obj, name: str, method, other):
    if _is_python(method):
        return frame.call(method, [obj, other], {})
    return getattr(type(obj), name)(obj, other)


def _try_in_order(frame, attempts):
    """Call the methods of ``attempts`` ((obj, name, other) each) in order; the first
    result that is not NotImplemented, else NotImplemented."""
    for obj, name, other in attempts:
        method = _method(obj, name)
        if method is None:
            continue
        result = _call(frame, obj, name, method, other)
        if result is not NotImplemented:
            return result
    return NotImplemented


def _ordered(a, b, forward: str, reflected: str, inplace: str | None):
    """The methods Python tries for ``a op b``, in its order."""
    attempts = [(a, inplace, b)] if inplace else []
    ta, tb = type(a), type(b)
    if ta is tb:
        return attempts + [(a, forward, b)]
    if issubclass(tb, ta) and _method(b, reflected) is not _method(a, reflected):
        return attempts + [(b, reflected, a), (a, forward, b)]
    return attempts + [(a, forward, b), (b, reflected, a)]


def _involves_python(attempts) -> bool:
    return any(_is_python(_method(obj, name)) for obj, name, _ in attempts)


def binary(frame, key: str, inplace: bool, a, b):
    """``a op b`` (``a op= b``) where a Python-level operator method takes part."""
    name, symbol = _BINARY_NAMES[key]
    attempts = _ordered(a, b, f"__{name}__", f"__r{name}__", f"__i{name}__" if inplace else None)
    if not _involves_python(attempts):
        return NATIVE
    result = _try_in_order(frame, attempts)
    if result is NotImplemented:
        raise UserError(TypeError(f"unsupported operand type(s) for {symbol}{'=' if inplace else ''}"
                                  f": '{type(a).__name__}' and '{type(b).__name__}'"))
    return result


def compare(frame, op: str, a, b):
    """``a op b`` for a comparison where a Python-level rich comparison takes part."""
    forward, reflected = _COMPARE_NAMES[op]
    attempts = _ordered(a, b, forward, reflected, None)
    if type(a) is type(b):
        attempts.append((b, reflected, a))   # Python tries the reflection for equal types too
    if not _involves_python(attempts):
        return NATIVE
    result = _try_in_order(frame, attempts)
    if result is not NotImplemented:
        return result
    if op in ("==", "!="):
        return (a is b) == (op == "==")
    raise UserError(TypeError(f"'{op}' not supported between instances of "
                              f"'{type(a).__name__}' and '{type(b).__name__}'"))


def unary(frame, fn_name: str, v):
    """``-v`` / ``+v`` / ``~v`` where the class defines the operator in Python."""
    name = _UNARY_NAMES.get(fn_name)
    method = _method(v, name) if name else None
    if not _is_python(method):
        return NATIVE
    return frame.call(method, [v], {})


def truth(frame, v):
    """``bool(v)`` where the class defines ``__bool__`` (or, lacking it, ``__len__``) in
    Python: the method runs traced, and its answer is checked as Python checks it."""
    method = _method(v, "__bool__")
    if method is None:
        length = _method(v, "__len__")
        if not _is_python(length):
            return NATIVE
        n = frame.call(length, [v], {})
        if isinstance(n, TensorVar):
            raise Unsupported("data-dependent value", "__len__ returned a tensor")
        n = operator.index(n)
        if n < 0:
            raise UserError(ValueError("__len__() should return >= 0"))
        return n != 0
    if not _is_python(method):
        return NATIVE
    result = frame.call(method, [v], {})
    if type(result) is not bool:
        kind = "Tensor" if isinstance(result, TensorVar) else type(result).__name__
        raise UserError(TypeError(f"__bool__ should return bool, returned {kind}"))
    return result
