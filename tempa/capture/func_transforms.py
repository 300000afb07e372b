"""torch.func's transforms (``vmap``, ``grad``, ``grad_and_value``, ``jacrev``, ``jacfwd``)
of a Python function, in captured code.

``transform(func, **options)`` made during capture is a ``TransformedFunction``. Calling it
inlines ``func`` on stand-ins of its arguments (for ``vmap`` without the mapped dimension,
for the others as they are), so its guards, purity checks and breaks are the interpreter's;
the region it recorded moves into a subgraph (``regions.extract``) and one node of the
capture's graph runs the real transform over that subgraph. functorch then does on the fake
tensors what it does at run time (the node's metadata), and a backend tracing the graph to
ATen sees the transform's own batched or differentiated operations.

``torch.func.vjp(func, *primals)`` and ``torch.func.jvp(func, primals, tangents)`` capture
``func`` the same way. jvp is one node running the real jvp over the subgraph. vjp's outputs
are one node running the subgraph, and the ``vjp_fn`` it returns is a ``VjpFunction``: its
call is a node running the real vjp over the subgraph, so the outputs are computed again
there (nothing of the first node is kept for it). A tensor written in place between the two
(eager's vjp_fn reads the values of the vjp call) is a graph break at that call.

A ``func`` that writes a tensor it was given, changes outside state, returns something other
than tensors, or reads a size or number from outside is a graph break at the call, named.
"""
from __future__ import annotations

import inspect
import operator

import torch
import torch.fx as fx
import torch.func

from . import regions
from .breaks import Unsupported, UserError
from .graph import _mutates_arguments
from .metainfo import MetaInfo
from .values import TensorVar, contains_tensor

# transform -> (its name, whether the function sees its arguments without a batch dimension)
TRANSFORMS = {torch.func.vmap: ("vmap", True), torch.func.grad: ("grad", False),
               torch.func.grad_and_value: ("grad_and_value", False),
               torch.func.jacrev: ("jacrev", False), torch.func.jacfwd: ("jacfwd", False)}


class TransformedFunction:
    """``transform(func, **options)`` of a Python ``func``, made during capture; only the
    interpreter calls it (``call``)."""
    __slots__ = ("transform", "func", "options")

    def __init__(self, transform, func, options: dict):
        self.transform, self.func, self.options = transform, func, options

    def __call__(self, *args, **kwargs):
        raise Unsupported("unsupported call", "a torch.func transform made in captured code "
                          "called outside capture")


def model(transform):
    """The model of ``transform(func, ...)``: a TransformedFunction (no call yet)."""
    name, _ = TRANSFORMS[transform]

    def make(tracer, frame, args, kwargs):
        try:
            bound = inspect.signature(transform).bind(*args, **kwargs)
        except TypeError as e:
            raise UserError(e) from None
        bound.apply_defaults()
        options = dict(bound.arguments)
        func = options.pop("func")
        options.update(options.pop("kwargs", {}))
        if contains_tensor(list(options.values())):
            raise Unsupported("unsupported call", f"torch.func.{name} with tensor options")
        return tracer.mark_internal(TransformedFunction(transform, func, options))
    return make


def call(tracer, frame, fn: TransformedFunction, args, kwargs):
    """``fn(*args)``: one node running the transform over ``fn.func``'s captured subgraph."""
    name, batched = TRANSFORMS[fn.transform]
    if kwargs:
        raise Unsupported("unsupported call", f"a torch.func.{name} function called with keywords")
    dims = _in_dims(fn.options.get("in_dims", 0), len(args)) if batched else [None] * len(args)
    region = _capture(tracer, frame, fn.func, args, dims, batched, name)
    outs = _flat_outputs(region.out, name)
    sub = region.extract(tracer.builder, outs, name)
    runner = _runner(fn, sub, region.transformed, region.out, outs)
    result = tracer.builder.call("call_function", runner, (*args, *region.free), {})
    return _checked(result, name)


class _Captured:
    """``func`` inlined on stand-ins of its arguments (``_slot``), its nodes not yet moved
    out: ``out`` what it returned, ``transformed`` per argument whether it has a stand-in."""

    def __init__(self, nodes, out, slot_nodes, transformed):
        self.nodes, self.out = nodes, out
        self.slot_nodes, self.transformed = slot_nodes, transformed
        self.free: list[TensorVar] = []

    def extract(self, builder, outs: list[TensorVar], name: str) -> fx.GraphModule:
        """The subgraph ``(*stand-ins, *free) -> outs``; ``free`` the outside tensors it
        reads, as TensorVars of the capture's graph."""
        free = [n for n in regions.free_inputs(self.nodes) if n not in self.slot_nodes]
        self.free = regions.tensor_inputs(free, f"the function of torch.func.{name}")
        sub = regions.extract(builder.graph, self.nodes, [v.node for v in outs],
                              self.slot_nodes + free)
        for node in reversed(self.slot_nodes):
            builder.graph.erase_node(node)
        return sub


def _capture(tracer, frame, func, args, dims, batched: bool, name: str) -> _Captured:
    """Inline ``func`` on stand-ins of ``args`` (the transform's view of them) as a region
    one node can run: no outside state changed, no tensor it was given written."""
    builder = tracer.builder
    if any(isinstance(a, (list, tuple, dict)) and contains_tensor(a) for a in args):
        raise Unsupported("unsupported call", f"torch.func.{name} of tensors in containers")
    slots = [_slot(builder, a, d, batched) for a, d in zip(args, dims)]
    writes = dict(tracer.side_effects.writes)
    region = regions.Region(builder.graph)
    out = tracer.call(frame, func, slots, {})
    nodes = region.close()
    what = f"the function of torch.func.{name}"
    regions.refuse_side_effects(tracer, writes, what)
    regions.refuse_outside_writes(nodes, what)
    transformed = [isinstance(s, TensorVar) and s is not a for s, a in zip(slots, args)]
    return _Captured(nodes, out, [s.node for s, t in zip(slots, transformed) if t], transformed)


def _in_dims(in_dims, n: int) -> list:
    dims = list(in_dims) if isinstance(in_dims, (tuple, list)) else [in_dims] * n
    if len(dims) != n or not all(d is None or type(d) is int for d in dims):
        raise Unsupported("unsupported call", "torch.vmap with nested in_dims")
    return dims


def _slot(builder, arg, dim, batched):
    """What ``func`` sees of ``arg``: a tensor mapped over (vmap) or transformed (grad,
    jacrev: same metadata) is a stand-in node, a value passed as it is is itself."""
    if not isinstance(arg, TensorVar) or (batched and dim is None):
        return arg
    fake = arg.fake
    shape, stride = list(fake.shape), list(fake.stride())
    if batched:
        d = dim % len(shape) if shape else dim
        if not shape or not 0 <= d < len(shape):
            raise Unsupported("unsupported call", "torch.vmap of a dimension its tensor lacks")
        del shape[d], stride[d]
    if isinstance(fake, MetaInfo):
        example = MetaInfo(shape, fake.dtype, fake.device, False, stride)
    else:
        with builder.fake_mode:
            example = torch.empty_strided(shape, stride, dtype=fake.dtype, device=fake.device)
    return TensorVar(builder.graph.call_function(_argument_slot, ()), example)


def _argument_slot():
    """Stands for an argument of a transformed function while it is captured; these nodes
    become the placeholders of its subgraph and never stay in a graph."""
    raise AssertionError("an argument slot of a torch.func transform was run")


def _flat_outputs(out, name) -> list[TensorVar]:
    outs = [out] if isinstance(out, TensorVar) else list(out) if isinstance(out, tuple) else None
    if not outs or not all(isinstance(v, TensorVar) for v in outs):
        raise Unsupported("unsupported call", f"the function of torch.func.{name} returns "
                          "something other than a tensor or a tuple of tensors")
    return outs


def _runner(fn: TransformedFunction, sub, transformed: list, out, outs):
    """The node's target: ``runner(*args, *free)`` runs ``fn.transform(inner, **options)``
    on the arguments, ``inner`` calling the subgraph with the free tensors it read."""
    n_args, single = len(transformed), isinstance(out, TensorVar)
    transform, options = fn.transform, fn.options

    def run_transformed(*values):
        args, free = values[:n_args], values[n_args:]

        def inner(*inner_args):
            slots = [a for a, t in zip(inner_args, transformed) if t]
            results = sub(*slots, *free)
            return results[0] if single else tuple(results)
        return transform(inner, **options)(*args)
    return run_transformed


def _checked(result, name):
    items = result if isinstance(result, tuple) else (result,)
    if not all(isinstance(v, TensorVar) for v in items):
        raise Unsupported("unsupported call", f"torch.func.{name} returned nested values")
    return result


def _bound(fn, args, kwargs) -> dict:
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        raise UserError(e) from None
    bound.apply_defaults()
    return bound.arguments


def _tensors(values, what: str) -> list[TensorVar]:
    if not isinstance(values, (tuple, list)) or not all(isinstance(v, TensorVar) for v in values):
        raise Unsupported("unsupported call", f"torch.func.{what} of primals or tangents other "
                          "than tensors (a tuple of tensors for jvp)")
    return list(values)


def _output_and_aux(out, has_aux, name):
    """(the differentiated output, aux) of what ``func`` returned."""
    if not isinstance(has_aux, bool):
        raise Unsupported("unsupported call", f"torch.func.{name} with a has_aux that is no bool")
    if not has_aux:
        return out, None
    if not isinstance(out, tuple) or len(out) != 2:
        raise Unsupported("unsupported call", f"the function of torch.func.{name} with "
                          "has_aux=True returns something other than a pair")
    return out


def _structured(values: list, like):
    """``values`` (one per tensor of ``like``) as ``like`` held them: one tensor, or a tuple."""
    return values[0] if isinstance(like, TensorVar) else tuple(values)


def _as_list(result) -> list:
    return list(result) if isinstance(result, tuple) else [result]


class VjpFunction:
    """The ``vjp_fn`` of a ``torch.func.vjp`` call in captured code; only the interpreter
    calls it (``call_vjp``). ``graph_before``: the capture's nodes when vjp was called."""
    __slots__ = ("sub", "primals", "free", "output", "graph_before")

    def __init__(self, sub, primals, free, output, graph_before):
        self.sub, self.primals, self.free, self.output = sub, primals, free, output
        self.graph_before = graph_before

    def __call__(self, *args, **kwargs):
        raise Unsupported("unsupported call", "a torch.func.vjp function made in captured code "
                          "called outside capture")


def vjp(tracer, frame, args, kwargs):
    """``torch.func.vjp(func, *primals, has_aux=False)``: ``(output, vjp_fn[, aux])``."""
    bound = _bound(torch.func.vjp, args, kwargs)
    primals = _tensors(bound["primals"], "vjp")
    region = _capture(tracer, frame, bound["func"], primals, [None] * len(primals), False, "vjp")
    output, aux = _output_and_aux(region.out, bound["has_aux"], "vjp")
    outs = _flat_outputs(output, "vjp")
    aux_outs = _flat_outputs(aux, "vjp") if aux is not None else []
    builder = tracer.builder
    sub = region.extract(builder, outs + aux_outs, "vjp")
    values = _as_list(builder.call("call_function", _subgraph_runner(sub),
                                   (*primals, *region.free), {}))
    vjp_fn = tracer.mark_internal(VjpFunction(sub, primals, region.free, output,
                                              set(builder.graph.nodes)))
    result = (_structured(values[:len(outs)], output), vjp_fn)
    return result + (_structured(values[len(outs):], aux),) if aux is not None else result


def _subgraph_runner(sub):
    def run_function(*values):
        return tuple(sub(*values))
    return run_function


def call_vjp(tracer, frame, fn: VjpFunction, args, kwargs):
    """``vjp_fn(cotangents)``: one node running the real vjp over the subgraph."""
    builder = tracer.builder
    if kwargs or len(args) != 1:
        raise Unsupported("unsupported call", "a torch.func.vjp function called with other "
                          "arguments than the cotangents")
    (cotangents,) = args
    single = isinstance(fn.output, TensorVar)
    cts = [cotangents] if single else cotangents
    if not isinstance(cts, (tuple, list)) or not all(isinstance(c, TensorVar) for c in cts) or \
            len(cts) != len(_flat_outputs(fn.output, "vjp")):
        raise Unsupported("unsupported call", "a torch.func.vjp function given cotangents "
                          "that are not shaped as the outputs")
    if any(_writes(node) for node in builder.graph.nodes if node not in fn.graph_before):
        raise Unsupported("unsupported call", "a torch.func.vjp function called after a tensor "
                          "was written in place (eager's reads the values of the vjp call)")
    runner = _vjp_runner(fn.sub, len(fn.primals), len(fn.free), len(cts), single)
    result = builder.call("call_function", runner, (*fn.primals, *fn.free, *cts), {})
    return tuple(_as_list(result))


def _writes(node: fx.Node) -> bool:
    return _mutates_arguments(node.target) or node.meta.get("returns_argument", False) or \
        node.target is operator.setitem


def _vjp_runner(sub, n_primals: int, n_free: int, n_outputs: int, single: bool):
    def run_vjp(*values):
        primals, free = values[:n_primals], values[n_primals:n_primals + n_free]
        cotangents = values[n_primals + n_free:]

        def inner(*inner_primals):
            results = sub(*inner_primals, *free)[:n_outputs]
            return results[0] if single else tuple(results)
        _, vjp_fn = torch.func.vjp(inner, *primals)
        return tuple(vjp_fn(cotangents[0] if single else tuple(cotangents)))
    return run_vjp


def jvp(tracer, frame, args, kwargs):
    """``torch.func.jvp(func, primals, tangents, strict=False, has_aux=False)``: one node
    running the real jvp over ``func``'s subgraph: ``(output, jvp_out[, aux])``."""
    bound = _bound(torch.func.jvp, args, kwargs)
    primals, tangents = _tensors(bound["primals"], "jvp"), _tensors(bound["tangents"], "jvp")
    strict, has_aux = bound["strict"], bound["has_aux"]
    if not isinstance(strict, bool) or len(primals) != len(tangents):
        raise Unsupported("unsupported call", "torch.func.jvp with primals and tangents of "
                          "other lengths, or a strict that is no bool")
    region = _capture(tracer, frame, bound["func"], primals, [None] * len(primals), False, "jvp")
    output, aux = _output_and_aux(region.out, has_aux, "jvp")
    outs = _flat_outputs(output, "jvp")
    aux_outs = _flat_outputs(aux, "jvp") if aux is not None else []
    builder = tracer.builder
    sub = region.extract(builder, outs + aux_outs, "jvp")
    runner = _jvp_runner(sub, len(primals), len(outs), isinstance(output, TensorVar),
                         isinstance(aux, TensorVar) if aux is not None else None, strict)
    values = _as_list(builder.call("call_function", runner,
                                   (*primals, *tangents, *region.free), {}))
    n = len(outs)
    result = (_structured(values[:n], output), _structured(values[n:2 * n], output))
    return result + (_structured(values[2 * n:], aux),) if aux is not None else result


def _jvp_runner(sub, n_primals: int, n_outputs: int, single: bool, single_aux, strict: bool):
    """``single_aux``: None without aux, else whether aux is one tensor."""
    def run_jvp(*values):
        primals, tangents = values[:n_primals], values[n_primals:2 * n_primals]
        free = values[2 * n_primals:]

        def inner(*inner_primals):
            results = sub(*inner_primals, *free)
            out = results[0] if single else tuple(results[:n_outputs])
            if single_aux is None:
                return out
            aux = results[n_outputs:]
            return out, aux[0] if single_aux else tuple(aux)
        found = torch.func.jvp(inner, primals, tangents, strict=strict,
                               has_aux=single_aux is not None)
        return tuple(t for part in found
                     for t in ((part,) if isinstance(part, torch.Tensor) else part))
    return run_jvp


MODELS = {torch.func.vjp: vjp, torch.func.jvp: jvp}
