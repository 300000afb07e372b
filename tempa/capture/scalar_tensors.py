"""Operations given a tensor where ATen wants a Python number, and the reverse: a tensor
made from symbolic Python numbers (``literal_of_symbols``).

``param.addcdiv_(m, d, value=-step_size)`` with ``step_size`` a 0-dim tensor (what the
optimizers compute while compiling: ``_get_value(step)`` keeps the step a tensor, so one
graph serves every step) would turn that tensor into a number, ``.item()``: a value the
graph cannot know. ``torch._foreach_addcdiv_(params, ms, ds, scalars)`` with a tensor of
scalars has no fake kernel on the CPU. Both are rewritten into the same arithmetic on
tensors, as torch.compile does (``value * (t1 / t2)`` added to ``self``); the rounding is
that of separate multiply and add instead of ATen's one fused loop.
"""
from __future__ import annotations

import operator

import torch

from .values import TensorVar

_POINTWISE = {"addcdiv": operator.truediv, "addcmul": operator.mul}
NOT_REWRITTEN = object()


def rewrite_method(builder, t: TensorVar, name: str, args, kwargs):
    """``t.addcdiv_(t1, t2, value=tensor)`` and its relatives, or NOT_REWRITTEN."""
    base = name.rstrip("_")
    value = kwargs.get("value")
    if base not in _POINTWISE or not isinstance(value, TensorVar) or len(args) != 2 or \
            set(kwargs) != {"value"}:
        return NOT_REWRITTEN
    term = _term(builder, base, args[0], args[1], value)
    if name.endswith("_"):
        return builder.call("call_method", "add_", (t, term), {})
    return builder.call("call_function", torch.add, (t, term), {})


def rewrite_function(builder, fn, args, kwargs):
    """``torch.addcdiv(x, t1, t2, value=tensor)`` and ``torch._foreach_addcdiv_(xs, t1s,
    t2s, scalars_tensor)`` (also ``addcmul``), or NOT_REWRITTEN."""
    if fn in _LITERAL_TENSORS:
        return literal_of_symbols(builder, args, kwargs)
    name = getattr(fn, "__name__", "")
    if name in ("addcdiv", "addcmul") and len(args) == 3:
        return rewrite_method(builder, args[0], name, args[1:], kwargs)
    foreach = name.removeprefix("_foreach_")
    base = foreach.rstrip("_")
    if not name.startswith("_foreach_") or base not in _POINTWISE or len(args) != 4 or \
            kwargs or not isinstance(args[3], TensorVar):
        return NOT_REWRITTEN
    selves, firsts, seconds, scalars = args
    results = []
    for i, (x, a, b) in enumerate(zip(selves, firsts, seconds)):
        scalar = builder.call("call_function", operator.getitem, (scalars, i), {})
        term = _term(builder, base, a, b, scalar)
        if foreach.endswith("_"):
            builder.call("call_method", "add_", (x, term), {})
        else:
            results.append(builder.call("call_function", torch.add, (x, term), {}))
    return None if foreach.endswith("_") else results


def _term(builder, base, a, b, value):
    combined = builder.call("call_function", _POINTWISE[base], (a, b), {})
    return builder.call("call_function", operator.mul, (combined, value), {})


_LITERAL_TENSORS = (torch.tensor, torch.as_tensor)
_SYMBOLIC_NUMBERS = {torch.SymInt: 0, torch.SymFloat: 0.0, torch.SymBool: False}


def literal_of_symbols(builder, args, kwargs):
    """``torch.tensor(n)`` / ``torch.as_tensor([n, 1])`` of Python data holding a symbolic
    number (an int that changed between calls): ``torch.scalar_tensor`` of each number,
    ``torch.stack``ed by the data's nesting, as ``torch._refs.tensor`` (what torch.compile
    traces) builds it, so one graph serves every value; ATen's own constructor would read
    the number, a guard on its value. NOT_REWRITTEN for any other data or option."""
    if len(args) != 1 or set(kwargs) - {"dtype", "device"} or not _holds_symbol(args[0]):
        return NOT_REWRITTEN
    try:   # eager infers the dtype from the numbers' Python types, and checks the nesting
        example = torch.tensor(_typed_example(args[0]))
    except (TypeError, ValueError):
        return NOT_REWRITTEN   # ragged or not numbers: ATen's constructor raises eager's error
    options = {"dtype": kwargs.get("dtype") or example.dtype}
    if kwargs.get("device") is not None:
        options["device"] = kwargs["device"]

    def build(data):
        if type(data) in (list, tuple):
            items = [build(item) for item in data]
            return builder.call("call_function", torch.stack, (items,), {})
        return builder.call("call_function", torch.scalar_tensor, (data,), options)
    return build(args[0])


def _holds_symbol(data) -> bool:
    if type(data) in (list, tuple):
        return any(_holds_symbol(item) for item in data)
    return type(data) in _SYMBOLIC_NUMBERS


def _typed_example(data):
    """``data`` with each symbolic number replaced by a plain number of its Python type,
    and anything but numbers and plain lists/tuples of them refused (TypeError)."""
    if type(data) in (list, tuple):
        return [_typed_example(item) for item in data]
    if type(data) in _SYMBOLIC_NUMBERS:
        return _SYMBOLIC_NUMBERS[type(data)]
    if type(data) not in (int, float, bool):
        raise TypeError(type(data).__name__)
    return data


def optimizer_value(tracer, frame, args, kwargs):
    """``torch.optim.optimizer._get_value(step)``: eager returns ``step.item()``, a Python
    float, so an optimizer's bias corrections (``1 - beta2 ** step``) are computed in
    double; while compiling it returns the tensor itself (one graph for every step), and
    in float32 ``1 - 0.999 ** 1`` is off by 1.3e-5 relative, which Adam's update carries.
    Here it is the step as a float64 tensor: still one graph, eager's double arithmetic."""
    (x,) = args
    if isinstance(x, TensorVar):
        return tracer.builder.call("call_method", "to", (x, torch.float64), {})
    return x.item() if isinstance(x, torch.Tensor) else x
