"""torch.func's transforms (``vmap``, ``grad``, ``grad_and_value``, ``jacrev``, ``jacfwd``)
of a Python function, in captured code.

``transform(func, **options)`` made during capture is a ``TransformedFunction``. Calling it
inlines ``func`` on stand-ins of its arguments (for ``vmap`` without the mapped dimension,
for the others as they are), so its guards, purity checks and breaks are the interpreter's;
the region it recorded moves into a subgraph (``regions.extract``) and one node of the
capture's graph runs the real transform over that subgraph. functorch then does on the fake
tensors what it does at run time (the node's metadata), and a backend tracing the graph to
ATen sees the transform's own batched or differentiated operations.

A ``func`` that writes a tensor it was given, changes outside state, returns something other
than tensors, or a capture with symbolic sizes is a graph break at the call, named.
"""
from __future__ import annotations

import inspect

import torch
import torch.func

from . import regions
from .breaks import Unsupported, UserError
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
    builder = tracer.builder
    if kwargs:
        raise Unsupported("unsupported call", f"a torch.func.{name} function called with keywords")
    if builder.sizes is not None:
        raise Unsupported("unsupported call", f"torch.func.{name} with symbolic sizes runs eagerly")
    if any(isinstance(a, (list, tuple, dict)) and contains_tensor(a) for a in args):
        raise Unsupported("unsupported call", f"torch.func.{name} of tensors in containers")
    dims = _in_dims(fn.options.get("in_dims", 0), len(args)) if batched else [None] * len(args)
    slots = [_slot(builder, a, d, batched) for a, d in zip(args, dims)]
    writes = dict(tracer.side_effects.writes)
    region = regions.Region(builder.graph)
    out = tracer.call(frame, fn.func, slots, {})
    nodes = region.close()
    what = f"the function of torch.func.{name}"
    regions.refuse_side_effects(tracer, writes, what)
    regions.refuse_outside_writes(nodes, what)
    outs = _flat_outputs(out, name)
    slot_nodes = [s.node for s, a in zip(slots, args) if s is not a]
    inputs = slot_nodes + [n for n in regions.free_inputs(nodes) if n not in slot_nodes]
    sub = regions.extract(builder.graph, nodes, [v.node for v in outs], inputs)
    for node in reversed(slot_nodes):
        builder.graph.erase_node(node)
    free = [TensorVar(n, n.meta["example_value"]) for n in inputs[len(slot_nodes):]]
    runner = _runner(fn, sub, [isinstance(s, TensorVar) and s is not a for s, a in zip(slots, args)],
                     out, outs)
    result = builder.call("call_function", runner, (*args, *free), {})
    return _checked(result, name)


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
