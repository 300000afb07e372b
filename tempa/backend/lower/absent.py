"""The backward graph of a training graph for calls in which some outputs get no gradient.

Why: autograd hands a node no gradient for an output the loss does not use: an LM head's
logits when the model also returns its loss, the KV cache a decoder returns. An
``autograd.Function`` materializes a zero tensor for each by default, and tempa's backward
then read it: GPT-2's ``zeros(1, 64, 50257)`` cost ~14 ms a training step (a fresh 12.9 MB
with its page faults, then an add that only copied). Eager has no such tensor: its engine
passes an undefined gradient, which every backward formula skips, and a node that no
gradient reaches does not run.

``without_tangents`` is that rule applied to the compiled backward's ATen graph: each absent
tangent is a symbolic zero (``_Zero``), and a node that reads one is folded the way eager's
formulas skip an undefined gradient:
- a zero stays zero through an op that is linear in it (views, casts, sums, ``neg``, the
  backward formulas of ``_ZERO_IF_FIRST``, which take the gradient first) or that multiplies
  by it (``mul``, ``mm``, a ``div`` of it);
- ``add(zero, x)`` is ``x`` (eager's engine only adds two gradients when both exist), and
  ``sub(zero, x)`` is ``neg(x)``, where the sum would have ``x``'s shape, dtype and layout;
- a gradient that stays zero is no gradient (None), as eager gives an input that no
  gradient reaches.
Any other op reading a zero gets a real zero tensor (``aten.zeros``): the value the
materialized tangent gave, so correctness never depends on the tables.

The result takes the backward's inputs less the absent tangents. autograd.py compiles one
such graph per pattern of absent outputs, on the first call that has it.
"""
from __future__ import annotations

import operator

import torch
import torch.fx as fx

from ..index import contiguous_strides
from .trace import TracedMeta, graph_module

aten = torch.ops.aten
prims = torch.ops.prims


class _Zero:
    """A value that is zero by construction: an absent tangent, or what only absent tangents
    reach. ``node``: the node of the full backward it stands for (its metadata); None for
    a tuple-valued op (its ``getitem`` users are zeros with their own metadata)."""
    __slots__ = ("node",)

    def __init__(self, node):
        self.node = node


def _packets(*names):
    """The overloads of the ATen ops ``names`` this torch has."""
    out = set()
    for name in names:
        op = getattr(aten, name, None)
        for overload in (op.overloads() if op is not None else ()):
            out.add(getattr(op, overload))
    return frozenset(out)


# Zero where their first argument is: views and copies of it, reductions over it, products
# and quotients of it, and the backward formulas that are linear in the gradient they take
# first. (A zero divisor is not folded: it is materialized.)
_ZERO_IF_FIRST = _packets(
    "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "unsqueeze",
    "squeeze", "slice", "select", "alias", "detach", "as_strided", "narrow", "unfold",
    "diagonal", "split", "split_with_sizes", "unbind", "chunk", "clone", "contiguous",
    "_to_copy", "to", "neg", "sum", "mean", "cumsum", "flip", "roll", "repeat",
    "index_select", "gather", "index", "_unsafe_index", "mul", "div", "true_divide",
    "gelu_backward", "silu_backward", "threshold_backward", "tanh_backward",
    "sigmoid_backward", "_log_softmax_backward_data", "_softmax_backward_data",
    "native_layer_norm_backward", "native_group_norm_backward", "native_batch_norm_backward",
    "embedding_dense_backward", "slice_backward", "select_backward", "nll_loss_backward",
    "nll_loss2d_backward", "native_dropout_backward", "hardtanh_backward",
    "hardsigmoid_backward", "hardswish_backward", "leaky_relu_backward", "elu_backward",
    "softplus_backward", "mse_loss_backward", "convolution_backward",
    "max_pool2d_with_indices_backward", "avg_pool2d_backward", "_adaptive_avg_pool2d_backward",
    "upsample_nearest2d_backward", "upsample_bilinear2d_backward",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_efficient_attention_backward",
    "_scaled_dot_product_flash_attention_backward",
) | {prims.convert_element_type.default}

# Zero where either factor is.
_ZERO_IF_ANY = _packets("mul", "mm", "bmm", "matmul", "mv", "dot", "outer")


def without_tangents(bw: fx.GraphModule, absent: set) -> fx.GraphModule:
    """``bw`` (inputs: the saved values, then one tangent per differentiable output;
    outputs: one gradient per input needing one) for calls where the inputs at positions
    ``absent`` (tangents) are not given: they are dropped from its inputs and folded away.
    A gradient folded to zero becomes None."""
    g = fx.Graph()
    env: dict = {}
    made: dict = {}        # id(_Zero) -> its materialized zeros node

    def real(v):
        """``v`` as a node of the new graph (a zero becomes aten.zeros)."""
        if not isinstance(v, _Zero):
            return v
        if id(v) not in made:
            made[id(v)] = _materialize(g, v.node)
        return made[id(v)]

    k = 0
    for n in bw.graph.nodes:
        if n.op == "placeholder":
            if k in absent:
                env[n] = _Zero(n)
            else:
                env[n] = g.placeholder(n.name)
                env[n].meta.update(n.meta)
            k += 1
        elif n.op == "output":
            outs = n.args[0]
            g.output(tuple(None if isinstance(env.get(o), _Zero) else
                           (env[o] if isinstance(o, fx.Node) else o) for o in outs))
        else:
            args = fx.node.map_arg(n.args, env.__getitem__)
            kwargs = fx.node.map_arg(n.kwargs, env.__getitem__)
            folded = _fold(g, n, args, kwargs) if _has_zero((args, kwargs)) else None
            if folded is None:
                args = fx.node.map_aggregate(args, real)
                kwargs = fx.node.map_aggregate(kwargs, real)
                folded = g.create_node(n.op, n.target, args, kwargs, n.name)
                folded.meta.update(n.meta)
            env[n] = folded
    g.eliminate_dead_code()
    return graph_module(bw, g)


def _has_zero(a) -> bool:
    found = []
    fx.node.map_aggregate(a, lambda v: found.append(v) if isinstance(v, _Zero) else v)
    return bool(found)


def _fold(g: fx.Graph, n: fx.Node, args, kwargs):
    """What node ``n`` is when some of its arguments are zeros: a _Zero, a node of the new
    graph, or None (then it is computed on materialized zeros)."""
    op = n.target
    if op is operator.getitem:
        return _Zero(n) if isinstance(args[0], _Zero) else None
    if op in _ZERO_IF_ANY and any(isinstance(a, _Zero) for a in args[:2]):
        return _Zero(n)
    if op in _ZERO_IF_FIRST and args and isinstance(args[0], _Zero):
        return _Zero(None if n.meta.get("traced_meta") is None else n)
    if op in (aten.add.Tensor, aten.sub.Tensor, aten.rsub.Tensor):
        return _fold_sum(g, n, args, kwargs)
    if op is aten.where.self and _zeroish(args[1]) and _zeroish(args[2]):
        return _Zero(n)
    if op is aten.cat.default and all(isinstance(a, _Zero) for a in args[0]):
        return _Zero(n)
    # scattered into zeros (nll_loss's and embedding's backward, decomposed): zero
    if op in _SCATTERS and _zeroish(args[0]) and isinstance(args[_SCATTERS[op]], _Zero):
        return _Zero(n)
    if op in (aten.new_zeros.default, aten.zeros_like.default) and isinstance(args[0], _Zero):
        return _zeros_from(g, n, args, kwargs)
    return None


# the scatters of a value into a tensor: the position of that value
_SCATTERS = {aten.scatter_add.default: 3, aten.index_put.default: 2,
             aten._unsafe_index_put.default: 2, aten.index_add.default: 3}


def _zeroish(v) -> bool:
    """A zero: absent, or a constant zero of the new graph (``where(mask, g, 0)``: the
    masked gradient of an absent ``g`` is absent too)."""
    if isinstance(v, _Zero):
        return True
    if not isinstance(v, fx.Node) or v.op != "call_function":
        return False
    op, a = v.target, v.args
    return (op in (aten.zeros.default, aten.zeros_like.default, aten.new_zeros.default) or
            (op is aten.scalar_tensor.default and a[0] == 0) or
            (op in (aten.full.default, aten.full_like.default) and a[1] == 0) or
            (op is aten.new_full.default and a[2] == 0))


def _zeros_from(g, n, args, kwargs):
    """``new_zeros(zero, size)`` / ``zeros_like(zero)``: a zero constant that reads only its
    argument's dtype and device, made without materializing that argument."""
    tm = n.meta.get("traced_meta")
    if tm is None:
        return None
    z = g.call_function(aten.zeros.default, (list(tm.shape),),
                        {"dtype": tm.dtype, "device": tm.device, "pin_memory": False})
    z.meta.update(n.meta)
    return z


def _fold_sum(g, n, args, kwargs):
    """add/sub with a zero term: the other term (negated for ``0 - x``) where the result
    has its metadata (no broadcast, promotion or other layout), else None."""
    if n.target not in (aten.add.Tensor, aten.sub.Tensor, aten.rsub.Tensor) or len(args) > 3 \
            or set(kwargs) - {"alpha"}:
        return None
    alpha = args[2] if len(args) > 2 else kwargs.get("alpha", 1)
    a, b = args[:2]
    if n.target is aten.rsub.Tensor:
        a, b = b, a                       # rsub(x, y, alpha) = y - alpha * x
    za, zb = isinstance(a, _Zero), isinstance(b, _Zero)
    if za and zb:
        return _Zero(n)
    other = a if zb else b
    if not isinstance(other, fx.Node) or not _same_meta(other, n):
        return None
    if zb:
        return other                      # x + 0, x - 0
    if alpha != 1:
        return None
    if n.target is aten.add.Tensor:
        return other                      # 0 + x
    neg = g.call_function(aten.neg.default, (other,))   # 0 - x
    neg.meta.update(n.meta)
    return neg


def _same_meta(new: fx.Node, old: fx.Node) -> bool:
    a, b = new.meta.get("traced_meta"), old.meta.get("traced_meta")
    return (a is not None and b is not None and tuple(a.shape) == tuple(b.shape) and
            tuple(a.stride) == tuple(b.stride) and a.offset == b.offset and
            a.dtype == b.dtype and a.device == b.device)


def _materialize(g: fx.Graph, old: fx.Node) -> fx.Node:
    """A zero tensor with ``old``'s shape and dtype (contiguous: every op that reaches here
    reads values, not strides; views of a zero stay symbolic)."""
    tm = old.meta.get("traced_meta") if old is not None else None
    if tm is None:
        raise ValueError(f"tempa: no metadata to materialize a zero for {old}")
    shape = tuple(tm.shape)
    z = g.call_function(aten.zeros.default, (list(shape),),
                        {"dtype": tm.dtype, "device": tm.device, "pin_memory": False})
    z.meta.update(old.meta)
    z.meta["traced_meta"] = TracedMeta(shape, contiguous_strides(shape), 0, tm.dtype, False, tm.device)
    return z
