"""A user ``torch.autograd.Function`` called in captured code: one operation of the graph
whose forward is the Function's captured forward and whose gradient is its captured backward.

``Fn.apply(*args)`` is captured in three steps:
1. ``Fn.forward(ctx, *args)`` is inlined with grad mode off (as eager's apply runs it), with
   ``FunctionCtx`` as ``ctx``: it records what forward saves, marks and stores.
2. ``Fn.backward(ctx, *grads)`` is inlined right after, given one tensor per output shaped
   like it, and ``ctx.saved_tensors`` the tensors forward saved.
3. Both regions move into subgraphs (``regions.extract``) and an operator of the
   ``tempa_fn`` library runs them (``function_op``): its implementation runs the forward
   subgraph, its registered autograd formula the backward one. Every backend sees one opaque
   operation (ATen calls it as an extern; its gradient is the user's, never autograd's
   derivative of the forward's operations).

Whatever the regions do that one operation cannot show (write a tensor they were given, a
side effect outside the call, ``mark_dirty``, forward-mode AD, a size or number read from
outside them) is a graph break where the Function is called: it then runs eagerly, as
today, with the reason said. Symbolic sizes of its tensors are fine: the operation's fake
kernel runs the forward subgraph on its fake inputs.
"""
from __future__ import annotations

import contextlib
import hashlib

import torch
import torch.fx as fx
from torch.autograd.function import once_differentiable

from . import regions
from .breaks import Unsupported
from .metainfo import MetaInfo
from .values import TensorVar

_ONCE_DIFFERENTIABLE_CODE = once_differentiable(lambda ctx: None).__code__

class FunctionCtx:
    """Capture's ``ctx`` of a user autograd Function: what its forward saves and marks (the
    tensors are TensorVars of the forward region). Its methods are called as they are
    (``MODELS``): they only record."""

    def __init__(self, needs_input_grad: tuple):
        self.needs_input_grad = needs_input_grad
        self.to_save: tuple = ()
        self.non_differentiable: list = []

    def save_for_backward(self, *tensors):
        if not all(t is None or isinstance(t, TensorVar) for t in tensors):
            raise Unsupported("autograd.Function", "ctx.save_for_backward of a non-tensor")
        self.to_save = tensors

    def mark_non_differentiable(self, *tensors):
        self.non_differentiable.extend(tensors)

    def set_materialize_grads(self, value):
        if value is not True:
            raise Unsupported("autograd.Function", "ctx.set_materialize_grads(False): the "
                              "backward would see None where capture traced a tensor")

    def mark_dirty(self, *tensors):
        raise Unsupported("autograd.Function", "ctx.mark_dirty: a Function writing its "
                          "inputs in place runs eagerly")

    def save_for_forward(self, *tensors):
        raise Unsupported("autograd.Function", "ctx.save_for_forward (forward-mode AD) runs eagerly")


def _as_is(method):
    def model(tracer, frame, args, kwargs):
        return method(*args, **kwargs)
    return model


MODELS = {m: _as_is(m) for m in (FunctionCtx.save_for_backward, FunctionCtx.mark_non_differentiable,
                                 FunctionCtx.set_materialize_grads, FunctionCtx.mark_dirty,
                                 FunctionCtx.save_for_forward)}


@contextlib.contextmanager
def _grad_mode(enabled: bool):
    before = torch.is_grad_enabled()
    torch._C._set_grad_enabled(enabled)
    try:
        yield
    finally:
        torch._C._set_grad_enabled(before)


def apply(tracer, frame, cls, args, kwargs):
    """``cls.apply(*args)``: the outputs of one ``tempa_fn`` operation (see the module)."""
    name = cls.__qualname__
    builder = tracer.builder
    if kwargs:
        raise Unsupported("autograd.Function", f"{name}.apply with keyword arguments")
    grad_on = torch.is_grad_enabled()
    needs = tuple(isinstance(a, TensorVar) and grad_on and a.fake.requires_grad for a in args)
    ctx = tracer.mark_internal(FunctionCtx(needs))
    writes = dict(tracer.side_effects.writes)

    forward_region = regions.Region(builder.graph)
    with _grad_mode(False):
        if _overrides(cls, "setup_context"):
            out = tracer.call(frame, tracer.load_attr(cls, "forward", frame), list(args), {})
            tracer.call(frame, tracer.load_attr(cls, "setup_context", frame),
                        [ctx, tuple(args), out], {})
        else:
            out = tracer.call(frame, tracer.load_attr(cls, "forward", frame), [ctx, *args], {})
    forward_nodes = forward_region.close()
    _check_region(tracer, writes, forward_nodes, f"{name}.forward")
    outs = _output_vars(out, name)
    _check_outputs(outs, forward_nodes, name)

    backward = tracer.load_attr(cls, "backward", frame)
    once = getattr(backward, "__code__", None) is _ONCE_DIFFERENTIABLE_CODE
    if once:
        backward = backward.__wrapped__
    grad_vars = [TensorVar(builder.graph.call_function(_grad_slot, (i,)), _like(builder, v.fake))
                 for i, v in enumerate(outs)]
    # one gradient per output, as eager passes them: None for an output that is no tensor
    slot_of = {id(v): g for v, g in zip(outs, grad_vars)}
    backward_args = [slot_of.get(id(v)) for v in (out if isinstance(out, tuple) else (out,))]
    ctx.saved_tensors = ctx.to_save
    backward_region = regions.Region(builder.graph)
    with _grad_mode(False):
        grads = tracer.call(frame, backward, [ctx, *backward_args], {})
    backward_nodes = backward_region.close()
    _check_region(tracer, writes, backward_nodes, f"{name}.backward")
    grads = _gradient_vars(grads, args, name)
    return _replace_by_operation(tracer, cls, args, out, outs, ctx, grad_vars, grads,
                                 forward_nodes, backward_nodes, once)


def _overrides(cls, name: str) -> bool:
    return getattr(cls, name) is not getattr(torch.autograd.Function, name)


def _grad_slot(index):
    """Stands for the gradient of output ``index`` while the backward is captured; its nodes
    never stay in a graph (the backward's region becomes a subgraph, these its inputs)."""
    raise AssertionError("a gradient slot of a captured autograd.Function was run")


def _like(builder, fake):
    """A value with ``fake``'s metadata that does not require grad (a gradient)."""
    if isinstance(fake, MetaInfo):
        return MetaInfo(fake.shape, fake.dtype, fake.device, False, fake.stride())
    with builder.fake_mode:
        return torch.empty_strided(fake.shape, fake.stride(), dtype=fake.dtype, device=fake.device)


def _check_region(tracer, writes_before: dict, nodes, what: str) -> None:
    regions.refuse_side_effects(tracer, writes_before, what)
    regions.refuse_outside_writes(nodes, what)


def _output_vars(out, name) -> list[TensorVar]:
    """The tensors forward returns (one, or a tuple of tensors and plain values)."""
    items = out if isinstance(out, tuple) else (out,)
    if any(isinstance(v, (list, dict)) for v in items):
        raise Unsupported("autograd.Function", f"{name}.forward returns a container")
    outs = [v for v in items if isinstance(v, TensorVar)]
    if not outs:
        raise Unsupported("autograd.Function", f"{name}.forward returns no tensor")
    if len({id(v) for v in outs}) != len(outs):
        raise Unsupported("autograd.Function", f"{name}.forward returns one tensor twice")
    return outs


def _check_outputs(outs, forward_nodes, name) -> None:
    """Each output is a new tensor of forward's own: an input handed back, or a view of
    one, is an alias of the caller's tensor in eager."""
    inside = set(forward_nodes)
    for v in outs:
        if regions.view_root(v.node, inside) is None:
            raise Unsupported("autograd.Function", f"{name}.forward returns one of its inputs "
                              "or a view of one")


def _gradient_vars(grads, args, name) -> list:
    grads = list(grads) if isinstance(grads, (tuple, list)) else [grads]
    if len(grads) != len(args):
        raise Unsupported("autograd.Function", f"{name}.backward returns {len(grads)} "
                          f"gradients for {len(args)} inputs (eager raises in backward)")
    for g, a in zip(grads, args):
        if g is not None and not (isinstance(g, TensorVar) and isinstance(a, TensorVar)):
            raise Unsupported("autograd.Function", f"{name}.backward returns a non-tensor "
                              "gradient")
    return grads


def _replace_by_operation(tracer, cls, args, out, outs, ctx, grad_vars, grads, forward_nodes,
                          backward_nodes, once):
    """Move both regions into subgraphs, define their operation and call it in their place.
    Operation inputs: the tensor arguments, then the other outside tensors either region
    reads. Outputs: forward's tensors, then the forward values backward reads (residuals)."""
    builder = tracer.builder
    graph = builder.graph
    forward_set = set(forward_nodes)
    slots = [g.node for g in grad_vars]
    grad_nodes = [g.node for g in grads if g is not None]
    backward_reads = [n for n in _dedupe(regions.free_inputs(backward_nodes) +
                                         [n for n in grad_nodes if n not in set(backward_nodes)])
                      if n not in slots]
    arg_nodes = [a.node for a in args if isinstance(a, TensorVar)]
    inputs = _dedupe(arg_nodes + regions.free_inputs(forward_nodes) +
                     [n for n in backward_reads if n not in forward_set])
    out_nodes = [v.node for v in outs]
    results = out_nodes + [n for n in _dedupe(backward_reads) if n in forward_set and n not in out_nodes]
    regions.tensor_inputs(inputs, f"{cls.__qualname__}.apply")
    regions.tensor_inputs(results, f"{cls.__qualname__}.backward")
    backward_gm = regions.extract(graph, backward_nodes, grad_nodes, slots + backward_reads)
    for slot in reversed(slots):
        graph.erase_node(slot)
    forward_gm = regions.extract(graph, forward_nodes, results, inputs)

    position = {n: i for i, n in enumerate(inputs)}
    reads = [("input", position[n]) if n in position else ("output", results.index(n))
             for n in backward_reads]
    # per argument, where its gradient (the next output of the backward subgraph) goes
    grad_targets = [position[a.node] if g is not None else None for a, g in zip(args, grads)]
    op = function_op(cls.__name__, forward_gm, backward_gm, FunctionPlan(
        n_outputs=len(outs), n_inputs=len(inputs), reads=tuple(reads),
        grad_targets=tuple(grad_targets), once_differentiable=once))
    input_vars = [_var_of(n, args) for n in inputs]
    new = builder.call("call_function", op, (input_vars,), {})
    non_diff = {id(v) for v in ctx.non_differentiable}
    replaced = {}
    for old, var in zip(outs, new[:len(outs)]):
        replaced[id(old)] = builder.call("call_method", "detach", (var,), {}) \
            if id(old) in non_diff else var
    if isinstance(out, tuple):
        return tuple(replaced.get(id(v), v) for v in out)
    return replaced[id(out)]


def _dedupe(nodes):
    return list(dict.fromkeys(nodes))


def _var_of(node, args):
    for a in args:
        if isinstance(a, TensorVar) and a.node is node:
            return a
    return TensorVar(node, node.meta["example_value"])


class FunctionPlan:
    """How a ``tempa_fn`` operation wires its subgraphs (all plain data, part of its name)."""

    def __init__(self, *, n_outputs, n_inputs, reads, grad_targets, once_differentiable):
        self.n_outputs = n_outputs               # forward's own tensors, first in the results
        self.n_inputs = n_inputs
        self.reads = reads                       # backward's inputs after the gradients
        self.grad_targets = grad_targets         # per tensor argument: its input index or None
        self.once_differentiable = once_differentiable

    def __repr__(self):
        return repr(sorted(vars(self).items()))




def function_op(name: str, forward_gm: fx.GraphModule, backward_gm: fx.GraphModule,
                plan: FunctionPlan):
    """The ``tempa_fn::<name>_<hash>(Tensor[] inputs) -> Tensor[]`` operation of these
    subgraphs. Its name is a hash of what it runs, so a graph that calls it (and a disk
    cache keyed by that graph's code) always means the same computation."""
    key = hashlib.sha256("\n".join((forward_gm.code, backward_gm.code, repr(plan),
                                    regions.python_targets(forward_gm),
                                    regions.python_targets(backward_gm))).encode()).hexdigest()[:16]
    qualified = f"{_identifier(name)}_{key}"
    if qualified in regions.OPERATIONS:
        return regions.OPERATIONS[qualified]
    library = regions.tempa_fn_library()
    library.define(f"{qualified}(Tensor[] inputs) -> Tensor[]")

    def forward(inputs):
        return list(forward_gm(*inputs))

    def fake(inputs):
        return regions.fake_results(forward_gm, inputs)

    def setup_context(ctx, inputs, output):
        (tensors,) = inputs
        ctx.save_for_backward(*tensors, *output)

    def backward(ctx, grads):
        saved = ctx.saved_tensors
        inputs, results = saved[:plan.n_inputs], saved[plan.n_inputs:]
        grads = [torch.zeros_like(r) if g is None else g
                 for g, r in zip(grads[:plan.n_outputs], results)]
        reads = [inputs[i] if kind == "input" else results[i] for kind, i in plan.reads]
        with torch.no_grad() if plan.once_differentiable else contextlib.nullcontext():
            computed = iter(backward_gm(*grads, *reads))
        input_grads = [None] * plan.n_inputs
        for target in plan.grad_targets:
            grad = next(computed) if target is not None else None
            if grad is not None:
                before = input_grads[target]
                input_grads[target] = grad if before is None else before + grad
        return input_grads

    library.impl(qualified, forward, "CompositeExplicitAutograd")
    torch.library.register_fake(f"tempa_fn::{qualified}", fake, lib=library)
    torch.library.register_autograd(f"tempa_fn::{qualified}", backward,
                                    setup_context=setup_context, lib=library)
    op = getattr(torch.ops.tempa_fn, qualified).default
    regions.OPERATIONS[qualified] = op
    return op


def _identifier(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)

