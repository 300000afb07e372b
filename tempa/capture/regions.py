"""Regions of a capture moved into graphs of their own: the subgraphs of higher-order
constructs (a user autograd Function's forward and backward).

A construct's body is inlined into the capture's graph like any other call, so its guards,
purity checks and graph breaks are those of the interpreter; the nodes it recorded are then
moved out into a separate ``fx.GraphModule`` whose inputs are the outside values they read
(``extract``). What runs the subgraph (an operator of ``tempa_fn``, ``function_ops``)
becomes one node in the capture's graph.
"""
from __future__ import annotations

import operator
import types

import torch
import torch.fx as fx

from .breaks import Unsupported
from .graph import _mutates_arguments, _name
from .metainfo import MetaInfo
from .values import TensorVar


class Region:
    """The nodes recorded from here on, up to ``close``. Placeholders (a parameter or global
    tensor first read inside) stay inputs of the capture's graph."""

    def __init__(self, graph: fx.Graph):
        self.graph = graph
        self.before = set(graph.nodes)
        self.nodes: list[fx.Node] = []

    def close(self) -> list[fx.Node]:
        self.nodes = [n for n in self.graph.nodes if n not in self.before and n.op != "placeholder"]
        for node in self.nodes:
            if node.op not in ("call_function", "call_method"):
                raise Unsupported("unsupported call", f"a {node.op} node inside a subgraph")
        return self.nodes


def tensor_nodes(value) -> list[fx.Node]:
    """The nodes of the TensorVars in ``value`` (nested tuples/lists), in order."""
    if isinstance(value, TensorVar):
        return [value.node]
    if isinstance(value, (tuple, list)):
        return [n for v in value for n in tensor_nodes(v)]
    return []


def free_inputs(nodes: list[fx.Node]) -> list[fx.Node]:
    """The outside nodes the region's nodes read, in the order of first use."""
    inside, free = set(nodes), {}
    for node in nodes:
        for arg in node.all_input_nodes:
            if arg not in inside:
                free.setdefault(arg, None)
    return list(free)


def refuse_side_effects(tracer, writes_before: dict, what: str) -> None:
    """A region must leave the capture's recorded writes to outside objects as they were
    (``writes_before``, a copy taken when it began): its subgraph runs where eager runs
    it, while the entry replays recorded writes after the whole graph."""
    writes = tracer.side_effects.writes
    if len(writes) != len(writes_before) or any(writes_before.get(k) is not v
                                                for k, v in writes.items()):
        raise Unsupported("unsupported call", f"{what} changes state outside the call")


def refuse_outside_writes(nodes: list[fx.Node], what: str) -> None:
    """A region that writes a tensor it did not make (an argument, a parameter) changes the
    caller's state in a way its subgraph, run as one operation, would not show (eager's
    ``ctx.mark_dirty`` protocol); writes into its own tensors are plain values."""
    inside = set(nodes)
    for node in nodes:
        if _mutates_arguments(node.target) or node.target is operator.setitem or \
                node.meta.get("returns_argument"):
            written = node.args[0] if node.args else None
            if isinstance(written, fx.Node) and written not in inside:
                raise Unsupported("unsupported call", f"{what} writes a tensor it was given "
                                  f"in place ({_name(node.target)})")


def extract(graph: fx.Graph, nodes: list[fx.Node], outputs: list[fx.Node],
            inputs: list[fx.Node]) -> fx.GraphModule:
    """Move ``nodes`` out of ``graph`` into a GraphModule with one placeholder per node of
    ``inputs`` (in that order; every outside node the region reads must be one) that returns
    ``outputs`` as a tuple. The moved nodes must have no users left outside the region."""
    sub = fx.Graph()
    env = {}
    for i, node in enumerate(inputs):
        env[node] = sub.placeholder(f"in{i}")
        env[node].meta = dict(node.meta)
    for node in nodes:
        env[node] = sub.node_copy(node, lambda n: env[n])
    sub.output(tuple(env[n] for n in outputs))
    inside = set(nodes)
    for node in reversed(nodes):
        if any(user not in inside for user in node.users):
            raise Unsupported("unsupported call", "a value made inside a subgraph is used "
                              "outside it")
        graph.erase_node(node)
    return fx.GraphModule(torch.nn.Module(), sub)


def tensor_inputs(inputs: list[fx.Node], what: str) -> list[TensorVar]:
    """The subgraph's inputs as TensorVars of the capture's graph: an operation takes tensors
    only, so a size or number it reads from outside (a symbolic size) is a graph break."""
    if not all(isinstance(n.meta.get("example_value"), (torch.Tensor, MetaInfo)) for n in inputs):
        raise Unsupported("unsupported call", f"{what} reads a size or number computed outside it")
    return [TensorVar(n, n.meta["example_value"]) for n in inputs]


def fake_results(gm: fx.GraphModule, inputs) -> list:
    """The fake-tensor kernel of an operation running ``gm``: ``gm`` itself on the fake
    inputs, so the results' sizes are those of these inputs (symbolic ones too) and their
    strides those the real kernel gives. A result that is an input, or a view of one, is a
    copy of it, as the real kernel's result is for the caller (an operation's results are new
    tensors)."""
    return [_fresh(r, inputs) for r in gm(*inputs)]


def _fresh(result, inputs):
    storage = result.untyped_storage()
    if any(storage._cdata == x.untyped_storage()._cdata for x in inputs):
        return result.clone()
    return result


# Tensor methods and functions whose result shares its argument's storage: a region
# returning one of an input is a view of it in eager, which one operation cannot hand back.
_VIEWS = {"view", "view_as", "reshape", "reshape_as", "transpose", "t", "permute", "narrow",
          "expand", "expand_as", "select", "squeeze", "unsqueeze", "flatten", "unflatten",
          "unbind", "split", "chunk", "as_strided", "detach", "diagonal", "movedim", "real",
          "imag", "__getitem__", "getitem", "contiguous", "unfold", "swapaxes", "mT", "T"}


def view_root(node: fx.Node, inside: set):
    """The node of ``inside`` (a region's nodes) whose memory ``node`` views, ``node``
    itself if it is no view; None where that memory is outside the region (an input)."""
    while node in inside and _is_view(node):
        node = node.args[0] if node.args and isinstance(node.args[0], fx.Node) else None
    return node if node in inside else None


def _is_view(node: fx.Node) -> bool:
    target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return target in _VIEWS


_AUTOGRAD_KEYS = (torch._C.DispatchKey.ADInplaceOrView, torch._C.DispatchKey.AutogradFunctionality)


def autograd_dispatch():
    """A dispatch-key scope where autograd runs again: an operation's kernel runs below the
    autograd keys, and a kernel that recomputes a subgraph to differentiate it needs them."""
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in _AUTOGRAD_KEYS:
        exclude = exclude.remove(key)
    return torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude)


def python_targets(gm: fx.GraphModule) -> str:
    """The Python callables a subgraph calls that its code names only by ``__name__`` (part
    of the name of the operation that runs it)."""
    return ",".join(f"{id(n.target)}" for n in gm.graph.nodes
                    if n.op == "call_function" and isinstance(n.target, types.FunctionType))


# The operators that run captured subgraphs (autograd_function, cond, custom_ops), in one
# torch.library namespace; each is named by a hash of what it runs and defined once.
_LIBRARY = None
OPERATIONS: dict[str, object] = {}


def register_with_backward(name: str, forward, fake, backward_impl, backward_fake,
                           backward, setup_context):
    """Register ``tempa_fn::name`` and its gradient op ``tempa_fn::name_backward`` (both
    defined already), their kernels and fakes, and the autograd formula joining them; the
    forward op, also kept in OPERATIONS."""
    library = tempa_fn_library()
    library.impl(name, forward, "CompositeExplicitAutograd")
    library.impl(f"{name}_backward", backward_impl, "CompositeExplicitAutograd")
    torch.library.register_fake(f"tempa_fn::{name}", fake, lib=library)
    torch.library.register_fake(f"tempa_fn::{name}_backward", backward_fake, lib=library)
    torch.library.register_autograd(f"tempa_fn::{name}", backward, setup_context=setup_context,
                                    lib=library)
    op = getattr(torch.ops.tempa_fn, name).default
    OPERATIONS[name] = op
    return op


def tempa_fn_library() -> torch.library.Library:
    """The ``tempa_fn`` library, made on first use."""
    global _LIBRARY
    if _LIBRARY is None:
        _LIBRARY = torch.library.Library("tempa_fn", "FRAGMENT")
    return _LIBRARY
