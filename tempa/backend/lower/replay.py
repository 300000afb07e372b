"""A traced functional graph replayed under a second recording: with its convolutions
channels-last for inference (``relayout_convolutions``), and with grad by the joint trace
(joint.py), each node through ``_replayed``."""
from __future__ import annotations

import math

import torch
import torch.fx as fx

from ..index import contiguous_strides
from . import nodynamo
from .layout import _in_traced_layout, _wants_channels_last, converts_convolutions
from .trace import (Traced, UntraceableGraph, _Recorder, _alias, _attention_for, graph_module,
                    rng_untouched)

aten = torch.ops.aten


def _replay(traced: "Traced", env: dict, relayout: bool) -> list:
    """Run ``traced.gm``'s nodes on the values of ``env`` (its placeholders bound) in each
    node's recorded grad mode; its outputs. ``relayout``: each convolution that
    ``_wants_channels_last`` gets channels-last input and weight (converted here, above
    autograd, so that autograd saves the converted tensors for convolution_backward), and
    the user outputs are given the strides the trace recorded for them."""
    for n in traced.gm.graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "get_attr":
            env[n] = getattr(traced.gm, n.target)
            continue
        if n.op == "output":
            outs = list(fx.node.map_arg(n.args[0], lambda a: env[a]))
            if relayout:
                for i, node in enumerate(n.args[0][:traced.num_outputs]):
                    outs[i] = _in_traced_layout(outs[i], node)
            return outs
        args = fx.node.map_arg(n.args, lambda a: env[a])
        kwargs = fx.node.map_arg(n.kwargs, lambda a: env[a])
        with torch.set_grad_enabled(n.meta.get("grad", True)):
            if relayout and _wants_channels_last(n):
                args = tuple(a.contiguous(memory_format=torch.channels_last) if i < 2 else a
                             for i, a in enumerate(args))
            if relayout and n.target in _READS_STORAGE and isinstance(n.args[0], fx.Node):
                args = (_storage_as_traced(args[0], n.args[0]),) + tuple(args[1:])
            if relayout and n.target in _VIEWS_OF_TRACED_LAYOUT and not kwargs:
                # a view the trace took of an eager-layout value (a CNN head's flatten of
                # its last feature map) may be no view of the channels-last value it has
                # now: reshape views where it can and copies contiguous where it cannot
                env[n] = aten.reshape.default(*args)
                continue
            env[n] = _replayed(n.target, args, kwargs)
    raise AssertionError("a graph without an output node")


_VIEWS_OF_TRACED_LAYOUT = {aten.view.default, aten._unsafe_view.default}

# Ops that address their input's storage (sizes, strides and offset name elements by their
# place in memory), so that on a channels-last value they would read other elements than
# the trace did: replayed on the value in its traced layout.
_READS_STORAGE = {aten.as_strided.default}


def _storage_as_traced(t, node):
    """``t`` in the strides ``node`` was traced with (a copy where they differ), for an op
    that addresses its storage; a value traced at a storage offset cannot be rebuilt so."""
    tm = node.meta.get("traced_meta")
    if tm is not None and tm.offset and isinstance(t, torch.Tensor) and tuple(t.stride()) != tuple(tm.stride):
        raise UntraceableGraph("as_strided of a value the relayout changed, at a storage offset")
    return _in_traced_layout(t, node)


def relayout_convolutions(traced: "Traced", inputs: list, decomps: dict) -> "Traced | None":
    """The inference graph ``traced`` replayed with its convolutions channels-last (see
    CONV_LAYOUTS), its user outputs in the strides ``traced`` gave them; None where it
    converts nothing."""
    if not converts_convolutions(traced.gm):
        return None
    graph = fx.Graph()
    rec = _Recorder(graph, decomps)
    env = {}
    phs = [n for n in traced.gm.graph.nodes if n.op == "placeholder"]
    for i, (n, t) in enumerate(zip(phs, inputs)):
        ph = graph.placeholder(f"arg{i}")
        c = _alias(t) if isinstance(t, torch.Tensor) else t
        if isinstance(c, torch.Tensor):
            rec.bind(c, ph)
        else:
            ph.meta["traced_meta"] = None
            ph.meta["value"] = c
        env[n] = c
    with _attention_for(traced.gm, inputs, differentiable=False), nodynamo.resolved(), rng_untouched(), rec:
        outs = _replay(traced, env, True)
    graph.output(tuple(rec.lookup(o) if isinstance(o, torch.Tensor) else o for o in outs))
    graph.eliminate_dead_code()
    root = torch.nn.Module()
    for k, v in rec.constants.items():
        setattr(root, k, v)
    res = Traced(graph_module(root, graph), traced.num_outputs, traced.mutated, dict(rec.constants),
                 traced.aliases)
    res.single = traced.single
    return res


class _Restride(torch.autograd.Function):
    """``x.as_strided(size, stride)`` where that leaves every element at its address (only
    strides of size-1 dims change: a fresh value made channels-last): its gradient is the
    incoming one, unchanged. Why: autograd's formula for as_strided scatters the gradient
    into a zeroed storage with ``copy_``, a write the functional backward refuses, so a
    Swin's training graph (its pooler's ``adaptive_avg_pool2d``) ran as ATen calls."""
    @staticmethod
    def forward(ctx, x, size, stride, offset):
        return x.as_strided(size, stride, offset)

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None


def _is_restride(x, size, stride, offset) -> bool:
    """``x.as_strided(size, stride, offset)`` keeps x's shape and every element's address."""
    return (tuple(size) == tuple(x.shape) and (offset is None or offset == x.storage_offset())
            and all(n == 1 or a == b for n, a, b in zip(size, stride, x.stride())))


def _is_reshape(x, size, stride, offset) -> bool:
    """``x.as_strided(size, stride, offset)`` of a contiguous ``x`` that is ``x.view(size)``:
    the same elements at the same addresses, contiguous in the new shape."""
    return (x.is_contiguous() and math.prod(size) == x.numel()
            and (offset is None or offset == x.storage_offset())
            and all(n == 1 or a == b for n, a, b in zip(size, stride, contiguous_strides(size))))


def _replayed(target, args, kwargs):
    """One node of the functional forward, replayed with grad by the joint trace. An
    ``as_strided`` that keeps every address (``_is_restride``) or is a reshape of a
    contiguous value (``_is_reshape``: a GroupNorm's decomposition flattens its
    statistics so) is replayed with a gradient that needs no ``copy_`` (see _Restride)."""
    if target is aten.as_strided.default and not kwargs:
        full = (*args, *[None] * (4 - len(args)))
        if _is_restride(*full):
            return _Restride.apply(*full)
        if _is_reshape(*full):
            return aten.view.default(args[0], list(args[1]))
    return target(*args, **kwargs)
