"""``tempa_backend``: choose and build variants (inference / autograd), handle failures."""
from __future__ import annotations

import copy
import re
import threading
import time
from dataclasses import dataclass, field

import torch

from .. import counters, logs
from ..configuration import config
from .compile_graph import CompiledGraphInfo
from .lower.joint import trace_training
from .lower.layout import is_channels_last
from .lower.layout_timing import channels_last_faster
from .lower.replay import relayout_convolutions
from .lower.trace import UntraceableGraph, prepare, rng_untouched, trace_forward, with_output_views
from .pipeline import show
from .results import bumping_versions, with_eager_results
from .runtime.build import BuildError
from .variant_target import CpuTarget, VariantTarget



@dataclass
class BackendInfo:
    """What the backend did with one graph (``compiled.tempa_info``).

    The flat fields describe the variant built first (inference, or the autograd forward),
    except ``kernel_count``: every kernel generated for this graph so far, over all variants
    built (inference, forward, backward), which is what ``stats().kernels_compiled`` adds up.
    ``inference``, ``forward`` and ``backward`` hold each variant's CompiledGraphInfo once built.
    """
    kernel_count: int = 0
    cpp_source: str = ""
    wrapper_source: str = ""
    aten_fallbacks: list = field(default_factory=list)
    extern_calls: list = field(default_factory=list)
    fusion_report: str = ""
    used_gcc: bool = False
    from_disk_cache: bool = False
    fallback_reason: str | None = None     # set when the graph runs eagerly
    dynamic: str = ""                      # symbolic sizes: "generic in ..." or "per-shape: why"
    compile_seconds: float = 0.0
    inference: CompiledGraphInfo | None = None
    forward: CompiledGraphInfo | None = None
    backward: CompiledGraphInfo | None = None
    notes: list = field(default_factory=list)
    # mode="reduce-overhead" training: the (forward, backward) CUDA graph runners, once built
    training_cudagraphs: tuple = ()
    # the graph-level passes' outputs (pipeline.PASSES): captured, split_at_values, prepare, joint
    passes: dict = field(default_factory=dict)
    # a graph cut at value-dependent ops (split_at_values.py): each compiled piece's BackendInfo
    pieces: list = field(default_factory=list)

    def trace(self) -> str:
        """Every pass's output for this graph, in pipeline order: the graph-level passes,
        then each variant built so far (inference, forward, backward); for a graph compiled
        in pieces, each piece's."""
        parts = [show(self.passes)] if self.passes else []
        for label in ("inference", "forward", "backward"):
            gi = getattr(self, label)
            if gi is not None and gi.passes:
                parts.append(gi.trace(f"##### {label} #####"))
        for k, piece in enumerate(self.pieces):
            parts.append(f"######## piece {k + 1} ########\n{piece.trace()}")
        return "\n\n".join(parts)

    def _adopt(self, gi: CompiledGraphInfo):
        self.kernel_count += gi.kernel_count
        gi.owner = self
        if self.cpp_source or self.wrapper_source:
            self.used_gcc = self.used_gcc or gi.used_gcc
            return
        self.cpp_source = gi.cpp_source
        self.wrapper_source = gi.wrapper_source
        self.aten_fallbacks = gi.aten_fallbacks
        self.extern_calls = gi.extern_calls
        self.fusion_report = gi.fusion_report
        self.used_gcc = gi.used_gcc
        self.from_disk_cache = gi.from_disk_cache

    def __str__(self):
        parts = [f"{self.kernel_count} kernels", f"fallbacks={self.aten_fallbacks}"]
        if self.fallback_reason:
            parts.append(f"EAGER: {self.fallback_reason}")
        return "BackendInfo(" + ", ".join(parts) + ")"


_warned: set = set()


def _log_fallback_once(msg: str):
    if msg not in _warned:
        _warned.add(msg)
        logs.get("fallbacks").warning(msg)


def _warn_once(msg: str):
    key = msg.split("\n")[0]
    if key not in _warned:
        _warned.add(key)
        logs.warn(msg)


def _on_cuda(example_inputs) -> bool:
    return any(isinstance(t, torch.Tensor) and t.is_cuda for t in example_inputs)


def tempa_backend(gm: torch.fx.GraphModule, example_inputs, *, mode: str | None = None,
                  options: dict | None = None):
    why = _eager_only_input(example_inputs)
    if why:
        _say_eager_once(why)
        return _eager(gm, BackendInfo(), why)
    from .split_at_values import compile_in_pieces, value_dependent_ops
    if value_dependent_ops(gm):
        # ops whose results only the run knows (.item(), nonzero, x[mask]) run as ATen
        # calls, the pieces between them compile as graphs of their own (split_at_values.py)
        return compile_in_pieces(gm, example_inputs, mode=mode, options=options)
    if _on_cuda(example_inputs):
        # CUDA inputs: Triton kernels, CUDA graphs, autotuning (tempa/backend/gpu)
        # (symbolic sizes: shape-generic kernels, see gpu/dynamic.py)
        from .gpu import gpu_backend
        return gpu_backend(gm, list(example_inputs), mode=mode, options=options)
    dims = _dynamic_dims(gm)
    if dims:
        # symbolic sizes: one shape-generic compile for every size (dynamic.py)
        from .dynamic import DynamicTarget
        return build(gm, example_inputs, DynamicTarget(dims))
    return build(gm, example_inputs, CpuTarget(freezing=bool((options or {}).get("freezing"))))


def _overrides(cls, name: str) -> bool:
    impl = getattr(cls, name, None)
    impl = getattr(impl, "__func__", impl)
    base = getattr(torch.Tensor, name, None)
    return impl is not getattr(base, "__func__", base) and \
        impl is not torch._C._disabled_torch_function_impl


def _eager_only_input(example_inputs) -> str | None:
    """Why the graph must run with eager ATen calls (None: it can be compiled).

    Generated kernels read raw memory and return plain tensors, so an input whose meaning is
    more than its memory is not theirs to compute with: a tensor subclass with its own
    ``__torch_function__``/``__torch_dispatch__`` (the result must be the subclass, made by
    its own code), or a lazily negated / conjugated view (``z.conj().imag``: the memory holds
    the value without its sign; the guard tells such inputs apart from plain ones)."""
    for i, t in enumerate(example_inputs):
        if not isinstance(t, torch.Tensor):
            continue
        cls = type(t)
        if cls is not torch.Tensor and (_overrides(cls, "__torch_function__")
                                        or _overrides(cls, "__torch_dispatch__")):
            return f"input {i} is a tensor subclass ({cls.__name__}) with its own __torch_function__/__torch_dispatch__"
        if t.is_neg() or t.is_conj():
            return f"input {i} is a {'negative' if t.is_neg() else 'conjugate'}-bit view"
    return None


def _channels_last_arg(node, i) -> bool:
    """Is argument ``i`` of ``node`` traced as a channels-last 4-D tensor?"""
    a = node.args[i] if len(node.args) > i else None
    tm = a.meta.get("traced_meta") if isinstance(a, torch.fx.Node) else None
    return tm is not None and len(tm.shape) == 4 and is_channels_last(tm)


def _say_eager_once(why: str):
    key = re.sub(r"^input \d+ ", "", why)      # once per kind of input, not per position
    if key not in _warned:
        _warned.add(key)
        logs.get("fallbacks").warning("tempa backend: running a graph with eager ATen calls: %s "
                                      "(generated kernels cannot compute with such inputs)", why)


# Graphs with symbolic sizes get shape-generic code (or per-shape code, said in tempa_info).
tempa_backend.supports_dynamic = True


def _dynamic_dims(gm):
    from .dynamic import NotGeneric, dynamic_dims
    try:
        return dynamic_dims(gm)
    except NotGeneric:
        return []


def build(gm: torch.fx.GraphModule, example_inputs, target: VariantTarget,
          info: BackendInfo | None = None):
    """The variants of one graph compiled with ``target`` (variant_target.py). ``info``: the
    record to fill (a target that reports into it while it builds passes its own)."""
    info = BackendInfo() if info is None else info
    if _in_transform():
        # captured under vmap/jvp/grad: the example inputs are functorch wrappers without
        # storage, which cannot be traced to kernels; build from the first plain call
        return _built_outside_transforms(gm, target, info)
    t0 = time.perf_counter()
    example_inputs = list(example_inputs)
    info.passes["captured"] = gm
    try:
        pgm, attrs = prepare(gm)
        info.passes["prepare"] = f"{len(attrs)} get_attr tensors lifted to inputs: {attrs}"
    except Exception as e:  # noqa: BLE001 - any failure means: run eagerly
        return _eager(gm, info, f"prepare failed: {e}")
    # get_attr tensors (FX graphs made by torch.fx tracing) are bound once, by identity:
    # in-place updates (optimizers, BatchNorm stats) are visible, values are never baked.
    # The frontend passes parameters as inputs instead, so this costs it nothing.
    attr_vals = tuple(_attr_getter(gm, a)() for a in attrs)
    full_examples = example_inputs + list(attr_vals)
    n_in = len(full_examples)
    needs_grad = any(isinstance(t, torch.Tensor) and t.requires_grad for t in full_examples)
    target = target.bind(pgm, full_examples, info)
    state = GraphVariants(pgm, full_examples, info, n_in, gm, target)

    if needs_grad and torch.is_grad_enabled():
        first = state.training()
    else:
        first = state.inference()
    if first is None:
        info.compile_seconds = time.perf_counter() - t0
        return _eager(gm, info, info.fallback_reason)

    # _in_transform, checked on every call inline (no extra frame): see _transformed_call.
    functorch_active = torch._C._are_functorch_transforms_active
    dual_levels = torch.autograd.forward_ad
    transformed = _transformed_call(gm, info)
    if not needs_grad:
        def inner(*args):
            if functorch_active() or dual_levels._current_level >= 0:
                return transformed(*args)
            return first(*args)
    else:
        is_grad = torch.is_grad_enabled

        def inner(*args):
            if functorch_active() or dual_levels._current_level >= 0:
                return transformed(*args)
            if is_grad():
                return (state.train_fn or state.training())(*args)
            return (state.infer_fn or state.inference())(*args)

    if attr_vals:
        def with_attrs(*args):
            return inner(*args, *attr_vals)
        compiled = _following_requires_grad(with_attrs, attr_vals, gm, target, info)
    else:
        compiled = inner
    info.compile_seconds = time.perf_counter() - t0
    compiled.tempa_info = info
    if logs.on("perf"):
        built = "from the disk cache" if info.from_disk_cache else "gcc ran" if info.used_gcc \
            else "no C++ build"
        logs.get("perf").info("tempa backend: graph compiled in %.2f s: %d kernels (%s), %d ATen "
                              "fallbacks%s", info.compile_seconds, info.kernel_count, built,
                              len(info.aten_fallbacks or ()), f"; {info.dynamic}" if info.dynamic else "")
    return compiled


def _following_requires_grad(fn, attr_vals, gm, target, info):
    """``fn`` while the get_attr tensors' requires_grad is what it was at build time, else a
    build for the new pattern. Why: they are no inputs the frontend guards, and the variants
    depend on it: a parameter unfrozen since would get no gradient from a graph built while
    it was frozen (the inference kernels, or a joint that differentiates the others only)."""
    variants = {tuple(a.requires_grad for a in attr_vals): fn}

    def compiled(*args):
        key = tuple(a.requires_grad for a in attr_vals)
        run = variants.get(key)
        if run is None:
            # a target that binds the graph keeps per-build state: a copy for each build
            fresh = copy.copy(target) if target.shape_generic else target
            run = variants[key] = build(gm, args, fresh, info)
        return run(*args)
    return compiled


def _attr_getter(gm, target):
    def get():
        obj = gm
        for p in target.split("."):
            obj = getattr(obj, p)
        return obj
    return get


def _in_transform() -> bool:
    return torch._C._are_functorch_transforms_active() or \
        torch.autograd.forward_ad._current_level >= 0


def _built_outside_transforms(gm, target, info):
    transformed = _transformed_call(gm, info)
    lock = threading.Lock()
    built = []

    def compiled(*args):
        if _in_transform():
            return transformed(*args)
        if not built:
            with lock:
                if not built:
                    built.append(build(gm, args, target, info))
        return built[0](*args)
    compiled.tempa_info = info
    return compiled


def _transformed_call(gm, info):
    """The graph for a call under forward-mode AD (``forward_ad.dual_level``) or a functorch
    transform (``torch.func.vmap``, ``jvp``, ``grad``): the torch-level graph run eagerly.
    Why: the compiled kernels read the raw buffers of plain tensors, so a dual tensor's
    tangent would be dropped and a BatchedTensor (no storage) cannot be read at all; torch's
    own ops carry both. Said once per graph on ``tempa.fallbacks``."""
    n_user = len([n for n in gm.graph.nodes if n.op == "placeholder"])
    said = []

    def run(*args):
        if not said:
            said.append(True)
            why = ("forward-mode AD or a torch.func transform (vmap, jvp, grad) is active; "
                   "the compiled kernels read plain tensors only")
            info.notes.append(f"eager: {why}")
            counters.bump("eager_fallbacks")
            logs.get("fallbacks").warning("tempa: running a compiled graph with eager ATen ops: %s",
                                          why)
        return run_graph(gm, args[:n_user])
    return run


# What each variant is, in the user's terms (a forward without no_grad is "training" here)
_VARIANT_WORDS = {
    "inference": "the graph",
    "training": "the graph with its backward (grad mode is on and a parameter or input "
                "requires grad; wrap inference in torch.no_grad())",
}


# Functions returning several views: autograd refuses in-place writes to their outputs
# (CreationMeta::MULTI_OUTPUT_NODE); the unsafe_ variants are the ones that allow them.
_MULTI_OUTPUT_VIEWS = {"unbind", "split", "chunk", "split_with_sizes", "tensor_split",
                       "hsplit", "vsplit", "dsplit"}
# Views whose elements may share memory: an in-place write to one raises in eager.
_OVERLAPPING_VIEWS = {"expand", "expand_as", "broadcast_to", "broadcast_tensors", "as_strided"}
# The first lines of eager's refusals (TensorIterator's overlap check, autograd's view checks).
_REFUSED_INPLACE = ("more than one element of the written-to tensor refers to a single memory location",
                    "is a view and is being modified inplace",
                    "A view was created in no_grad mode and is being modified inplace")
# Ops autograd has no derivative for (the backward raises where an input requires grad);
# their decompositions do have one, so the joint trace would differentiate them.
_NOT_DIFFERENTIABLE = {"floor_divide", "floor_divide_", "floordiv", "ifloordiv", "__floordiv__",
                       "__rfloordiv__", "__ifloordiv__"}
_INPLACE_OPERATORS = {"setitem", "iadd", "isub", "imul", "itruediv", "ifloordiv", "imod", "ipow",
                      "iand", "ior", "ixor", "ilshift", "irshift", "imatmul"}
_INPLACE_OPERATORS |= {f"__{name}__" for name in _INPLACE_OPERATORS}   # x.__setitem__(i, v)


def _overlaps(t: torch.Tensor) -> bool:
    """Do some of ``t``'s elements share memory (a dim of stride 0 and size > 1)?"""
    return any(st == 0 and n > 1 for st, n in zip(t.stride(), t.shape))


# In-place arithmetic whose result type is the promotion of its operands, cast back into the
# written tensor (TensorIterator refuses a cast that loses the kind: float into int, int
# into bool); true division promotes integers to the default float dtype.
_PROMOTING_IN_PLACE = {"add_", "sub_", "mul_", "div_", "true_divide_", "floor_divide_",
                       "remainder_", "fmod_", "iadd", "isub", "imul", "itruediv", "ifloordiv",
                       "imod", "__iadd__", "__isub__", "__imul__", "__itruediv__",
                       "__ifloordiv__", "__imod__"}
_TRUE_DIVISIONS = {"div_", "true_divide_", "itruediv", "__itruediv__"}


def _in_place_cast_refused(n):
    """(result dtype, tensor dtype) where the in-place arithmetic ``n`` writes a result its
    tensor cannot hold, else None."""
    name = _op_name(n)
    if n.op not in ("call_function", "call_method") or name not in _PROMOTING_IN_PLACE or len(n.args) < 2:
        return None
    def example(a):
        # a tensor of the value's dtype and rank (promotion reads nothing else): the example
        # is a fake tensor or capture's MetaInfo
        v = a.meta.get("example_value") if isinstance(a, torch.fx.Node) else a
        if hasattr(v, "dtype") and hasattr(v, "shape"):
            return torch.empty([1] * len(v.shape), dtype=v.dtype, device="meta")
        return v if isinstance(v, (bool, int, float, complex)) else None
    target, other = example(n.args[0]), example(n.args[1])
    if not isinstance(target, torch.Tensor) or other is None:
        return None
    result = torch.result_type(target, other)
    if name in _TRUE_DIVISIONS and n.kwargs.get("rounding_mode") is None and \
            not (result.is_floating_point or result.is_complex):
        result = torch.get_default_dtype()
    return None if torch.can_cast(result, target.dtype) else (result, target.dtype)


def _op_name(n) -> str:
    t = n.target
    return t if isinstance(t, str) else getattr(t, "__name__", "")


def _writes_in_place(n) -> bool:
    """Does this torch-level node write to one of its arguments (``add_``, ``x[i] = v``,
    ``+=``, ``out=``)?"""
    if n.op not in ("call_function", "call_method"):
        return False
    name = _op_name(n)
    return (name.endswith("_") and not name.endswith("__")) or name in _INPLACE_OPERATORS \
        or "out" in n.kwargs


def raises_in_eager(gm, inputs) -> bool:
    """Whether the torch-level graph raises when run with ATen ops on copies of ``inputs``
    (the RNG state kept): a wrong input dtype fails in eager too, and then the failure is
    the user's error to report as eager does, not tempa's to work around."""
    n_user = len([n for n in gm.graph.nodes if n.op == "placeholder"])
    copies = [t.detach().clone().requires_grad_(t.requires_grad)
              if isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())
              else t.detach().clone() if isinstance(t, torch.Tensor) else t
              for t in list(inputs)[:n_user]]
    with rng_untouched():
        try:
            gm.forward(*copies)
        except Exception:  # noqa: BLE001 - any error of the graph's own ops
            return True
    return False


def run_graph(gm, args):
    """The torch-level graph run with ATen ops, as eager would. A graph that switches grad
    mode (``with torch.no_grad():`` inside) restores it at its end; when an op in between
    raises, the mode is restored here, so the caller's grad mode survives the error."""
    grad = torch.is_grad_enabled()
    try:
        return gm(*args)
    except BaseException:
        torch._C._set_grad_enabled(grad)
        raise


def _eager(gm, info, reason):
    info.fallback_reason = reason
    info.aten_fallbacks = info.aten_fallbacks or ["<whole graph>"]

    def compiled(*args):
        return run_graph(gm, args)
    compiled.tempa_info = info
    return compiled


class GraphVariants:
    """Both variants of one graph, built lazily (a lock keeps two threads from racing)."""

    def __init__(self, pgm, examples, info, n_in, orig_gm, target: VariantTarget):
        self.pgm, self.examples, self.info, self.n_in = pgm, examples, info, n_in
        self.target = target
        self.orig = orig_gm
        self.traced = None
        self.infer_fn = None
        self.train_fn = None
        self.lock = threading.RLock()

    def _trace(self):
        if self.traced is None:
            self._check_no_write_to_overlapping_memory()
            self._check_in_place_result_types()
            self.traced = trace_forward(self.pgm, self.examples, self.target.decomps(), differentiable=False)
        return self.traced

    def inference(self):
        with self.lock:
            if self.infer_fn is not None:
                return self.infer_fn
            try:
                tr = self._in_conv_layout(self._trace())
                views_by_target = self._views_per_shape(tr.aliases, "inference")
                call, gi = self.target.compile_graph(tr.gm, tr.num_outputs, tr.mutated, self.n_in, "inference")
            except Exception as e:  # noqa: BLE001
                return self._failed(e, "inference")
            self.info.inference = gi
            self.info._adopt(gi)
            call = self._eager_results(call, tr, views_by_target)
            single = getattr(tr, "single", False)
            if single:
                def fn(*args):
                    return call(*args)[0]
                self.infer_fn = fn
            else:
                self.infer_fn = call
            return self.infer_fn

    def _conv_layout(self, variant: str) -> str:
        """The target's convolution layout for ``variant`` (layout.CONV_LAYOUTS); a target
        without a policy (the shape-generic ones: a conversion that is a no-op at one size
        is not at another) keeps eager's."""
        layout = self.target.conv_layout()
        if layout in ("inference", "measured"):
            return (layout if layout == "measured" else "channels_last") if variant == "inference" else "eager"
        return layout

    def _in_conv_layout(self, tr):
        """The inference trace ``tr`` with its convolutions in the target's layout ("measured":
        channels-last where that is timed faster, lower/layout_timing.py)."""
        layout = self._conv_layout("inference")
        if layout not in ("channels_last", "measured"):
            return tr
        try:
            relaid = relayout_convolutions(tr, self.examples, self.target.decomps())
        except UntraceableGraph as e:      # the graph still compiles, in eager's layouts
            self.info.passes["layout"] = f"inference: eager layouts: {e}"
            return tr
        if relaid is not None and layout == "measured":
            faster, eager_s, cl_s = channels_last_faster(tr.gm, relaid.gm)
            line = (f"inference: measured: convolutions {eager_s * 1e3:.2f} ms in eager's layouts, "
                    f"{cl_s * 1e3:.2f} ms channels-last with its conversions: "
                    f"{'channels-last' if faster else 'eager layouts'}")
            old = self.info.passes.get("layout")
            self.info.passes["layout"] = f"{old}\n{line}" if old else line
            if not faster:
                return tr
        if relaid is not None:
            self._note_layout("inference", relaid.gm.graph)
        return relaid or tr

    def _note_layout(self, variant, graph):
        """Say what the layout policy made of ``graph`` (tempa_info.trace(), pass "layout")."""
        nodes = [n for n in graph.nodes if n.op == "call_function"]
        convs = [n for n in nodes if n.target in (torch.ops.aten.convolution.default,
                                                  torch.ops.aten.convolution_backward.default)]
        if not convs:
            return
        nhwc = sum(_channels_last_arg(n, 1 if n.target is torch.ops.aten.convolution_backward.default
                                      else 0) for n in convs)
        conversions = sum(n.target is torch.ops.aten.clone.default
                          and n.kwargs.get("memory_format") is torch.channels_last for n in nodes)
        line = (f"{variant}: channels_last: {nhwc} of {len(convs)} convolution calls (backward "
                f"ones included) with channels-last input, {conversions} conversions to it")
        old = self.info.passes.get("layout")
        self.info.passes["layout"] = f"{old}\n{line}" if old else line

    def _eager_results(self, call, tr, views_by_target):
        """``call`` with what eager returns beyond values: an input the graph mutated has its
        version counter bumped (so autograd still sees that a tensor it saved was modified in
        place), and an output that eager returns as an input itself or as a view of an input
        or of another output is that object or view, not the graph's copy (trace.OutputAlias;
        a shape-generic target makes the views itself, per shape: ``_views_per_shape``)."""
        if not views_by_target:
            call = with_output_views(call, tr.aliases)
        mutated = self._version_bumps(tr.mutated)
        same = {i: a.index for i, a in enumerate(tr.aliases or ()) if a is not None and a.same}
        if not mutated and not same:
            return call
        return with_eager_results(call, mutated, same, len(tr.aliases or ()))

    def _version_bumps(self, mutated) -> tuple:
        """Each mutated input once per time eager bumps its version counter in one call: once
        per in-place op that writes it or a view of it (``x.add_(1); x[0] = 5`` bumps twice),
        which the functional trace folds into one write. Counted by running the torch-level
        graph once on fake copies of the inputs (a view's copy shares its base's counter),
        only for a graph that writes its inputs; once each where fake tensors cannot run it."""
        mutated = tuple(dict.fromkeys(mutated))
        if not mutated:
            return mutated
        # The captured graph itself where it can run on the inputs alone: prepare() swaps
        # F.batch_norm for an overload that declares (and so bumps) its running-stat writes,
        # which eager's does not
        exact = not any(n.op == "get_attr" for n in self.orig.graph.nodes)
        graph = self.orig if exact else self.pgm
        from torch._subclasses.fake_tensor import FakeTensorMode
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        try:
            copies = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t
                      for t in self.examples]
            before = [copies[j]._version for j in mutated]
            with mode, torch.no_grad():
                graph(*copies)
        except Exception:  # noqa: BLE001 - ops fake tensors cannot run: one bump each
            return mutated
        return tuple(j for j, v in zip(mutated, before)
                     for _ in range(copies[j]._version - v if exact else
                                    max(1, copies[j]._version - v)))

    def _views_per_shape(self, aliases, variant) -> bool:
        """Does the target make the output views itself? A shape-generic target does: the
        sizes, strides and offsets of a view recorded at one size do not hold at others, so
        a graph whose outputs are views is compiled per shape there, each shape's call
        handing out its own views (``DynamicTarget.keep_output_views``)."""
        if not self.target.shape_generic:
            return False
        self.target.keep_output_views(aliases, variant)
        return True

    def training(self):
        with self.lock:
            if self.train_fn is not None:
                return self.train_fn
            if self._writes_grad_inputs_outside_autograd():
                return self._inference_under_no_grad()
            try:
                self._check_no_write_to_overlapping_memory()
                self._check_in_place_result_types()
                self._check_autograd_accepts_graph()
                layout = self._conv_layout("training")
                joint = trace_training(self.pgm, self.examples, self.target.decomps(), layout)
                if layout == "channels_last":
                    self._note_layout("training", joint.graph)
                joint.recompute = self.pgm
                self.info.passes["joint"] = joint
                views_by_target = self._views_per_shape(joint.aliases, "training")
                fn, fw_info, bw_info = self.target.build_training(joint, self.n_in, joint.single)
            except Exception as e:  # noqa: BLE001
                return self._failed(e, "training")
            self.info.forward, self.info.backward = fw_info, bw_info
            self.info._adopt(fw_info)
            self.info._adopt(bw_info)
            if not views_by_target:
                fn = with_output_views(fn, joint.aliases, joint.single)
            self.train_fn = bumping_versions(fn, self._version_bumps(joint.mutated))
            return fn

    def _writes_grad_inputs_outside_autograd(self) -> bool:
        """The graph writes in place to an input that requires grad, and autograd records
        nothing of it (an optimizer step: torch.optim updates the parameters under no_grad
        while the caller's grad mode is on, legal in eager). Found by running the graph on
        fake copies in grad mode (leaves, requiring grad as the inputs do): it must not raise
        (eager's "leaf Variable ... in-place" error is then the ATen graph's to give), no
        copy may gain history, and no output may require grad but an input returned as it
        is. Functionalized traces cannot tell: a parameter read after its no_grad update is
        the update's value there, without grad."""
        try:
            traced = self._trace()
        except Exception:  # noqa: BLE001 - the joint trace reports it
            return False
        if not any(isinstance(self.examples[i], torch.Tensor) and self.examples[i].requires_grad
                   for i in traced.mutated):
            return False
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.utils._pytree import tree_leaves
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        copies = [mode.from_tensor(t.detach()).requires_grad_(t.requires_grad)
                  if isinstance(t, torch.Tensor) else t for t in self.examples]
        try:
            with mode, torch.enable_grad(), rng_untouched():
                outs = tree_leaves(self.pgm(*copies))
        except Exception:  # noqa: BLE001 - eager's error, or ops fakes cannot run: the ATen graph
            return False
        inputs = {id(c) for c in copies}
        return not any(isinstance(c, torch.Tensor) and c.grad_fn is not None for c in copies) and \
            not any(isinstance(o, torch.Tensor) and o.requires_grad and id(o) not in inputs
                    for o in outs)

    def _check_autograd_accepts_graph(self):
        """Raise UntraceableGraph where autograd refuses what the graph does, so that the
        ATen graph gives eager's error on every call: an op with no derivative applied to a
        value that requires grad (``x // 2``: eager's backward raises "derivative for
        aten::floor_divide is not implemented", the joint trace differentiated its
        decomposition), and an in-place write to an output of a function returning several
        views (``a, b = x.unbind(); a.add_(1)`` with ``x`` requiring grad) or to a view made
        under no_grad (the functionalized trace runs without autograd). The writes are
        checked by running the graph on fake copies in grad mode (non-leaves where the
        inputs are), only when it has such ops: importing fake tensors costs seconds."""
        for n in self.pgm.graph.nodes:
            if _op_name(n) in _NOT_DIFFERENTIABLE and any(
                    getattr(a.meta.get("example_value"), "requires_grad", False)
                    for a in n.args if isinstance(a, torch.fx.Node)):
                raise UntraceableGraph(f"autograd has no derivative for {_op_name(n)}, which "
                                       "is given a value that requires grad")
        if not self._writes_in_place_after(_MULTI_OUTPUT_VIEWS | {"_set_grad_enabled"}):
            return
        from torch._subclasses.fake_tensor import FakeTensorMode
        mode = FakeTensorMode(allow_non_fake_inputs=True)

        def copy_of(t):
            c = mode.from_tensor(t.detach()).requires_grad_(t.requires_grad)
            return c if t.is_leaf or not t.requires_grad else c.clone()
        with mode, torch.enable_grad():
            self._raise_if_refused(lambda: [copy_of(t) if isinstance(t, torch.Tensor) else t
                                            for t in self.examples])

    def _check_no_write_to_overlapping_memory(self):
        """Raise UntraceableGraph where the graph writes in place to a tensor whose elements
        share memory (``x.expand(4, 3).add_(1)``, an expanded input): eager refuses it, the
        functionalized trace never writes in place. Fake tensors do not check it, so the
        graph runs once on real copies of the inputs (their layouts kept), only when it has
        an in-place write and such a view or input."""
        if not (any(isinstance(t, torch.Tensor) and _overlaps(t) for t in self.examples)
                and any(_writes_in_place(n) for n in self.pgm.graph.nodes)) \
                and not self._writes_in_place_after(_OVERLAPPING_VIEWS):
            return

        def copy_of(t):
            memory = t.untyped_storage().clone()
            return torch.empty((0,), dtype=t.dtype, device=t.device).set_(
                memory, t.storage_offset(), t.shape, t.stride())
        with torch.no_grad():
            self._raise_if_refused(lambda: [copy_of(t) if isinstance(t, torch.Tensor) else t
                                            for t in self.examples])

    def _check_in_place_result_types(self):
        """Raise UntraceableGraph where eager refuses an in-place arithmetic op whose result
        type cannot be cast to its tensor's dtype (``bool_t.mul_(2)``: Long into Bool): the
        functionalized op computes the promoted value and the copy back casts it silently.
        Read from the captured graph's example values; no run."""
        for n in self.pgm.graph.nodes:
            refused = _in_place_cast_refused(n)
            if refused:
                raise UntraceableGraph(f"eager refuses an in-place write here (result type "
                                       f"{refused[0]} can't be cast to {refused[1]})")

    def _writes_in_place_after(self, ops) -> bool:
        """Does the graph call one of ``ops`` and write in place (anywhere)?"""
        nodes = list(self.pgm.graph.nodes)
        return any(_op_name(n) in ops for n in nodes) and any(_writes_in_place(n) for n in nodes)

    def _raise_if_refused(self, make_copies):
        """Run the graph on ``make_copies()``; UntraceableGraph if it raised one of eager's
        refusals of an in-place write. Any other failure is left to the trace."""
        try:
            with rng_untouched():
                self.pgm(*make_copies())
        except RuntimeError as e:
            first = str(e).splitlines()[0] if str(e) else ""
            if any(m in first for m in _REFUSED_INPLACE):
                raise UntraceableGraph(f"eager refuses this graph's work ({first[:160]})") from None
        except Exception:  # noqa: BLE001 - ops fake tensors cannot run: traced as before
            return

    def _inference_under_no_grad(self):
        """The training variant of a graph that autograd records nothing of although it
        writes to inputs that require grad (``_writes_grad_inputs_outside_autograd``): the
        inference kernels, run under no_grad, write the new values into the same tensors and
        bump their versions, as eager's writes under no_grad do."""
        infer = self.inference()
        if self.info.inference is None:   # no kernels: the ATen graph, in the caller's mode
            self.train_fn = infer
            return infer
        no_grad = torch.no_grad

        def fn(*args):
            with no_grad():
                return infer(*args)
        self.info.notes.append("training: autograd records nothing of this graph; the "
                               "inference kernels run under no_grad")
        self.train_fn = fn
        return fn

    def _failed(self, e, variant):
        if isinstance(e, BuildError):
            reason = f"C++ build failed: {e}"
            _warn_once(f"tempa: {reason}; running this graph with eager ATen calls instead")
        elif isinstance(e, UntraceableGraph):
            reason = f"unsupported graph: {e}"
            # not a warning (such graphs are expected: a captured .item()), but said
            _log_fallback_once(f"tempa backend: running {_VARIANT_WORDS[variant]} with eager "
                               f"ATen calls: {reason}")
        else:
            reason = f"{type(e).__name__}: {e}"
            if config.raise_on_failure or \
                    raises_in_eager(self.orig, self.examples):
                raise e   # the graph itself fails on these inputs: eager's error, the user's
            _warn_once(f"tempa: compiling {_VARIANT_WORDS[variant]} failed ({reason}); "
                       "running it eagerly")
        self.info.fallback_reason = reason
        self.info.notes.append(f"{variant}: {reason}")
        counters.bump("aten_fallbacks")
        orig = self.orig
        n_user = len([n for n in orig.graph.nodes if n.op == "placeholder"])

        def fn(*args):
            return run_graph(orig, args[:n_user])
        if variant == "inference":
            self.infer_fn = fn
        else:
            self.train_fn = fn
        return fn
