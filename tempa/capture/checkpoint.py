"""``torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)`` in captured code:
activation checkpointing, as one operation whose gradient recomputes the region.

``fn(*args)`` is inlined like any call (its guards, purity checks and breaks are the
interpreter's); the region it recorded moves into a subgraph (``regions.extract``) that a
``tempa_fn`` operation runs (``checkpoint_op``). That operation keeps for its backward only
its inputs (the arguments, and the outside tensors the region reads: parameters) and, with
``preserve_rng_state`` (the default), the random generators' states from before the region
ran. Its gradient is a second operation that restores those states, runs the subgraph again
with grad on and differentiates it: none of the region's intermediates is kept, and a
dropout inside draws the same mask again, as eager's checkpoint does. Every backend sees the
two operations whole, so the memory saving holds whatever compiles the graph.

Where eager keeps no activation anyway (grad mode off, no input requiring grad) the region
stays inlined: that is the plain call eager computes. It also stays the plain call where one
operation cannot stand for it (it returns an input or a view of one, or a nested structure;
it reads a size or number from outside; autocast, whose state the recomputation would have
to restore): the same
values and gradients without the saving, said on the ``graphs`` log. A region that writes a
tensor it was given or changes state outside the call is a graph break (eager's recomputation
does that a second time, in the backward): checkpoint then runs eagerly.
"""
from __future__ import annotations

import contextlib
import hashlib

import torch
import torch.fx as fx

from . import regions
from .metainfo import MetaInfo
from .values import TensorVar
from .. import logs

_log = logs.get("graphs")


def call(tracer, frame, fn, args: list, kwargs: dict, preserve_rng_state: bool):
    """``checkpoint(fn, *args, **kwargs)``: the region's outputs, computed by one operation
    that recomputes the region in its backward (see the module)."""
    builder = tracer.builder
    writes = dict(tracer.side_effects.writes)
    region = regions.Region(builder.graph)
    out = tracer.call(frame, fn, args, kwargs)
    if not torch.is_grad_enabled():
        return out                      # eager's checkpoint keeps nothing without grad
    nodes = region.close()
    what = "the function of torch.utils.checkpoint.checkpoint"
    regions.refuse_side_effects(tracer, writes, what)
    regions.refuse_outside_writes(nodes, what)
    inputs = regions.free_inputs(nodes)
    why_plain = _why_plain_call(out, nodes, inputs)
    if why_plain is not None:
        _log.info("tempa: torch.utils.checkpoint.checkpoint of %s is captured as the plain "
                  "call (its activations are kept): %s", getattr(fn, "__qualname__", fn), why_plain)
        return out
    if not any(n.meta["example_value"].requires_grad for n in inputs):
        return out                      # nothing to differentiate: nothing is kept
    outs = list(dict.fromkeys(regions.tensor_nodes(out)))
    sub = regions.extract(builder.graph, nodes, outs, inputs)
    devices = _cuda_devices(n.meta["example_value"] for n in inputs) if preserve_rng_state else None
    op = checkpoint_op(sub, len(outs), devices)
    results = builder.call("call_function", op,
                           ([TensorVar(n, n.meta["example_value"]) for n in inputs],), {})
    replaced = {}
    for node, var in zip(outs, results):
        # an output eager's region made without grad (detached, integer) gets none here too
        replaced[node] = var if node.meta["example_value"].requires_grad or \
            not var.fake.requires_grad else builder.call("call_method", "detach", (var,), {})
    return _rebuilt(out, replaced)


def _why_plain_call(out, nodes, inputs) -> str | None:
    """Why one operation cannot stand for the region, or None."""
    if any(torch.is_autocast_enabled(device) for device in ("cpu", "cuda")):
        return "autocast is on (its state is not restored for the recomputation)"
    if not all(isinstance(n.meta.get("example_value"), (torch.Tensor, MetaInfo)) for n in inputs):
        return "it reads a captured number"
    items = [out] if isinstance(out, TensorVar) else out if type(out) in (tuple, list) else None
    if items is None or any(isinstance(v, (tuple, list, dict)) for v in items):
        return "it returns something other than a tensor or a flat tuple or list"
    if not regions.tensor_nodes(out):
        return "it returns no tensor"
    roots = [regions.view_root(v.node, set(nodes)) for v in items if isinstance(v, TensorVar)]
    if None in roots or len(set(roots)) != len(set(regions.tensor_nodes(out))):
        return "it returns one of its inputs, a view of one, or views of one tensor (eager " \
               "returns those aliases)"
    return None


def _rebuilt(out, replaced: dict):
    if isinstance(out, TensorVar):
        return replaced[out.node]
    return type(out)(replaced[v.node] if isinstance(v, TensorVar) else v for v in out)


def _cuda_devices(fakes) -> tuple:
    """The CUDA devices whose generators the region may draw from (those of its inputs, as
    eager's checkpoint stashes); the CPU generator is always kept."""
    return tuple(sorted({f.device.index or 0 for f in fakes if f.device.type == "cuda"}))


def _rng_states(devices) -> list:
    return [torch.get_rng_state(), *(torch.cuda.get_rng_state(d) for d in devices)]


@contextlib.contextmanager
def _generators_as(states, devices):
    """The generators set to ``states`` for the block and put back after it (the
    recomputation draws the forward's numbers and leaves the backward's stream as it was)."""
    if devices is None:
        yield
        return
    with torch.random.fork_rng(devices=list(devices)):
        torch.set_rng_state(states[0])
        for device, state in zip(devices, states[1:]):
            torch.cuda.set_rng_state(state, device)
        yield


def checkpoint_op(sub: fx.GraphModule, n_out: int, devices):
    """``tempa_fn::checkpoint_<hash>(Tensor[] inputs) -> Tensor[]``: the region's outputs,
    then (``devices`` not None: preserve_rng_state) the generator states from before it
    ran. Its gradient is ``checkpoint_<hash>_backward(inputs, rng_states, grads, wanted)``,
    which recomputes the region and differentiates it for the inputs ``wanted`` says. Named
    by a hash of what they run, as ``autograd_function.function_op``."""
    key = hashlib.sha256("\n".join((sub.code, regions.python_targets(sub), repr(n_out),
                                    repr(devices))).encode()).hexdigest()[:16]
    name = f"checkpoint_{key}"
    if name in regions.OPERATIONS:
        return regions.OPERATIONS[name]
    library = regions.tempa_fn_library()
    library.define(f"{name}(Tensor[] inputs) -> Tensor[]")
    library.define(f"{name}_backward(Tensor[] inputs, Tensor[] rng_states, Tensor[] grads, "
                   "bool[] wanted) -> Tensor[]")
    state_sizes = [s.numel() for s in _rng_states(devices)] if devices is not None else []

    def forward(inputs):
        states = _rng_states(devices) if devices is not None else []
        return [*sub(*inputs), *states]

    def fake(inputs):
        return [*regions.fake_results(sub, inputs),
                *(torch.empty(n, dtype=torch.uint8) for n in state_sizes)]

    def gradients(inputs, states, grads, wanted, create_graph: bool):
        """The recomputed region's gradients for the ``wanted`` inputs. ``create_graph``: a
        double backward, differentiating through the real inputs (their history kept);
        else detached copies below the autograd keys (an operation's kernel)."""
        scope = contextlib.nullcontext() if create_graph else regions.autograd_dispatch()
        with scope, _generators_as(states, devices), torch.enable_grad():
            leaves = list(inputs) if create_graph else \
                [x.detach().requires_grad_(w) for x, w in zip(inputs, wanted)]
            outs = sub(*leaves)
            pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
            targets = [x for x, w in zip(leaves, wanted) if w]
            found = torch.autograd.grad([o for o, _ in pairs], targets, [g for _, g in pairs],
                                        allow_unused=True, create_graph=create_graph) \
                if pairs else [None] * len(targets)
        return [torch.zeros_like(x) if g is None else g for g, x in zip(found, targets)]

    def backward_impl(inputs, rng_states, grads, wanted):
        return gradients(inputs, rng_states, grads, wanted, create_graph=False)

    def backward_fake(inputs, rng_states, grads, wanted):
        return [torch.empty_like(x) for x, w in zip(inputs, wanted) if w]

    def setup_context(ctx, inputs, output):
        (tensors,) = inputs
        ctx.save_for_backward(*tensors, *output[n_out:])
        ctx.wanted = [t.requires_grad for t in tensors]
        ctx.output_metas = [(o.shape, o.dtype, o.device) for o in output[:n_out]]

    def backward(ctx, grads):
        saved = ctx.saved_tensors
        inputs, states = saved[:len(ctx.wanted)], saved[len(ctx.wanted):]
        grads = [torch.zeros(shape, dtype=dtype, device=device) if g is None else g
                 for g, (shape, dtype, device) in zip(grads[:n_out], ctx.output_metas)]
        if torch.is_grad_enabled():     # create_graph=True: the gradient has history
            computed = gradients(inputs, states, grads, ctx.wanted, create_graph=True)
        else:
            computed = getattr(torch.ops.tempa_fn, f"{name}_backward").default(
                inputs, states, grads, ctx.wanted)
        found = iter(computed)
        return [next(found) if w else None for w in ctx.wanted]

    return regions.register_with_backward(name, forward, fake, backward_impl, backward_fake,
                                          backward, setup_context)
