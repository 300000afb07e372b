"""Python numbers that depend on tensor values, kept in the graph (torch.compile's
``capture_scalar_outputs``).

``t.item()``, ``float(t)``, ``int(t)`` and ``bool(t)`` of a one-element tensor give a
``ScalarVar``: an FX node that produces the real Python number when the graph runs. Python
arithmetic on it (``v * 2 + 1``, comparisons) is more nodes running Python's own operators,
so the semantics are Python's exactly; passed to a tensor operator (``x * v``) the node is
the operand, so type promotion is a Python scalar's. Only operations whose result *type*
does not depend on the value are kept (``**`` is not: ``(-1.0) ** 0.5`` is complex). The
graph never assumes the value, so a new one needs no recompile.

Where a tensor operation needs the number (``torch.arange(v)``, ``x[:v]``, ``x[v]``), its
metadata comes from fake tensors with the number as an *unbacked symbol* of a ShapeEnv
(``symbol_of``), as in torch.compile: the result's size is that symbol, computed by the
graph at run time. ``torch._check(v >= 0)`` is a graph node that raises eager's error, and
it tells the ShapeEnv the symbol's range, so a comparison it decides (``v >= 0`` again, or
``len(torch.arange(v)) == v``) is a Python bool, as torch.compile decides it.

Where Python itself must see the number (a branch the ShapeEnv cannot decide, ``range(v)``,
a call into C code), ``ScalarVar`` raises ``Unsupported``: one graph break, the graph
computes the value and hands it over as a 0-d tensor's ``.item()`` (``output.py``).
"""
from __future__ import annotations

import operator

import torch

from .breaks import Unsupported, UserError
from .values import ScalarVar, TensorVar

# An example of each kind, for metadata only: not 0 or 1, which rules might special-case.
_EXAMPLES = {float: 1.5, int: 3, bool: True}
_DTYPES = {float: torch.float64, int: torch.int64, bool: torch.bool}
# Python operators whose result type is fixed by the operand types.
_KEPT = {operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
         operator.mod, operator.neg, operator.pos, operator.abs, operator.lt, operator.le,
         operator.gt, operator.ge, operator.eq, operator.ne, operator.iadd, operator.isub,
         operator.imul, operator.itruediv, operator.ifloordiv, operator.imod}


def is_scalar(value) -> bool:
    return type(value) is ScalarVar


def _make(builder, node, kind: type) -> ScalarVar:
    example = _EXAMPLES[kind]
    node.meta["example_value"] = example
    sv = ScalarVar(node, example, None)
    sv.tensor = builder.call("call_function", torch.scalar_tensor, (sv,), {"dtype": _DTYPES[kind]})
    return sv


def item(tracer, t: TensorVar, kind: type | None = None) -> ScalarVar:
    """``t.item()`` (``kind`` None: the tensor's own kind) or ``float(t)``/``int(t)``/``bool(t)``."""
    fake = t.fake
    numel = fake.numel()
    if type(numel) is not int or fake.dtype.is_complex or fake.device.type == "meta":
        raise Unsupported("data-dependent value", f"tensor.item() of a {fake.dtype} tensor "
                          "of symbolic size")
    if numel != 1:   # eager's error (RuntimeError for .item(), ValueError for float(t))
        example = torch.zeros(tuple(fake.shape), dtype=fake.dtype)
        try:
            example.item() if kind is None else kind(example)
        except Exception as e:
            raise UserError(e) from None
    own = bool if fake.dtype is torch.bool else float if fake.dtype.is_floating_point else int
    builder = tracer.builder
    node = builder.graph.call_method("item", (t.node,))
    sv = _make(builder, node, own)
    if kind is not None and kind is not own:
        sv = _make(builder, builder.graph.call_function(kind, (node,)), kind)
    return sv


# tolist() of more elements than this is a graph break (each element is three nodes).
_MAX_TOLIST = 64


def tolist(tracer, t: TensorVar):
    """``t.tolist()`` of a small tensor of static shape: nested lists of captured numbers."""
    fake = t.fake
    numel = fake.numel()
    if type(numel) is not int or numel > _MAX_TOLIST or fake.dtype.is_complex:
        raise Unsupported("data-dependent value", f"tensor.tolist() of {numel} elements")
    if fake.dim() == 0:
        return item(tracer, t)
    rows = tracer.builder.call("call_method", "unbind", (t, 0), {})
    return [tolist(tracer, r) for r in rows]


def check(tracer, frame, args, kwargs):
    """``torch._check(cond)``: on a captured condition, a graph node that raises eager's
    RuntimeError when the graph runs with a value that fails it; else the Python code.
    The ShapeEnv learns the condition: later decisions on the symbol may rely on it, as the
    graph checks it before anything after it can be observed."""
    if len(args) == 1 and not kwargs and is_scalar(args[0]):
        builder = tracer.builder
        builder.graph.call_function(torch._check, (args[0].node,))
        try:
            condition = symbol_of(builder, args[0])
        except Unsupported:   # a condition the ShapeEnv cannot state: the node checks it
            return None
        if isinstance(condition, torch.SymBool):
            with builder.fake_mode:
                try:
                    torch._check(condition)
                except RuntimeError:   # false for every value: the graph node raises
                    pass
        return None
    from .calls_inline import inline
    return inline(tracer, frame, torch._check, list(args), kwargs)


def operator_call(tracer, op, operands: tuple):
    """A Python operator with a ScalarVar operand and numbers or tensors for the others."""
    if op not in _KEPT:
        raise Unsupported("data-dependent value", f"{op.__name__} of a value computed from a "
                          "tensor needs that value in Python")
    if any(isinstance(v, TensorVar) for v in operands):
        return tracer.builder.call("call_function", op, operands, {})
    builder = tracer.builder
    symbolic = _symbolic(builder, op, operands)
    decided = _decided(symbolic)
    if decided is not None:
        return decided
    examples = []
    for v in operands:
        if is_scalar(v):
            examples.append(v.example)
        elif type(v) in (int, float, bool):
            examples.append(v)
        elif type(v) is torch.SymInt:   # a size that is an unbacked symbol (len(arange(v)))
            examples.append(_EXAMPLES[int])
        else:
            raise Unsupported("data-dependent value", f"{op.__name__} of a value computed from "
                              f"a tensor and a {type(v).__name__}")
    try:
        kind = type(op(*examples))
    except ArithmeticError:
        raise Unsupported("data-dependent value", f"{op.__name__} of a value computed from a "
                          "tensor") from None
    if kind not in _EXAMPLES:
        raise Unsupported("data-dependent value", f"{op.__name__} gives a {kind.__name__}")
    node = builder.graph.call_function(op, tuple(
        v.node if is_scalar(v) else builder.size_nodes.node_for(v) if type(v) is torch.SymInt
        else v for v in operands))
    if symbolic is not None:
        builder.scalar_symbols[node] = symbolic
    return _make(builder, node, kind)


# Functions that make a tensor holding a Python number given as their only argument.
_LITERAL_TENSORS = {torch.tensor, torch.as_tensor}


def literal_index(t: TensorVar) -> int:
    """``t.__index__()`` (``items[torch.as_tensor(2)]``) of a tensor the graph made from a
    Python int that no operation has used since (so nothing changed it, or a view of it):
    that int, as torch.compile's fake tensors propagate such constants. The value of any
    other tensor is known only when the graph runs: a graph break."""
    node = t.node
    if node.op == "call_function" and node.target in _LITERAL_TENSORS and not node.users and \
            not node.kwargs and len(node.args) == 1 and type(node.args[0]) is int:
        return node.args[0]
    raise Unsupported("data-dependent value", "indexing a Python container with a tensor")


# -- unbacked symbols ------------------------------------------------------------------------

def symbol_of(builder, value):
    """A captured number as the ShapeEnv sees it: an unbacked SymInt or SymFloat for a
    ``.item()`` (bound to its node, so sizes made from it are computed by the graph), the
    same Python operators over those for arithmetic on it; Unsupported where the ShapeEnv
    has no such value (a bool ``.item()``)."""
    if not is_scalar(value):
        return value
    hit = builder.scalar_symbols.get(value.node)
    if hit is None:
        hit = builder.scalar_symbols[value.node] = _symbol_of_node(builder, value.node)
    return hit


def _symbol_of_node(builder, node):
    env = builder.unbacked_env()
    kind = type(node.meta["example_value"])
    if node.op == "call_method" and node.target == "item" and kind in (int, float):
        symbol = env.create_unbacked_symint() if kind is int else env.create_unbacked_symfloat()
        builder.size_nodes.bind(symbol.node.expr, node)
        return symbol
    if node.op != "call_function" or not (node.target in _KEPT or node.target in (int, float)):
        raise Unsupported("data-dependent value", f"{node.target} of a value computed from a "
                          "tensor has no symbolic form")
    operands = []
    for a in node.args:
        if isinstance(a, torch.fx.Node):
            a = builder.scalar_symbols.get(a) or _scalar_operand(builder, a)
        operands.append(a)
    try:
        return node.target(*operands)
    except Exception as e:   # int() of a SymFloat would need the value
        raise Unsupported("data-dependent value", f"{node.target} of a value computed from a "
                          f"tensor has no symbolic form ({type(e).__name__})") from None


def _scalar_operand(builder, node):
    """The symbol of an FX node that computes a captured number or a size."""
    if "example_value" in node.meta and type(node.meta["example_value"]) in (int, float, bool):
        return symbol_of(builder, ScalarVar(node, node.meta["example_value"], None))
    raise Unsupported("data-dependent value", f"{node.name} has no symbolic form")


def _symbolic(builder, op, operands):
    """``op`` over the operands' symbols where the capture has unbacked symbols already
    (elsewhere the ShapeEnv knows nothing of the values), else None."""
    if builder.fake_mode is None or builder.fake_mode.shape_env is None:
        return None
    try:
        return op(*(symbol_of(builder, v) for v in operands))
    except Unsupported:
        return None
    except Exception:   # noqa: BLE001 - the ShapeEnv cannot state it (a SymFloat ** ...)
        return None


def _decided(condition):
    """The Python bool of a comparison the ShapeEnv decides for every value the graph can
    see (``len(torch.arange(v)) == v``; ``v >= 0`` after ``torch._check(v >= 0)``), else
    None."""
    if type(condition) is bool:
        return condition
    if not isinstance(condition, torch.SymBool):
        return None
    from torch.fx.experimental.symbolic_shapes import statically_known_true
    if statically_known_true(condition):
        return True
    if statically_known_true(torch.sym_not(condition)):
        return False
    return None
