"""The autograd variant: a compiled forward whose outputs' history leads to the compiled backward.

Why not AOTAutograd's runtime: its wrappers cost tens of microseconds per call, more than a
small model's whole budget. Two ways to the same graph, the first where it is available:

- tempa's native autograd node (runtime/nativeautograd.py): one C++ call collects the
  inputs' edges, runs the compiled forward and sets the outputs' history to a
  ``torch::autograd::Node`` whose ``apply`` calls ``backward_of_held`` below. It also checks
  the versions of the inputs the backward reads and frees its saved values after a backward
  without ``retain_graph``, as eager does (~3 µs less per call than the Function).
- an ``autograd.Function`` (until that extension is built, or where it cannot be): ``apply``
  is the C-level ``_FunctionBase.apply``, skipping the Python ``Function.apply`` shim.
  Saved tensors that are not outputs are kept as plain ctx attributes (cheaper than
  ``save_for_backward``; they are fresh buffers nobody else can modify); saved outputs go
  through ``save_for_backward`` to avoid a reference cycle through ``grad_fn``. Under CUDA
  graphs (``graph_calls``) every saved tensor goes through ``save_for_backward``: autograd
  then drops them after the backward, and the forward's next replay need not copy them away.

Double backward (``create_graph=True``: Hessians, gradient penalties): the compiled backward
reads raw buffers and returns gradients without history, which would make every second
derivative zero. When the backward runs with grad mode on, it instead recomputes the
torch-level graph from the forward's inputs (both ways keep them all) with eager ATen
ops and differentiates that with ``create_graph``, so the gradient is eager's, history
included. The compiled backward still runs once as a check: a recomputation that does not
reproduce its gradient (random ops, an input modified in place since the forward) raises
instead of returning a different gradient.
"""
from __future__ import annotations

import dataclasses
import threading

import torch

from .. import logs
from ..configuration import config
from .compile_graph import finish, plan_graph
from .ir import LoopValue
from .lower.absent import without_tangents
from .lower.core import EAGER_LAYOUT, LOWERINGS
from .lower.matmul import EXTERN_OPS
from .runtime import nativeautograd
from ..sourcefiles import source_file

_C_APPLY = torch._C._FunctionBase.__dict__["apply"]


def build_training(joint, n_in: int, single: bool, plan_fn=plan_graph, finish_fn=finish, graph_calls=None,
                   native_node: bool = False, absent_variants: bool = True, saved_layouts: bool = False):
    """``plan_fn``/``finish_fn``: the renderer's passes (C++ here; the GPU path passes its own).
    ``native_node``: use tempa's native autograd node where it is built (the CPU targets
    ask for it; the GPU targets keep ``autograd.Function`` until it is tested there).
    ``graph_calls``: (fw_call, bw_call) -> replacements that replay them as CUDA graphs
    (mode="reduce-overhead", runtime/cudagraphs.py). Then every saved tensor goes through
    ``save_for_backward``, so autograd drops it when the backward has run and the forward's
    next replay need not copy it away (a ctx attribute lives as long as the outputs do).
    ``absent_variants``: a call whose backward gets no gradient for some outputs runs a
    backward compiled for their absence (``_AbsentTangents``); off (and under CUDA graphs,
    whose backward is one recording), autograd gives zeros for them, as before.
    ``saved_layouts`` (the C++ target at fixed sizes): the forward hands out saved values in
    its own layouts and the backward is compiled for them (``_own_layout_outputs``)."""
    n_fixed = len(joint.saved_inputs) + joint.num_saved
    n_bw_in = n_fixed + len(joint.diff_outputs)
    all_saved_variables = graph_calls is not None
    absent_variants = absent_variants and not all_saved_variables
    own = {"own_layout_outputs": _own_layout_outputs(joint)} if saved_layouts else {}
    fw_plan = plan_fn(joint.fw, joint.num_outputs, joint.mutated, n_in, "forward", "f_", **own)
    if saved_layouts:
        _adopt_saved_layouts(joint, fw_plan.lowered.outputs)
    if absent_variants and _backward_likely_partial(joint):
        # the backward is compiled by the first call that needs it (_AbsentTangents)
        ((fw_call, fw_info),) = finish_fn([fw_plan])
        bw_call, bw_info = None, type(fw_info)()
    else:
        bw_plan = plan_fn(joint.bw, len(joint.grad_inputs), [], n_bw_in, "backward", "b_")
        # one gcc run for both graphs
        (fw_call, fw_info), (bw_call, bw_info) = finish_fn([fw_plan, bw_plan])
    if all_saved_variables:
        fw_call, bw_call = graph_calls(fw_call, bw_call)
    absent = (_AbsentTangents(joint, bw_call, bw_info, n_fixed, plan_fn, finish_fn)
              if absent_variants else None)
    n_out = joint.num_outputs
    saved_inputs = tuple(joint.saved_inputs)
    diff = tuple(joint.diff_outputs)
    grad_inputs = tuple(joint.grad_inputs)
    # outputs with history: those with a tangent, and those eager records without one
    history = tuple(joint.history_outputs if joint.history_outputs is not None else diff)
    non_diff = tuple(i for i in range(n_out) if i not in history)
    history_only = tuple(i for i in history if i not in diff)
    zero_grad_inputs = tuple(joint.zero_grad_inputs or ())
    n_saved = joint.num_saved
    # saved values that are also user outputs (same node): keep them via save_for_backward
    out_node = next(n for n in joint.fw.graph.nodes if n.op == "output")
    vals = list(out_node.args[0])
    user_nodes = vals[:n_out]
    saved_nodes = vals[len(vals) - n_saved:] if n_saved else []
    alias = [user_nodes.index(sn) if sn in user_nodes else -1 for sn in saved_nodes]
    has_alias = any(a >= 0 for a in alias) and not all_saved_variables

    is_grad = torch.is_grad_enabled
    recompute = joint.recompute
    # where the backward's saved arguments sit in ``held`` (the forward's inputs, then its
    # saved values; see _render_forward)
    held_order = saved_inputs + tuple(range(n_in, n_in + n_saved))

    def compiled_backward(saved, grads):
        tangents = []
        missing = ()
        for k, i in enumerate(diff):
            g = grads[i]
            if g is None:           # no gradient for this output: autograd did not make one
                missing += (k,)
                continue
            if not g.is_contiguous():
                g = g.contiguous()   # the backward was compiled for contiguous tangents
            tangents.append(g)
        if absent is None:
            res = bw_call(*saved, *tangents)
        elif len(missing) == len(diff):
            return (None,) * n_in        # no gradient reaches any input, as in eager
        else:
            res = absent.call(missing)(*saved, *tangents)
        out = [None] * n_in
        for i, g in zip(grad_inputs, res):
            out[i] = g
        return tuple(out)

    def backward_from(inputs, saved, grads):
        if is_grad():
            result = _differentiable_backward(inputs, saved, grads, compiled_backward, recompute,
                                              diff, grad_inputs, joint.mutated)
        else:
            result = compiled_backward(saved, grads)
        if zero_grad_inputs and any(grads[i] is not None for i in history_only):
            result = _zero_where_none(result, inputs, zero_grad_inputs)
        return result

    def general_backward(held, grads):
        return backward_from(held[:n_in], [held[i] for i in held_order], grads)

    # the usual backward (grad mode off, no zero gradients to fill in) as straight-line code
    if bw_call is None:
        # deferred: the full backward is compiled by the first call that gives every output
        # a gradient (_AbsentTangents.call), so the rendered path looks it up there
        def full_backward(*args):
            return absent.call(())(*args)
    else:
        full_backward = bw_call
    backward_of_held = _render_backward(full_backward, general_backward, n_in, held_order, diff,
                                        grad_inputs, history_only if zero_grad_inputs else (),
                                        tangents_may_be_absent=absent is not None)

    if native_node and not all_saved_variables:
        native = nativeautograd.function(fw_call, backward_of_held, n_in, n_out, history,
                                         saved_inputs, alias, single, materialize=absent is None)
        if native is not None:
            fw_info.autograd = "native"
            return native, fw_info, bw_info
    fw_info.autograd = "autograd.Function"

    forward = _render_forward(fw_call, n_in, n_out, n_saved, saved_inputs, alias, non_diff, single,
                              all_saved_variables, materialize=absent is None)

    def backward(ctx, *grads):
        if all_saved_variables:
            return backward_from(ctx.tempa_saved, ctx.saved_tensors, grads)
        held = ctx.tempa_saved
        if has_alias:
            held = list(held)
            it = iter(ctx.saved_tensors)
            for k, a in enumerate(alias):
                if a >= 0:
                    held[n_in + k] = next(it)
        return backward_of_held(held, grads)

    Fn = type("TempaCompiledFunction", (torch.autograd.Function,),
              {"forward": staticmethod(forward), "backward": staticmethod(backward)})
    for name in _INHERITED_LOOKUPS:
        owner = next((c for c in Fn.__mro__ if name in c.__dict__), None)
        if owner is not None:          # the raw entry (a staticmethod stays one)
            setattr(Fn, name, owner.__dict__[name])
    # single output: forward returns the tensor itself, so apply returns it unwrapped
    return _C_APPLY.__get__(None, Fn), fw_info, bw_info


# Backward ops that address a tensor's storage rather than its elements: a saved value read
# by one keeps the layout eager gave it.
_STORAGE_READERS = frozenset({torch.ops.aten.as_strided.default, torch.ops.aten.as_strided_scatter.default})


def _reads_layout(user) -> bool:
    """Whether a backward node's result depends on its argument's strides, not only on its
    elements: ``as_strided`` (it addresses storage), and an ATen call run from the wrapper (a
    convolution's gradient comes out in its input's memory format, and is indexed with the
    strides seen at trace time, in eager's layout). Why: a ConvNeXt-like block's GELU output,
    saved contiguous where eager has it channels-last, gave a channels-last-indexed
    convolution gradient contiguous memory: wrong gradients."""
    if user.op != "call_function":
        return False
    if user.target in _STORAGE_READERS or user.target in EXTERN_OPS:
        return True
    return isinstance(user.target, torch._ops.OpOverload) and user.target not in LOWERINGS


def _own_layout_outputs(joint) -> frozenset:
    """The positions of the forward's outputs that may be saved in the forward's own layout:
    saved values that are not also user outputs (those the caller holds in eager's layout)
    and that the backward reads only through ops that index elements. Why: a saved value in
    eager's layout is a copy the forward makes only to save it (Whisper's residual stream is
    channels-first after its convolutions, so each layer's was saved transposed: 12 ms of a
    650 ms step) and a backward reading it across rows."""
    outs = next(n for n in joint.fw.graph.nodes if n.op == "output").args[0]
    first = len(outs) - joint.num_saved
    users_outputs = set(outs[:first])
    own = set()
    for k, ph in enumerate(_saved_placeholders(joint)):
        node = outs[first + k]
        if not isinstance(node, torch.fx.Node) or node in users_outputs or node.op == "placeholder":
            continue
        if ph.meta.get("traced_meta") is None or any(_reads_layout(u) for u in ph.users):
            continue
        own.add(first + k)
    return frozenset(own)


def _adopt_saved_layouts(joint, outputs) -> None:
    """The backward's saved-value placeholders take the strides (and storage offset) of the
    values the lowered forward hands out (``outputs``: user outputs, then saved values), so
    the backward is lowered for the memory it will read."""
    saved = outputs[len(outputs) - joint.num_saved:] if joint.num_saved else []
    for ph, v in zip(_saved_placeholders(joint), saved):
        tm = ph.meta.get("traced_meta")
        if tm is None or not isinstance(v, LoopValue) or v.strided is None:
            continue
        base, strides, offset = v.strided
        if tuple(strides) != tuple(tm.stride):
            ph.meta["traced_meta"] = dataclasses.replace(
                tm, stride=tuple(strides), offset=getattr(base, "base_offset", 0) + offset)
            ph.meta[EAGER_LAYOUT] = tm        # what an ATen fallback is handed (core.extern)


def _saved_placeholders(joint) -> list:
    """The backward's placeholders of the forward's saved values (after the saved inputs)."""
    phs = [n for n in joint.bw.graph.nodes if n.op == "placeholder"]
    skip = len(joint.saved_inputs)
    return phs[skip:skip + joint.num_saved]


def _backward_likely_partial(joint) -> bool:
    """Is the backward likely to be called without a gradient for some output? Yes where a
    0-dim differentiable output (a loss) sits beside others (the logits it was computed
    from, a KV cache): ``loss.backward()`` then leaves those without one, and the backward
    compiled for every tangent would never run. Then no backward is compiled with the
    forward; each is compiled when first needed. Otherwise the full one is compiled with the
    forward, in one gcc run (graph breaks' intermediate outputs: all used)."""
    if len(joint.diff_outputs) < 2:
        return False
    out = next(n for n in joint.fw.graph.nodes if n.op == "output").args[0]
    for i in joint.diff_outputs:
        tm = out[i].meta.get("traced_meta") if isinstance(out[i], torch.fx.Node) else None
        if tm is not None and len(tm.shape) == 0:
            return True
    return False


class _AbsentTangents:
    """The backwards of one training graph for calls in which some outputs get no gradient.

    Why: autograd gives a node no gradient for an output the loss does not use (the logits
    of an LM head that also returns its loss, a KV cache). Materialized as zeros, as
    ``Function`` does by default, each was a fresh tensor the size of that output, read by
    the backward only to add nothing (GPT-2's logits: ~14 ms a step); eager makes none. So
    the node asks for no zeros (``set_materialize_grads(False)``, the native node's
    ``materialize`` off) and a call whose gradients lack some outputs runs the backward
    graph with those tangents folded away as constant zeros (lower/absent.py), compiled the
    first time that pattern comes and kept: a model trained by ``loss.backward()`` meets one
    pattern, every step. Each variant is recorded on the backward's info
    (``absent_tangents``: output indices -> its CompiledGraphInfo). Where one cannot be
    compiled, that pattern's calls give the full backward zeros, as before (said once on
    ``tempa.fallbacks``, the reason recorded in place of the info).

    The full backward (every tangent given, the pattern ``()``) is ``bw_call``, or, where
    build_training deferred it (``_backward_likely_partial``), compiled here too when first
    needed: ``bw_info`` is then filled in place (empty until a call gives every output a
    gradient). Kernels compiled here are added to the graph's BackendInfo (``owner``)."""

    def __init__(self, joint, bw_call, bw_info, n_fixed, plan_fn, finish_fn):
        self.bw, self.bw_info = joint.bw, bw_info
        self.n_fixed, self.plan_fn, self.finish_fn = n_fixed, plan_fn, finish_fn
        self.diff = tuple(joint.diff_outputs)
        self.n_grads = len(joint.grad_inputs)
        # positions among the tangents that got no gradient -> the backward to call
        self.calls: dict = {} if bw_call is None else {(): bw_call}
        self.lock = threading.Lock()

    def call(self, missing: tuple):
        """The backward for calls without the tangents at positions ``missing`` (taking the
        saved values and the other tangents)."""
        fn = self.calls.get(missing)
        if fn is None:
            with self.lock:          # (two threads' backwards: one compile)
                fn = self.calls.get(missing)
                if fn is None:
                    fn = self.calls[missing] = self._build(missing)
        return fn

    def _build(self, missing):
        if not missing:
            return self._build_full()
        outputs = tuple(self.diff[k] for k in missing)
        try:
            gm = without_tangents(self.bw, {self.n_fixed + k for k in missing})
            n_bw_in = self.n_fixed + len(self.diff) - len(missing)
            plan = self.plan_fn(gm, self.n_grads, [], n_bw_in, "backward",
                                f"bz{'_'.join(map(str, missing))}_")
            ((fn, info),) = self.finish_fn([plan])
        except Exception as e:  # noqa: BLE001 - zeros for the full backward are correct
            if config.raise_on_failure:
                raise
            why = f"{type(e).__name__}: {e}"
            self.bw_info.absent_tangents[outputs] = why
            logs.get("fallbacks").warning(
                "tempa backend: no backward compiled for calls without a gradient for outputs "
                "%s (%s); they get zero gradients, as autograd.Function's default", outputs, why)
            return self._with_zeros(missing)
        self.bw_info.absent_tangents[outputs] = info
        self._count(info)
        return fn

    def _build_full(self):
        """The backward for every tangent, deferred by build_training: compiled now, its
        info filled into ``bw_info``. If it cannot be compiled, its graph runs as ATen calls
        (the forward has run: no eager fallback of the whole graph is left)."""
        try:
            plan = self.plan_fn(self.bw, self.n_grads, [], self.n_fixed + len(self.diff),
                                "backward", "b_")
            ((fn, info),) = self.finish_fn([plan])
        except Exception as e:  # noqa: BLE001 - the ATen graph gives the same gradients
            if config.raise_on_failure:
                raise
            logs.get("fallbacks").warning(
                "tempa backend: the backward could not be compiled (%s: %s); it runs as ATen "
                "calls", type(e).__name__, e)
            self.bw_info.aten_fallbacks = [f"the whole backward: {type(e).__name__}: {e}"]
            return self.bw
        owner, variants = self.bw_info.owner, self.bw_info.absent_tangents
        self.bw_info.__dict__.update(info.__dict__)
        self.bw_info.owner, self.bw_info.absent_tangents = owner, variants
        self._count(info)
        return fn

    def _count(self, info):
        if self.bw_info.owner is not None:
            self.bw_info.owner.kernel_count += info.kernel_count

    def _with_zeros(self, missing):
        """The full backward, given zeros for the missing tangents (the traced sizes: this
        graph is compiled for them)."""
        phs = [n for n in self.bw.graph.nodes if n.op == "placeholder"][self.n_fixed:]
        metas = [phs[k].meta["traced_meta"] for k in range(len(phs))]
        n_fixed, count = self.n_fixed, len(phs)
        missing = frozenset(missing)

        def call(*args):
            given = iter(args[n_fixed:])
            tangents = [torch.zeros(metas[k].shape, dtype=metas[k].dtype, device=metas[k].device)
                        if k in missing else next(given) for k in range(count)]
            return self.call(())(*args[:n_fixed], *tangents)
        return call


def _zero_where_none(result, inputs, reached) -> tuple:
    """The gradients ``result`` with a zero tensor for each input of ``reached`` that has
    none: eager's backward reaches them from an output the ATen graph computes from
    constants (``Joint.zero_grad_inputs``), and gives them zeros."""
    result = list(result)
    for i in reached:
        if result[i] is None:
            result[i] = torch.zeros_like(inputs[i])
    return tuple(result)


def _differentiable_backward(inputs, saved, grads, compiled_backward, recompute, diff,
                             grad_inputs, mutated):
    """The backward under ``create_graph``: eager's gradient, itself differentiable. Inputs
    the graph mutates (BatchNorm's running statistics) are recomputed from copies: the
    forward already updated them once."""
    if recompute is None:
        raise RuntimeError("tempa: this compiled graph cannot be differentiated twice "
                           "(create_graph=True / double backward): no torch-level graph to "
                           "recompute it from. Run this function eagerly (tempa.disable) for "
                           "higher-order gradients.")
    with torch.no_grad():
        expected = compiled_backward(saved, grads)
    fresh = [t.clone() if i in mutated else t for i, t in enumerate(inputs)]
    with torch.enable_grad():
        outs = recompute(*fresh)
    outs = outs if isinstance(outs, (tuple, list)) else (outs,)
    pairs = [(outs[i], grads[i]) for i in diff if outs[i].requires_grad and grads[i] is not None]
    wrt = [inputs[i] for i in grad_inputs]
    got = torch.autograd.grad([o for o, _ in pairs], wrt, [g for _, g in pairs],
                              create_graph=True, allow_unused=True) if pairs else [None] * len(wrt)
    result = list(expected)
    scale = max((w.abs().max().item() for w in expected
                 if isinstance(w, torch.Tensor) and w.numel()), default=0.0)
    for i, g in zip(grad_inputs, got):
        want = expected[i]
        if g is None:
            g = None if want is None else torch.zeros_like(want)
        elif want is not None and not _close(g.detach(), want, scale):
            raise RuntimeError(
                "tempa: double backward (create_graph=True) through a compiled graph: "
                "recomputing its forward eagerly did not reproduce the compiled gradient (the "
                "graph draws random numbers, or an input was modified in place after the "
                "forward). Run this function eagerly (tempa.disable) for higher-order "
                "gradients.")
        result[i] = g
    return tuple(result)


def _close(got: torch.Tensor, want: torch.Tensor, scale: float) -> bool:
    """The eager recomputation against the compiled kernels: equal up to their rounding
    (fused kernels reorder float operations). ``scale``: the largest gradient of the call;
    a gradient that is zero in exact arithmetic (a bias before BatchNorm) is rounding noise
    of that size in both."""
    if not got.is_floating_point() and not got.is_complex():
        return torch.equal(got, want)
    tol = 1e-3 if got.dtype in (torch.float32, torch.float64, torch.complex64,
                                torch.complex128) else 3e-2
    return torch.allclose(got, want.to(got.dtype), rtol=tol, atol=tol * max(scale, 1e-6),
                          equal_nan=True)


# Class attributes ``THPFunction_apply`` looks up by name on every call. They live two
# classes up the MRO and the lookup bypasses the type cache (a fresh, uninterned name),
# so copying them onto the class saves two dict probes each (measured with callgrind).
_INHERITED_LOOKUPS = ("setup_context", "clear_saved_tensors_on_access", "boxed_grads_call")


def _render_backward(bw_call, general, n_in: int, held_order: tuple, diff: tuple,
                     grad_inputs: tuple, zero_if_reached: tuple, tangents_may_be_absent: bool):
    """``backward_of_held(held, grads)`` for this graph: the compiled backward called on the
    held values it reads and the contiguous tangents, its results placed at their inputs,
    with no per-call loops (four Python frames and two comprehensions were ~0.4 µs of a
    small training step). ``general`` (the same signature) takes the calls this does not:
    grad mode on (a double backward's recomputation), or a gradient reaching an output
    whose inputs get zeros (``zero_if_reached``), or, where the node asks for no zeros
    (``tangents_may_be_absent``: absent-tangent variants), a call missing some output's
    gradient, which runs the variant compiled without it."""
    lines = ["def backward_of_held(held, grads):", "    if is_grad():",
             "        return general(held, grads)"]
    if zero_if_reached:
        reached = " or ".join(f"grads[{i}] is not None" for i in zero_if_reached)
        lines += [f"    if {reached}:", "        return general(held, grads)"]
    if tangents_may_be_absent and diff:
        absent = " or ".join(f"grads[{i}] is None" for i in diff)
        lines += [f"    if {absent}:", "        return general(held, grads)"]
    for k, i in enumerate(diff):
        lines += [f"    t{k} = grads[{i}]",
                  f"    if not t{k}.is_contiguous():",
                  f"        t{k} = t{k}.contiguous()   # compiled for contiguous tangents"]
    args = "".join(f"held[{i}], " for i in held_order) + "".join(f"t{k}, " for k in range(len(diff)))
    lines.append(f"    res = bw_call({args})")
    where = {i: k for k, i in enumerate(grad_inputs)}
    lines.append("    return (" + "".join(f"res[{where[i]}], " if i in where else "None, "
                                         for i in range(n_in)) + ")")
    ns = {"bw_call": bw_call, "general": general, "is_grad": torch.is_grad_enabled}
    src = "\n".join(lines) + "\n"
    exec(compile(src, source_file(src, "autograd backward"), "exec"), ns)
    return ns["backward_of_held"]


def _render_forward(fw_call, n_in, n_out, n_saved, saved_inputs, alias, non_diff, single,
                    all_saved_variables=False, materialize=True):
    """The Function's forward as straight-line code for this graph (no per-call loops).
    ``materialize`` off: the backward gets None for an output without a gradient, not zeros.

    The compiled forward returns the user outputs then the saved values. Saved values that
    are also user outputs go through ``save_for_backward`` (a ctx attribute holding an
    output would be a reference cycle through its ``grad_fn``); the rest, and the inputs,
    are one plain ctx attribute: fresh buffers nobody else holds, or the caller's inputs,
    which eager would save too. ``all_saved_variables``: everything goes through
    ``save_for_backward`` (inputs first, then the saved values, the backward's order)."""
    args = ", ".join(f"a{i}" for i in range(n_in))
    # One ctx attribute, one tuple: every input (the backward's saved inputs, and the
    # recomputation of a double backward: _differentiable_backward), then the saved values
    # kept as plain references (None where save_for_backward holds one).
    held = "".join(f"a{i}, " for i in range(n_in))
    lines = [f"def forward(ctx, {args}):", f"    r = fw_call({args})"]
    if not materialize:
        lines.append("    ctx.set_materialize_grads(False)")
    if all_saved_variables:
        lines.append("    ctx.save_for_backward(" + "".join(f"a{i}, " for i in saved_inputs) +
                     f"*r[{n_out}:])")
    elif any(a >= 0 for a in alias):
        lines.append(f"    ctx.save_for_backward({', '.join(f'r[{a}]' for a in alias if a >= 0)},)")
        held += "".join(f"r[{n_out + k}], " if a < 0 else "None, " for k, a in enumerate(alias))
    else:
        held += "".join(f"r[{n_out + k}], " for k in range(n_saved))
    lines.append(f"    ctx.tempa_saved = ({held})")
    if non_diff:
        lines.append("    ctx.mark_non_differentiable(*[o for o in (" +
                     "".join(f"r[{i}], " for i in non_diff) + ") if isinstance(o, torch.Tensor)])")
    lines.append("    return r[0]" if single else f"    return r[:{n_out}]")
    ns = {"fw_call": fw_call, "torch": torch}
    src = "\n".join(lines) + "\n"
    exec(compile(src, source_file(src, "autograd forward"), "exec"), ns)
    return ns["forward"]
