"""``torch.cond(pred, true_fn, false_fn, operands)`` in captured code.

A Python predicate (a bool or number, guarded by value where it entered the frame) picks
its branch at capture: that branch is inlined, as eager runs it. A tensor predicate is
decided when the graph runs: both branches are inlined, each moved into a subgraph
(``regions.extract``), and one ``tempa_fn`` operation runs the one the predicate picks.
Its gradient is a second operation that recomputes the picked branch and differentiates
it, so no backend ever sees the choice as Python it could bake in.

What one operation cannot show (a branch writing a tensor it was given, a side effect
outside the call, branches returning tensors of other shapes or types, a size or number
read from outside the branches) is a graph break at the call, with the reason. Symbolic
sizes of the operands are fine: the operation's fake kernel runs the branch on its fake
inputs, so its results have their sizes.
"""
from __future__ import annotations

import hashlib
import inspect

import torch

from . import regions
from .breaks import Unsupported, UserError
from .values import TensorVar


def cond(tracer, frame, args, kwargs):
    try:
        bound = inspect.signature(torch.cond).bind(*args, **kwargs).arguments
    except TypeError as e:
        raise UserError(e) from None
    pred, true_fn, false_fn = bound["pred"], bound["true_fn"], bound["false_fn"]
    operands = bound.get("operands", ())
    if not isinstance(operands, (tuple, list)):
        raise Unsupported("unsupported call", "torch.cond with operands that are no tuple or list")
    if isinstance(pred, (bool, int, float)):
        return tracer.call(frame, true_fn if pred else false_fn, list(operands), {})
    if not isinstance(pred, TensorVar) or not all(isinstance(o, TensorVar) for o in operands):
        raise Unsupported("unsupported call", "torch.cond with a predicate or operands other "
                          "than tensors and Python numbers")
    return _tensor_cond(tracer, frame, pred, true_fn, false_fn, list(operands))


def _tensor_cond(tracer, frame, pred, true_fn, false_fn, operands):
    builder = tracer.builder
    if tuple(pred.fake.shape) not in ((), (1,)):
        raise Unsupported("unsupported call", "torch.cond with a predicate of more than one element")
    writes = dict(tracer.side_effects.writes)
    branches = []
    for fn in (true_fn, false_fn):
        region = regions.Region(builder.graph)
        out = tracer.call(frame, fn, list(operands), {})
        nodes = region.close()
        regions.refuse_side_effects(tracer, writes, "a torch.cond branch")
        regions.refuse_outside_writes(nodes, "a torch.cond branch")
        branches.append((nodes, _outputs(out, nodes), out))
    (true_nodes, true_outs, structure), (false_nodes, false_outs, _) = branches
    metas = [_meta_of(v.fake) for v in true_outs]
    if metas != [_meta_of(v.fake) for v in false_outs]:
        raise Unsupported("unsupported call", "torch.cond's branches return tensors of other "
                          "shapes, strides or dtypes (eager's torch.cond refuses them)")
    inputs = list(dict.fromkeys([o.node for o in operands] + regions.free_inputs(true_nodes) +
                                regions.free_inputs(false_nodes)))
    input_vars = regions.tensor_inputs(inputs, "a torch.cond branch")
    true_gm = regions.extract(builder.graph, true_nodes, [v.node for v in true_outs], inputs)
    false_gm = regions.extract(builder.graph, false_nodes, [v.node for v in false_outs], inputs)
    op = cond_op(true_gm, false_gm)
    given = {o.node: o for o in operands}
    input_vars = [given.get(v.node, v) for v in input_vars]
    results = builder.call("call_function", op, (pred, input_vars), {})
    if isinstance(structure, TensorVar):
        return results[0]
    return type(structure)(results)


def _outputs(out, nodes) -> list[TensorVar]:
    outs = [out] if isinstance(out, TensorVar) else list(out) if isinstance(out, (tuple, list)) else None
    if not outs or not all(isinstance(v, TensorVar) for v in outs):
        raise Unsupported("unsupported call", "a torch.cond branch returns something other than "
                          "a tensor or a tuple/list of tensors")
    inside = set(nodes)
    if any(v.node not in inside for v in outs) or len({id(v) for v in outs}) != len(outs):
        raise Unsupported("unsupported call", "a torch.cond branch returns one of its operands "
                          "or one tensor twice")
    return outs


def _meta_of(fake) -> tuple:
    return tuple(fake.shape), tuple(fake.stride()), fake.dtype, fake.device




def cond_op(true_gm, false_gm):
    """``tempa_fn::cond_<hash>(Tensor pred, Tensor[] inputs) -> Tensor[]``: runs the branch
    ``pred`` picks; its gradient ``cond_<hash>_backward`` (same arguments, then the output
    gradients) recomputes that branch and differentiates it. Named by a hash of what they
    run, as ``autograd_function.function_op``."""
    key = hashlib.sha256("\n".join((true_gm.code, false_gm.code, regions.python_targets(true_gm),
                                    regions.python_targets(false_gm))).encode()).hexdigest()[:16]
    name = f"cond_{key}"
    if name in regions.OPERATIONS:
        return regions.OPERATIONS[name]
    library = regions.tempa_fn_library()
    library.define(f"{name}(Tensor pred, Tensor[] inputs) -> Tensor[]")
    library.define(f"{name}_backward(Tensor pred, Tensor[] inputs, Tensor[] grads) -> Tensor[]")

    def branch(pred):
        return true_gm if bool(pred) else false_gm

    def forward(pred, inputs):
        return list(branch(pred)(*inputs))

    def fake(pred, inputs):
        # the branches' results have the same metadata (checked at capture)
        return regions.fake_results(true_gm, inputs)

    def backward_impl(pred, inputs, grads):
        # an operation's kernel runs below the autograd keys: the recomputation turns them
        # back on, so autograd records the picked branch and differentiates it
        with regions.autograd_dispatch(), torch.enable_grad():
            leaves = [x.detach().requires_grad_(_differentiable(x)) for x in inputs]
            outs = branch(pred)(*leaves)
            pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad]
            wanted = [x for x in leaves if x.requires_grad]
            found = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs],
                                             allow_unused=True) if pairs else [None] * len(wanted))
        per_input = [next(found) if x.requires_grad else None for x in leaves]
        return [torch.zeros_like(x) if g is None else g for g, x in zip(per_input, leaves)]

    def backward_fake(pred, inputs, grads):
        return [torch.empty_like(i) for i in inputs]

    def setup_context(ctx, inputs, output):
        pred, tensors = inputs
        ctx.save_for_backward(pred, *tensors, *output)
        ctx.n_inputs = len(tensors)

    def backward(ctx, grads):
        pred, *saved = ctx.saved_tensors
        inputs, outputs = saved[:ctx.n_inputs], saved[ctx.n_inputs:]
        grads = [torch.zeros_like(o) if g is None else g for g, o in zip(grads, outputs)]
        computed = getattr(torch.ops.tempa_fn, f"{name}_backward").default(pred, inputs, grads)
        return None, [g if _differentiable(x) else None for g, x in zip(computed, inputs)]

    return regions.register_with_backward(name, forward, fake, backward_impl, backward_fake,
                                          backward, setup_context)


def _differentiable(t) -> bool:
    return t.is_floating_point() or t.is_complex()
