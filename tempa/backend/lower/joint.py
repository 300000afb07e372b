"""The joint forward/backward graph and its partition into a forward and a backward graph.

The joint graph (for autograd) replays the functional forward graph on tensors that require
grad, then records what ``torch.autograd.grad`` runs. Nodes recorded before the backward
marker are the forward; everything after is the backward; forward values the backward reads
are the saved tensors (a "default partition").
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.fx as fx

from . import nodynamo
from .core import TRANSCENDENTAL
from .layout import _CHANNELS_LAST_BACKWARD, _grad_in_input_layout, converts_convolutions
from .replay import _replay
from .trace import (Traced, UntraceableGraph, _Recorder, _alias, graph_module, rng_untouched,
                    trace_forward)

aten = torch.ops.aten


@dataclass
class Joint:
    fw: fx.GraphModule      # inputs -> (outputs..., mutated..., saved...)
    bw: fx.GraphModule      # (saved..., tangents...) -> grads for inputs needing grad
    num_outputs: int
    mutated: list
    num_saved: int
    saved_inputs: list      # input indices the backward reads directly (not via fw outputs)
    grad_inputs: list       # input index of each bw output
    diff_outputs: list      # which user outputs get a tangent
    constants: dict
    single: bool = False    # the user's function returned one tensor, not a tuple
    # the torch-level graph over the same inputs: a double backward recomputes it eagerly
    recompute: object = None
    graph: fx.Graph = None  # the recorded joint graph fw and bw were partitioned from
    aliases: list = None    # the forward trace's OutputAlias per user output (Traced.aliases)
    # the user outputs that get autograd history: diff_outputs, and those eager gives history
    # although no input's value reaches them in the ATen trace (``_outputs_with_history``)
    history_outputs: list = None
    # the inputs eager's backward reaches from those outputs with history but no tangent,
    # where it gives a zero gradient and the compiled backward none (``_reached_without_tangent``)
    zero_grad_inputs: list = None

    def __str__(self):
        """The joint graph, what the partition saved, and the two graphs (tempa_info.trace())."""
        outs = next(n for n in self.fw.graph.nodes if n.op == "output").args[0]
        saved = [str(n) for n in outs[len(outs) - self.num_saved:]]
        return (f"joint graph:\n{self.graph.python_code('self').src.strip()}\n\n"
                f"saved for backward: {self.num_saved} forward values {saved}, inputs {self.saved_inputs}\n"
                f"gradients for inputs {self.grad_inputs}; outputs with a tangent {self.diff_outputs}\n\n"
                f"forward:\n{self.fw.code.strip()}\n\nbackward:\n{self.bw.code.strip()}")


# Composite ops whose own derivative is cheaper than differentiating their decomposition:
# the joint trace replays a forward in which these are still whole, so autograd calls their
# backward formula (itself decomposed as it is recorded). Why: log_softmax decomposes into
# x - amax - log(sum(exp(x - amax))), and autograd through that sends a gradient into amax
# (ties counted, a zero that is computed): on a GPT's 8192 x 50304 logits the cross-entropy
# backward made five passes over the rows, storing an fp32 copy in between, where
# _log_softmax_backward_data needs one (grad - exp(out) * sum(grad)). Likewise softmax,
# logsumexp, layer norm (mean and rstd saved), GELU and SiLU (only their input saved).
# Batch norm in training likewise: through its decomposition autograd recomputed the batch
# mean from the input (var's derivative) and wrote the gradient of x_hat as a full-size
# buffer in between, three reductions and two pointwise passes a BatchNorm, where
# native_batch_norm_backward reads the saved mean and invstd: one kernel of two sums over
# (grad, input), then one pointwise pass (ResNet-50's backward on a GPU is bound by them).
# Group norm too: its decomposition's derivative wrote a copy_ into the recorded backward,
# which sent a whole GroupNorm training graph's backward to eager ATen calls.
# flip, hypot, fmin, fmax, remainder and copysign decompose into prims ops autograd has no formula
# for (prims.rev, prims.fmin, ...): a training graph holding one ran eagerly as a whole.
# The hard activations are kept whole for a different reason, their kinks: they decompose
# into clamp, whose gradient passes at the bounds (and at NaN) where eager's own backward
# passes none (hardtanh_backward is zero at x <= min_val and x >= max_val, so ReLU6 at
# exactly 0 and 6; hardsigmoid's at x = +-3; hardswish's is 0 at -3 and 1 at 3).
KEEP_WHOLE_FOR_AUTOGRAD = frozenset({aten._softmax, aten._log_softmax, aten.logsumexp,
                                     aten.native_layer_norm, aten.gelu, aten.silu,
                                     aten.native_batch_norm, aten._native_batch_norm_legit_functional,
                                     aten.native_group_norm,
                                     aten.flip, aten.hypot, aten.fmin, aten.fmax, aten.remainder,
                                     aten.copysign,
                                     aten.hardtanh, aten.hardsigmoid, aten.hardswish})


def trace_training(gm: fx.GraphModule, inputs: list, decomps: dict, conv_layout: str = "eager") -> Joint:
    """The joint forward/backward graph of ``gm``: trace a forward that keeps the ops of
    KEEP_WHOLE_FOR_AUTOGRAD whole, then replay it with grad (``trace_joint``), its
    convolutions in ``conv_layout`` (see CONV_LAYOUTS)."""
    forward_decomps = {op: fn for op, fn in decomps.items()
                       if op.overloadpacket not in KEEP_WHOLE_FOR_AUTOGRAD}
    traced = trace_forward(gm, inputs, forward_decomps, differentiable=True)
    joint = trace_joint(traced, inputs, decomps, conv_layout)
    joint.single = traced.single
    joint.aliases = traced.aliases
    joint.history_outputs = _outputs_with_history(gm, joint)
    joint.zero_grad_inputs = _reached_without_tangent(gm, inputs, joint)
    return joint


def _reached_without_tangent(gm: fx.GraphModule, inputs: list, joint: Joint) -> list:
    """The inputs that eager's backward reaches from the outputs with history but no tangent
    (``_outputs_with_history``): their gradient through those is zero, a zero tensor in
    eager, where the compiled backward computes none. Found by differentiating the
    torch-level graph on fake copies of the inputs, only where such outputs exist; none
    where that cannot run."""
    extra = [i for i in joint.history_outputs if i not in joint.diff_outputs]
    if not extra or not joint.grad_inputs:
        return []
    from torch._subclasses.fake_tensor import FakeTensorMode
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    try:
        with mode, torch.enable_grad(), rng_untouched():
            copies = [mode.from_tensor(t.detach()).requires_grad_(t.requires_grad)
                      if isinstance(t, torch.Tensor) else t for t in inputs]
            out = gm(*copies)
            outs = list(out) if isinstance(out, (tuple, list)) else [out]
            targets = [outs[i] for i in extra if outs[i].requires_grad]
            grads = torch.autograd.grad(targets, [copies[i] for i in joint.grad_inputs],
                                        [torch.ones_like(t) for t in targets], allow_unused=True)
    except Exception:  # noqa: BLE001 - fake tensors cannot run it: the compiled answer stands
        return []
    return [i for i, g in zip(joint.grad_inputs, grads) if g is not None]


def _outputs_with_history(gm: fx.GraphModule, joint: Joint) -> list:
    """The user outputs that get autograd history: those with a tangent, and those whose
    torch-level value requires grad although no input's value reaches them in the ATen
    trace. Eager's history follows the torch ops: ``torch.func.jvp`` of a linear function
    returns a tangent that autograd recorded (requires_grad, a grad_fn), which the decomposed
    graph computes from constants alone (``jacfwd``, ``hessian`` of a quadratic likewise).
    Their gradient is zero: the backward gives them no tangent. The torch-level answer is
    the example value capture recorded for each output (the torch ops run on fake tensors);
    a graph without them (torch.fx tracing) keeps the ATen trace's answer."""
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    nodes = list(out) if isinstance(out, (tuple, list)) else [out]
    eager = {i for i, n in enumerate(nodes[:joint.num_outputs]) if isinstance(n, fx.Node) and
             getattr(n.meta.get("example_value"), "requires_grad", False)}
    return sorted(set(joint.diff_outputs) | eager)


def trace_joint(traced: Traced, inputs: list, decomps: dict, conv_layout: str = "eager") -> Joint:
    """Replay the functional forward with grad, then record the backward. ``conv_layout``
    "channels_last": the replay converts convolution arguments (``relayout``), the backward
    gives convolution_backward a channels-last gradient, the user outputs keep the forward
    trace's (eager's) strides and each gradient its input's layout, as AccumulateGrad
    gives ``.grad`` (``_grad_in_input_layout``)."""
    relayout = conv_layout == "channels_last" and converts_convolutions(traced.gm)
    graph = fx.Graph()
    rec = _Recorder(graph, {**decomps, **_CHANNELS_LAST_BACKWARD} if relayout else decomps)
    clones = []
    for i, t in enumerate(inputs):
        c = _alias(t)
        if isinstance(t, torch.Tensor) and t.requires_grad:
            c.requires_grad_(True)
        clones.append(c)
        ph = graph.placeholder(f"arg{i}")
        if isinstance(c, torch.Tensor):
            rec.bind(c, ph)
        else:
            ph.meta["traced_meta"] = None
    env = {}
    phs = [n for n in traced.gm.graph.nodes if n.op == "placeholder"]
    for n, c in zip(phs, clones):
        env[n] = c
    with nodynamo.resolved(), rng_untouched(), rec:
        outs = _replay(traced, env, relayout)
        user = outs[: traced.num_outputs]
        # A new value for a mutated input may carry grad (BatchNorm's running mean is made
        # from the batch mean); eager updates it outside autograd, and so does the forward
        # graph. Only an input that itself requires grad cannot be mutated.
        for i in traced.mutated:
            if isinstance(clones[i], torch.Tensor) and clones[i].requires_grad:
                raise UntraceableGraph("an input that requires grad is mutated in place")
        diff = [i for i, o in enumerate(user) if isinstance(o, torch.Tensor) and o.requires_grad]
        grad_inputs = [i for i, c in enumerate(clones) if isinstance(c, torch.Tensor) and c.requires_grad]
        # Looked up before the backward runs: a no-op cast there (x.to(float32) of a float32
        # x returns x) binds the output tensor to a backward node.
        out_nodes = [rec.lookup(o) if isinstance(o, torch.Tensor) else o for o in outs]
        rec.backward_started = True
        rec.strict_functional = True
        tangents = []
        for k, i in enumerate(diff):
            t = torch.zeros_like(user[i], memory_format=torch.contiguous_format)
            ph = graph.placeholder(f"tangent{k}")
            rec.bind(t, ph)
            tangents.append(t)
        # Why the engine directly: torch.autograd.grad's argument checks import sympy (~2 s
        # cold) as soon as grad_outputs are given; our tangents match by construction.
        from torch.autograd.variable import Variable
        grads = Variable._execution_engine.run_backward(
            tuple(user[i] for i in diff), tuple(tangents), False, False,
            tuple(clones[i] for i in grad_inputs), True, False)
        if relayout:
            grads = [_grad_in_input_layout(g, clones[i]) for g, i in zip(grads, grad_inputs)]
        grad_nodes = [rec.lookup(g) if g is not None else None for g in grads]
    # Partition: forward = nodes recorded before the marker; saved = forward values read by
    # backward nodes (or returned as gradients directly).
    fw_nodes = [n for n in graph.nodes if n.op != "placeholder" and not n.meta.get("bw")]
    input_phs = [n for n in graph.nodes if n.op == "placeholder" and not n.name.startswith("tangent")]
    tangent_phs = [n for n in graph.nodes if n.op == "placeholder" and n.name.startswith("tangent")]
    # Walk back from the gradients. Backward nodes are live; views/aliases/constants of the
    # forward are recomputed in the backward (free, and each saved tensor is one more
    # allocation per training call); any other forward value reached is saved.
    live_bw, needed = set(), set()

    def walk(stack):
        while stack:
            n = stack.pop()
            if n in live_bw or n in needed:
                continue
            if n.op == "placeholder":
                needed.add(n)
            elif n.meta.get("bw") or n.op == "get_attr" or _free_view(n):
                live_bw.add(n)
                stack.extend(n.all_input_nodes)
            else:
                needed.add(n)
    walk([g for g in grad_nodes if g is not None])
    _recompute_pointwise(fw_nodes, needed, live_bw, set(out_nodes), walk)
    saved = [n for n in fw_nodes if n in needed]
    saved_inputs = [i for i, p in enumerate(input_phs) if p in needed]
    for n in saved:
        if n.meta.get("traced_meta") is None:
            raise UntraceableGraph(f"backward reads a non-tensor forward value {n.format_node()}")
    fw = _subgraph(graph, input_phs, fw_nodes, out_nodes + saved, rec.constants)
    bw_inputs = [input_phs[i] for i in saved_inputs] + saved + tangent_phs
    bw_body = _backward_order(graph, live_bw)
    bw = _subgraph(graph, bw_inputs, bw_body, grad_nodes, rec.constants)
    return Joint(fw, bw, traced.num_outputs, traced.mutated, len(saved), saved_inputs,
                 grad_inputs, diff, dict(rec.constants), graph=graph)


def _backward_order(graph, live_bw) -> list:
    """The backward's nodes, each forward value it recomputes placed just before its first
    backward user. Why: in graph order every recomputed value comes first, where only saved
    inputs exist, so the GPU scheduler put a GPT's recomputed values of all layers into one
    launch at the backward's start (63 pointers at 4 layers), all alive until their layer's
    turn; placed at first use, each joins the kernels of its own layer."""
    order, done = [], set()

    def emit(node):
        stack = [(node, False)]
        while stack:
            n, inputs_done = stack.pop()
            if n in done:
                continue
            if inputs_done:
                done.add(n)
                order.append(n)
                continue
            stack.append((n, True))
            stack.extend((a, False) for a in reversed(n.all_input_nodes)
                         if a in live_bw and a not in done)

    for n in graph.nodes:
        if n in live_bw and n.meta.get("bw"):
            emit(n)
    for n in graph.nodes:                 # recomputed values only the outputs read
        if n in live_bw:
            emit(n)
    return order


def _recompute_pointwise(fw_nodes, needed, live_bw, user_outputs, walk):
    """Recompute a saved pointwise value in the backward when what it is computed from costs
    less memory to keep (and nothing random is recomputed).

    Why: the backward of a decomposed op reads its intermediates. GELU under autocast saved
    four float32 (rows, 4*d) tensors per layer, where its bfloat16 input (half of one) is
    enough: ~100 MB written in the forward and read back in the backward, per layer, on a
    GPT-124M step. The cost of keeping an input is itself the cheaper of saving it and
    recomputing it (``keep``), so a chain whose every step is the same size (log_softmax's
    x.float() - amax - log(sum), 4 bytes per logit each) is recomputed from its bf16 start.
    Strictly less: a swap of equal size gains nothing, and made a residual stream (x + a,
    with x kept) recomputed layer after layer at the backward's start."""
    def nbytes(n):
        tm = n.meta.get("traced_meta")
        if n in user_outputs or n.op == "placeholder" and tm is None:
            return 0                      # kept anyway (returned to the caller, or a scalar)
        if tm is None:
            return None
        try:
            count = 1
            for d in tm.shape:
                count *= int(d)
            return count * tm.dtype.itemsize
        except (TypeError, ValueError):
            return None

    def via_inputs(n, memo):
        """Bytes to keep so that ``n`` can be recomputed from its inputs (None: it cannot)."""
        total = 0
        for a in n.all_input_nodes:
            k = keep(a, memo)
            if k is None:
                return None
            total += k
        return total

    def recompute_cost(n, memo):
        """Bytes to keep to recompute pointwise ``n``, when less than saving it; else None."""
        own = nbytes(n)
        if own is None or not _pure_pointwise(n) or getattr(n.meta.get("traced_meta"), "offset", 0):
            return None                   # (an offset: a view into another buffer, saved)
        if _costly_on_cpu(n):
            return None
        via = via_inputs(n, memo)
        return via if via is not None and via < own else None

    def keep(n, memo):
        """Bytes to keep in the forward so that ``n`` is available in the backward."""
        if n in needed or n in live_bw or n in user_outputs:
            return 0
        if n not in memo:
            memo[n] = None                # (a DAG: only guards against surprises)
            if _free_view(n):
                memo[n] = via_inputs(n, memo)     # a view costs what its base costs
            else:
                via = recompute_cost(n, memo)
                memo[n] = nbytes(n) if via is None else via
        return memo[n]

    def recompute(n, memo):
        needed.discard(n)
        live_bw.add(n)
        for a in n.all_input_nodes:
            # (a value returned to the caller costs nothing to keep, but the backward still
            # needs it saved, or recomputed: walk decides, as for any other input)
            if a in needed or a in live_bw:
                continue
            if recompute_cost(a, memo) is not None:
                recompute(a, memo)
            else:
                walk([a])                 # saved (or a view: recomputed from its saved base)

    for n in reversed(fw_nodes):
        if n in needed and n not in user_outputs:
            memo: dict = {}
            if recompute_cost(n, memo) is not None:
                recompute(n, memo)


# On the CPU a saved value is never recomputed through a TRANSCENDENTAL op (core.py): it
# costs more to recompute than to keep. Why: a transformer's GELU output (the input of the
# next Linear, materialised in the forward anyway) was recomputed in the backward from the
# GELU's input, which the GELU's own backward keeps: free in bytes, but an erf over
# (tokens, 4 * d) per layer, 1.2-1.6 ms of DistilBERT's training step per layer. Eager keeps
# that value (the Linear saves its input). On a GPU the same recompute is memory traffic
# saved, and the arithmetic is free.
def _costly_on_cpu(n) -> bool:
    tm = n.meta.get("traced_meta")
    return (tm is not None and getattr(tm.device, "type", None) == "cpu"
            and getattr(n.target, "overloadpacket", None) in TRANSCENDENTAL)


def _pure_pointwise(n) -> bool:
    op = n.target
    if n.op != "call_function" or not isinstance(op, torch._ops.OpOverload):
        return False
    tags = op.tags
    if torch.Tag.nondeterministic_seeded in tags or torch.Tag.inplace_view in tags:
        return False
    # clone is tagged pointwise, but it exists to copy (a layout change, a value kept from
    # a later in-place write): recomputing it reads its source at backward time
    return op is not aten.clone.default and (torch.Tag.pointwise in tags or op in _CASTS)


_CASTS = {aten._to_copy.default, aten.to.dtype}


def _free_view(n) -> bool:
    """A forward node the backward recomputes for free: a view, or a cast to the dtype its
    input already has (``x.to(torch.float32)`` of a float32 ``x`` is ``x`` itself in eager).
    Why the cast: BatchNorm's derivative saves its input as ``input.to(float32)``; saved as
    a value of its own, a float32 activation was copied in the forward (a write and a read
    of the whole tensor a BatchNorm) to keep what the convolution's output already holds."""
    if n.op != "call_function":
        return False
    if n.target in _RECOMPUTE:
        return True
    if n.target in _CASTS and n.args and isinstance(n.args[0], fx.Node):
        mine, src = n.meta.get("traced_meta"), n.args[0].meta.get("traced_meta")
        return (mine is not None and src is not None and mine.dtype == src.dtype
                and tuple(mine.stride) == tuple(src.stride) and mine.device == src.device
                and not mine.offset and not src.offset)
    return False


_RECOMPUTE = {aten.t.default, aten.permute.default, aten.view.default, aten.detach.default,
              aten.alias.default, aten.expand.default, aten.transpose.int, aten.unsqueeze.default,
              aten.squeeze.dim, aten.squeeze.dims, aten._unsafe_view.default}


def _subgraph(graph, inputs, body, outputs, constants) -> fx.GraphModule:
    g = fx.Graph()
    env = {}
    for i, n in enumerate(inputs):
        env[n] = g.placeholder(f"in{i}")
        env[n].meta.update(n.meta)
    for n in body:
        if n in env:
            continue
        env[n] = g.node_copy(n, lambda a: env[a])
        env[n].meta.update(n.meta)
    g.output(tuple(env[o] if isinstance(o, fx.Node) else o for o in outputs))
    g.eliminate_dead_code()
    root = torch.nn.Module()
    for k, v in constants.items():
        setattr(root, k, v)
    return graph_module(root, g)
