"""``max(a, b)`` / ``min(a, b)`` over one-element tensors, captured as ``torch.where``.

Python's ``max`` keeps the first largest item: for each next item it asks
``bool(item > best)`` and keeps that item if so (``min`` asks ``item < best``). Over tensors
each ``bool`` reads a value, a graph break. torch.compile turns the call into
``torch.maximum``/``torch.clamp`` instead, which differs from eager in several ways: NaN
propagates (eager keeps the first item when a comparison with NaN is False), a tie splits
the gradient in half, dtypes and shapes are promoted and broadcast (eager returns one of the
tensors as it is, and raises on a tensor of several elements), and the result is a new
tensor where eager returns one of the objects passed.

Here the choice is ``torch.where(item > best, item, best)``, eager's own comparison, which
yields the value eager yields (NaN included) when the items have one element and the same
shape, strides, dtype and device. It is a new tensor, where eager hands back one of the
items, so it is kept only where that cannot be seen, checked when the capture ends
(``first_unsound``): no item requires grad (the item not chosen would get a zero gradient
where eager gives it none), nothing written in place after the choice shares storage with
the result or the items, no item aliases an input of the graph while the result leaves it,
the result and an item do not both leave the graph, and no ``is``/dict key/C call used
which object one of them is. Otherwise the capture runs again with a graph break at the
call, and eager picks the object.

The alias analysis (``memory_roots``, ``may_write_into``) also serves ``output.py``: a
returned ``t.item()`` leaves the graph as ``t`` where nothing writes into ``t`` after.
"""
from __future__ import annotations

import math
import operator

import torch

from .breaks import Unsupported
from .graph import _mutates_arguments
from .values import TensorVar

# Operations whose result is always a new tensor (never a view of, nor the same object as,
# an argument). Any other operation may return an alias of its tensor arguments.
_NEW_TENSOR_FUNCTIONS = {
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
    operator.mod, operator.pow, operator.neg, operator.abs, operator.matmul,
    operator.lt, operator.le, operator.gt, operator.ge, operator.eq, operator.ne,
    torch.where, torch.add, torch.sub, torch.mul, torch.div, torch.sum, torch.mean,
    torch.prod, torch.amax, torch.amin, torch.maximum, torch.minimum, torch.abs, torch.neg,
    torch.exp, torch.log, torch.sin, torch.cos, torch.tanh, torch.sigmoid, torch.sqrt,
    torch.clone, torch.matmul,
}
_NEW_TENSOR_METHODS = {
    "add", "sub", "mul", "div", "sum", "mean", "prod", "amax", "amin", "abs", "neg", "exp",
    "log", "sin", "cos", "tanh", "sigmoid", "sqrt", "clone", "matmul", "norm",
}


class Selection:
    """One choice among tensors: the TensorVars of its result and of the items it chose
    from, their nodes then (an in-place operation later gives a TensorVar a new node), and
    the break to take at the call if the choice can be seen."""
    __slots__ = ("vars", "result_node", "item_nodes", "unsupported")

    def __init__(self, result, items, unsupported):
        self.vars = [result, *items]
        self.result_node = result.node
        self.item_nodes = [v.node for v in items]
        self.unsupported = unsupported


class Selections:
    """The choices a capture made with torch.where, checked when it ends."""

    def __init__(self):
        self._made: list[Selection] = []
        self._identity_used: set[int] = set()   # ids of the TensorVars involved

    def note_identity(self, values) -> None:
        """``values`` were used for which objects they are (tracer.identity_used)."""
        for v in values:
            if isinstance(v, TensorVar):
                self._identity_used.add(id(v))

    def choose(self, tracer, frame, which: str, items: list):
        """``max(items)``/``min(items)`` as a graph node, or None where the items are not
        one-element tensors of one layout (eager then decides, or raises its error)."""
        if not _same_one_element_layout(items):
            return None
        symbol = ">" if which == "max" else "<"
        best = items[0]
        for item in items[1:]:
            cond = frame.compare(symbol, item, best)
            best = tracer.builder.call("call_function", torch.where, (cond, item, best), {})
        self._made.append(Selection(best, list(items), _break_here(tracer, which)))
        return best

    def first_unsound(self, builder, outputs) -> Unsupported | None:
        """The break to take for the first choice that the rest of the capture can see
        (see the module docstring), or None."""
        if not self._made:
            return None
        nodes = list(builder.graph.nodes)
        roots = memory_roots(nodes)
        output_roots = [roots[t.node] for t in outputs if isinstance(t, TensorVar)]
        for sel in self._made:
            if self._visible(sel, nodes, roots, output_roots):
                return sel.unsupported
        return None

    def _visible(self, sel, nodes, roots, output_roots) -> bool:
        if any(id(v) in self._identity_used for v in sel.vars):
            return True
        result_roots = roots[sel.result_node]
        item_roots = frozenset().union(*(roots[n] for n in sel.item_nodes))
        after = nodes[nodes.index(sel.result_node) + 1:]
        if any(may_write_into(n, roots, result_roots | item_roots) for n in after):
            return True
        if not any(r & result_roots for r in output_roots):
            return False
        item_is_input = any(n.op in ("placeholder", "get_attr") for n in item_roots)
        return item_is_input or any(r & item_roots for r in output_roots)


def _same_one_element_layout(items) -> bool:
    if len(items) < 2 or not all(type(v) is TensorVar for v in items):
        return False
    first = items[0].fake
    for v in items:
        f = v.fake
        if not all(isinstance(d, int) for d in f.shape) or math.prod(f.shape) != 1:
            return False
        if (f.shape, f.stride(), f.dtype, f.device, f.layout) != \
                (first.shape, first.stride(), first.dtype, first.device, first.layout):
            return False
        if f.requires_grad:
            return False
    return True


def _break_here(tracer, which: str) -> Unsupported:
    """The break a failing check raises: located at the call, and at the root frame's
    instruction, as the interpreter would have marked it had the call broken at once."""
    u = Unsupported("data-dependent branch", f"{which}() over tensors compares values, and "
                    "the code uses which tensor it returned")
    frame = tracer.current_frame
    u.at(frame.code.co_filename, frame.current.lineno, frame.name)
    while frame.parent is not None:
        frame = frame.parent
    u.root_count, u.root_offset = frame.executed - 1, frame.current.offset
    return u


def memory_roots(nodes) -> dict:
    """For each node, the nodes whose memory its result may share: itself where it is a new
    tensor (or an input), else what its arguments share."""
    roots = {}
    for node in nodes:
        if node.op in ("placeholder", "get_attr") or _makes_new_tensor(node):
            roots[node] = frozenset((node,))
        else:
            shared = frozenset().union(*(roots.get(a, frozenset()) for a in node.all_input_nodes))
            roots[node] = shared or frozenset((node,))
    return roots


def _makes_new_tensor(node) -> bool:
    if "out" in node.kwargs:
        return False
    if node.op == "call_method":
        return node.target in _NEW_TENSOR_METHODS
    try:
        return node.op == "call_function" and node.target in _NEW_TENSOR_FUNCTIONS
    except TypeError:   # an unhashable target
        return False


def may_write_into(node, roots, memory) -> bool:
    """Whether ``node`` may write into a tensor sharing ``memory`` (a submodule call may:
    ``nn.ReLU(inplace=True)``)."""
    if node.op == "call_module":
        return any(roots[a] & memory for a in node.all_input_nodes)
    if not node.op.startswith("call"):
        return False
    if not (_mutates_arguments(node.target) or "out" in node.kwargs):
        return False
    return any(roots[a] & memory for a in node.all_input_nodes)
