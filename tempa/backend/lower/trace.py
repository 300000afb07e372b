"""Torch-level FX graph -> functional ATen FX graph.

Why not ``make_fx``: it imports the dynamo and inductor packages on first use (3-4 s
of cold start on this machine), and so does anything that runs meta/fake kernels
(``torch._disable_dynamo``). This module records ATen calls with a small
``TorchDispatchMode`` while running the graph on *real* tensors (private clones, so user
state never changes during compilation; the joint trace, which never writes its inputs,
reads them through aliases). That costs one eager execution of the graph at
compile time and buys exact shapes/strides/dtypes, autocast as eager applies it, and no
meta-kernel gaps. ``torch.func.functionalize`` turns mutations into functional ops plus
trailing ``copy_`` nodes into the mutated inputs, which the wrapper performs explicitly.

The joint forward/backward graph is joint.py's, the convolution layout policy layout.py's;
replay.py replays a traced graph under a second recording (both use this one's recorder).
"""
from __future__ import annotations

import contextlib

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from . import nodynamo

aten = torch.ops.aten


class UntraceableGraph(Exception):
    """This graph cannot be lowered; the caller runs it another way (never wrong results)."""


@dataclass(frozen=True)
class TracedMeta:
    """What lowering needs to know about a traced value."""
    shape: tuple
    stride: tuple
    offset: int
    dtype: torch.dtype
    requires_grad: bool = False
    device: torch.device | None = None

    @staticmethod
    def of(t: torch.Tensor) -> "TracedMeta":
        return TracedMeta(tuple(t.shape), tuple(t.stride()), t.storage_offset(), t.dtype, t.requires_grad, t.device)


_DATA_DEPENDENT = {torch.Tag.data_dependent_output, torch.Tag.dynamic_output_shape}


def _static_index(func, args) -> bool:
    """Integer-tensor indexing has a static output shape (only boolean masks do not)."""
    if func not in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default,
                    aten._unsafe_index.Tensor, aten._unsafe_index_put.default):
        return False
    idx = args[1] if len(args) > 1 else []
    return all(t is None or t.dtype not in (torch.bool, torch.uint8) for t in idx)


# In-place view ops (they change a tensor's sizes/strides, never its data) and the view op
# that makes the same tensor out of place. Why: functionalization rewrites the ones user code
# calls, but not those that ATen's own composite kernels call on their fresh results:
# adaptive_avg_pool2d to 1x1 of a channels-last input (every Swin/ConvNeXt-style pooler over
# a transposed sequence) is ``mean(...).as_strided_(channels-last strides)``. Only the
# recorded tensor's metadata changes, and the recorder binds that tensor to the new node,
# so on a value the graph computed the out-of-place view is the same graph. On an input
# it is not (the caller's tensor changes shape): that one stays and the graph runs as ATen.
_FUNCTIONAL_VIEW = {
    aten.as_strided_.default: aten.as_strided.default,
    aten.unsqueeze_.default: aten.unsqueeze.default,
    aten.squeeze_.default: aten.squeeze.default,
    aten.squeeze_.dim: aten.squeeze.dim,
    aten.squeeze_.dims: aten.squeeze.dims,
    aten.t_.default: aten.t.default,
    aten.transpose_.default: aten.transpose.int,
}


class _Recorder(TorchDispatchMode):
    # Why: the base class wraps __torch_dispatch__ with torch._disable_dynamo, which imports
    # the dynamo package (seconds) on first call. We are not under dynamo, so skip the wrapper.
    @classmethod
    def _should_skip_dynamo(cls):
        return False

    def __init__(self, graph: fx.Graph, decomps: dict):
        super().__init__()
        self.graph = graph
        self.env: dict[int, fx.Node] = {}
        self.keep: list = []          # keeps traced tensors alive so ids stay unique
        self.decomps = decomps
        self.constants: dict[str, torch.Tensor] = {}
        self.backward_started = False
        self.strict_functional = False
        self.decomposing: list = []   # the ops being decomposed, outermost first

    def bind(self, t: torch.Tensor, node: fx.Node) -> None:
        self.env[id(t)] = node
        self.keep.append(t)
        node.meta["traced_meta"] = TracedMeta.of(t)
        node.meta["bw"] = self.backward_started
        node.meta["grad"] = torch.is_grad_enabled()

    def lookup(self, a):
        if isinstance(a, torch.Tensor):
            n = self.env.get(id(a))
            if n is None:
                # A tensor created outside the traced code (a constant such as torch.tensor
                # inside the graph): keep it as a constant of the compiled artifact.
                name = f"_const{len(self.constants)}"
                self.constants[name] = a.detach().clone()
                n = self.graph.get_attr(name)
                self.bind(a, n)
            return n
        if isinstance(a, (list, tuple)):
            return type(a)(self.lookup(x) for x in a)
        return a

    def _functional_in_backward(self, func, args):
        """The out-of-place op that records ``func``, an in-place write of a derivative
        formula into a tensor of its own (``copy_`` into fresh zeros, fmin's
        ``(a >= b).logical_or_(b.isnan())``), or None. Why it is the same graph: nothing
        else sees that tensor, so binding it to the new value is all the write does. Only
        where the written tensor is a value the backward computed, not a view and with no
        view of it recorded (a write through a view, as_strided's gradient scattering
        into zeros, changes another value: refused, the backward runs as ATen calls)."""
        packet = func.overloadpacket.__name__
        if not packet.endswith("_") or not args or not isinstance(args[0], torch.Tensor):
            return None
        written = [i for i, a in enumerate(func._schema.arguments)
                   if a.alias_info is not None and a.alias_info.is_write]
        node = self.env.get(id(args[0]))
        if written != [0] or node is None or not node.meta.get("bw") or node.op != "call_function":
            return None
        target = args[0]
        if target._is_view() or any(t is not target and t._is_view() and t._base is target
                                    for t in self.keep if isinstance(t, torch.Tensor)):
            return None
        out_of_place = getattr(getattr(aten, packet[:-1], None), func._overloadname, None)
        return out_of_place if isinstance(out_of_place, torch._ops.OpOverload) \
            and not out_of_place._schema.is_mutable else None

    def _recorded_target(self, func, args):
        """``func``, or for an in-place view of a value the graph computed, its out-of-place
        view (``_FUNCTIONAL_VIEW``)."""
        functional = _FUNCTIONAL_VIEW.get(func)
        if functional is None or self.lookup(args[0]).op == "placeholder":
            return func
        return functional

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.decomps:
            self.decomposing.append(func)
            try:
                with self:
                    r = self.decomps[func](*args, **kwargs)
            finally:
                self.decomposing.pop()
            if r is not NotImplemented:
                return r
        if _DATA_DEPENDENT & set(func.tags) and not _static_index(func, args):
            raise UntraceableGraph(f"data-dependent op {func}")
        if self.strict_functional and func._schema.is_mutable:
            functional = self._functional_in_backward(func, args)
            if functional is None:
                raise UntraceableGraph(f"mutating op {func} in the backward")
            out = func(*args, **kwargs)
            node = self.graph.call_function(functional, self.lookup(args), self.lookup(kwargs))
            self.bind(args[0], node)      # the written tensor is the new value from here on
            return out
        if func is aten.lift_fresh.default or func is aten.lift_fresh_copy.default:
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        node = self.graph.call_function(self._recorded_target(func, args), self.lookup(args),
                                        self.lookup(kwargs))
        node.meta["bw"] = self.backward_started
        node.meta["grad"] = torch.is_grad_enabled()
        if self.decomposing:
            node.meta[DECOMPOSED_FROM] = self.decomposing[0]
        if isinstance(out, torch.Tensor):
            if func._schema.is_mutable and id(out) in self.env:
                self.env[id(out)] = node   # in-place result aliases its input
                node.meta["traced_meta"] = TracedMeta.of(out)
                node.meta["bw"] = self.backward_started
            else:
                self.bind(out, node)
        elif isinstance(out, (tuple, list)):
            node.meta["traced_meta"] = None
            for i, o in enumerate(out):
                if isinstance(o, torch.Tensor):
                    g = self.graph.call_function(operator.getitem, (node, i))
                    self.bind(o, g)
        elif out is not None and not isinstance(out, (int, float, bool)):
            raise UntraceableGraph(f"{func} returned {type(out).__name__}")
        else:
            node.meta["traced_meta"] = None
            node.meta["value"] = out
        return out


# --- torch-level rewrites applied before tracing ------------------------------------------------

def _batch_norm(input, running_mean=None, running_var=None, weight=None, bias=None,
                training=False, momentum=0.1, eps=1e-5):
    # Why: F.batch_norm reaches aten.native_batch_norm, whose schema does not declare that it
    # writes running_mean/var, so functionalization would silently drop the update. The
    # _native_batch_norm_legit overload declares the writes.
    if running_mean is None:
        return aten._native_batch_norm_legit.no_stats(input, weight, bias, training, momentum, eps)[0]
    if not training:
        return aten._native_batch_norm_legit_no_training.default(
            input, weight, bias, running_mean, running_var, momentum, eps)[0]
    return aten._native_batch_norm_legit.default(
        input, weight, bias, running_mean, running_var, training, momentum, eps)[0]


def prepare(gm: fx.GraphModule):
    """Copy ``gm`` with get_attr tensors lifted to trailing placeholders.

    Returns (module, attr_names): the compiled callable passes ``getattr(gm, name)`` for each
    lifted attribute at call time, so parameter values are never baked into the artifact.
    """
    g = fx.Graph()
    env: dict = {}
    attrs: dict[str, fx.Node] = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            env[n] = g.node_copy(n)
    for n in gm.graph.nodes:
        if n.op == "get_attr" and isinstance(_getattr(gm, n.target), torch.Tensor) and n.target not in attrs:
            attrs[n.target] = g.placeholder("attr_" + n.target.replace(".", "_"))
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "get_attr" and n.target in attrs:
            env[n] = attrs[n.target]
            continue
        env[n] = g.node_copy(n, lambda a: env[a])
        if n.op == "call_function" and n.target is F.batch_norm:
            env[n].target = _batch_norm
        elif n.op == "call_function" and n.target is torch.batch_norm:
            env[n].target = _torch_batch_norm
    return fx.GraphModule(gm, g), list(attrs)


def _torch_batch_norm(input, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled=True):
    return _batch_norm(input, running_mean, running_var, weight, bias, training, momentum, eps)


def _getattr(obj, target: str):
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def graph_module(root, graph: fx.Graph) -> fx.GraphModule:
    """A GraphModule that writes and compiles its Python code only if it is ever called or
    printed. Why: tempa's own graphs (traced, joint forward/backward) are read node by node
    and rarely run; generating the code of a GPT-sized graph costs ~0.1 s each, 0.5-1 s of
    a compile."""
    try:
        from torch.fx._lazy_graph_module import _LazyGraphModule
    except ImportError:            # an older or newer torch without it: build the code now
        return fx.GraphModule(root, graph)
    return _LazyGraphModule(root, graph)


def _clone(t):
    if isinstance(t, torch.Tensor):
        c = t.detach().clone(memory_format=torch.preserve_format)
        if c.stride() != t.stride():
            c = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)
        return c
    return t


def _alias(t):
    """For the joint trace: a new tensor sharing ``t``'s memory, with no autograd history or
    hooks. Why not a clone: the joint trace replays a functional graph and refuses mutating
    ops in the backward, so nothing writes to its inputs, and copying every parameter
    (0.5 GB for GPT-124M) cost ~1 s per compile on the CPU. A tensor with a storage offset
    is still cloned (a clone starts at offset 0, which tracing records)."""
    if isinstance(t, torch.Tensor) and t.storage_offset() == 0 and t.layout == torch.strided:
        return t.detach()
    return _clone(t)


@dataclass
class Traced:
    gm: fx.GraphModule                 # functional ATen graph: inputs -> (outputs..., mutated...)
    num_outputs: int                   # user outputs come first
    mutated: list                      # input index for each trailing "new value" output
    constants: dict
    aliases: list = None               # OutputAlias or None per user output (output_aliases)


_SDPA = (F.scaled_dot_product_attention, aten.scaled_dot_product_attention.default)


# An inference trace keeps eager's fused CPU attention kernel for a call with a mask only
# from this many attention scores (batch x heads x queries x keys) up; below, the math
# decomposition, whose small matmuls and softmax tempa fuses, is the faster. Measured: the
# zoo's HF models (1152 scores a call) ran 8-19% slower a call fused (hf_gpt2_sdpa x0.81,
# hf_gpt2_cache x0.84, hf_t5_encoder_sdpa x0.92), Swin-T's windows (12288-98304 scores a
# call) 2x faster fused (benchmarks/README.md).
FUSED_MASKED_ATTENTION_MIN_SCORES = 4096


def _attention_for(gm, inputs, differentiable: bool):
    """Which CPU kernel scaled_dot_product_attention is traced through, per call (a mode
    that sees each call's tensors). A call with an attention mask or dropout goes through
    the math decomposition (1) when the graph may be differentiated (a training trace, some
    input requires grad): the fused CPU kernel's backward gives no gradient for a mask that
    requires one (T5's position bias) and NaN for fully masked rows, where the decomposed
    graph matches eager; (2) in an inference trace, below FUSED_MASKED_ATTENTION_MIN_SCORES.
    Everything else keeps the fused kernel, as eager runs it. Why not always the
    decomposition: its two batched matmuls, softmax and their backward made a ViT-B training
    step ~15% slower than the fused kernels, and Swin's masked window attention in inference
    twice as slow."""
    on_cpu = all(not isinstance(t, torch.Tensor) or t.device.type == "cpu" for t in inputs)
    if not on_cpu or not any(n.op == "call_function" and n.target in _SDPA for n in gm.graph.nodes):
        return contextlib.nullcontext()
    needs_grad = differentiable and any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs)
    return _AttentionKernel(needs_grad)


class _AttentionKernel(TorchFunctionMode):
    """Runs each masked (or dropped-out) attention call of a trace under the math backend
    where ``_attention_for`` says so."""

    def __init__(self, differentiated: bool):
        super().__init__()
        self.differentiated = differentiated

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _SDPA and self._math(args, kwargs):
            from torch.nn.attention import SDPBackend, sdpa_kernel
            with sdpa_kernel([SDPBackend.MATH]):
                return func(*args, **kwargs)
        return func(*args, **kwargs)

    def _math(self, args, kwargs) -> bool:
        def arg(i, name, default):
            return args[i] if len(args) > i else kwargs.get(name, default)
        mask, dropout = arg(3, "attn_mask", None), arg(4, "dropout_p", 0.0)
        dropped = not isinstance(dropout, (int, float)) or dropout != 0
        if mask is None and not dropped:
            return False
        if self.differentiated:
            return True
        q, k = arg(0, "query", None), arg(1, "key", None)
        scores = q.shape[:-1].numel() * k.shape[-2] if q.dim() >= 2 and k.dim() >= 2 else 0
        return scores < FUSED_MASKED_ATTENTION_MIN_SCORES


@contextlib.contextmanager
def rng_untouched():
    """Run a trace without moving torch's random generators. Why: tracing executes the
    graph, and its random ops (dropout, rand) draw from the default generators; without
    this the first call's results came from a generator the trace had advanced, so
    ``torch.manual_seed(s)`` before each call did not repeat the first call's values."""
    cpu = torch.get_rng_state()
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
    try:
        yield
    finally:
        torch.set_rng_state(cpu)
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


def trace_forward(gm: fx.GraphModule, inputs: list, decomps: dict, *, differentiable: bool) -> Traced:
    """The functional ATen graph of ``gm`` on ``inputs``. ``differentiable``: the trace is a
    training graph's forward, to be differentiated (``_attention_for``)."""
    graph = fx.Graph()
    rec = _Recorder(graph, decomps)
    clones = [_clone(t) for t in inputs]
    for i, t in enumerate(clones):
        ph = graph.placeholder(f"arg{i}")
        if isinstance(t, torch.Tensor):
            rec.bind(t, ph)
        else:
            ph.meta["traced_meta"] = None
            ph.meta["value"] = t
    fn = torch.func.functionalize(gm, remove="mutations")
    with torch.enable_grad(), _attention_for(gm, inputs, differentiable), nodynamo.resolved(), rng_untouched(), rec:
        out = fn(*clones)
    single = not isinstance(out, (tuple, list))
    outs = [out] if single else list(out)
    out_nodes = [rec.lookup(o) if isinstance(o, torch.Tensor) else o for o in outs]
    # Trailing copy_ nodes write new values into mutated inputs: turn them into outputs.
    ph_index = {n: i for i, n in enumerate(n for n in graph.nodes if n.op == "placeholder")}
    mutated, new_vals = [], []
    for n in list(graph.nodes):
        if n.op == "call_function" and n.target is aten.copy_.default and n.args[0] in ph_index:
            mutated.append(ph_index[n.args[0]])
            new_vals.append(n.args[1])
            graph.erase_node(n) if not n.users else None
    for n in graph.nodes:
        if n.op == "call_function" and getattr(n.target, "_schema", None) is not None and n.target._schema.is_mutable:
            raise UntraceableGraph(f"mutation left after functionalization: {n.target}")
    tensor_of = {node: t for t in rec.keep if (node := rec.env.get(id(t))) is not None}
    aliases = output_aliases(outs, clones, mutated, [tensor_of.get(n) for n in new_vals])
    for node, alias in zip(out_nodes, aliases):
        if alias is not None and alias.base == "input" and isinstance(node, fx.Node):
            # the caller hands out the input (or its view) itself: lowering need not make
            # this output's value new memory (lowerings._as_traced)
            node.meta[HANDED_OUT_AS_INPUT] = True
    graph.output(tuple(out_nodes) + tuple(new_vals))
    graph.eliminate_dead_code()
    root = torch.nn.Module()
    for k, v in rec.constants.items():
        setattr(root, k, v)
    res = Traced(graph_module(root, graph), len(outs), mutated, dict(rec.constants), aliases)
    res.single = single
    return res


# meta key of an output node whose value eager returns as an input or a view of one
HANDED_OUT_AS_INPUT = "handed_out_as_input"
# meta key of a node made by a decomposition: the outermost op decomposed (a var_mean of
# aten.native_layer_norm accumulates as eager's LayerNorm does, reductions.py _var)
DECOMPOSED_FROM = "decomposed_from"


@dataclass(frozen=True)
class OutputAlias:
    """A user output that eager returns as an input itself, or as a view of an input or of an
    earlier output. The compiled graph computes a copy; the caller hands out this instead
    (``base`` is "input" or "output", ``index`` its position). ``same`` is the base object
    itself (``x.add_(1); return x``); otherwise a view with these sizes and strides at
    ``offset`` elements from the base's own storage offset. ``dtype`` is the view's where
    it differs from the base's (``z.real`` of a complex ``z``, ``x.view(torch.int32)``): the
    base is viewed as that dtype first, and sizes, strides and offset count its elements."""
    base: str
    index: int
    same: bool
    size: tuple = ()
    stride: tuple = ()
    offset: int = 0
    dtype: torch.dtype | None = None

    def view_of(self, base: torch.Tensor) -> torch.Tensor:
        if self.dtype is not None:
            base = base.view(self.dtype)
        return torch.as_strided(base, self.size, self.stride, base.storage_offset() + self.offset)


def with_output_views(call, aliases, single=False):
    """``call`` handing out, for each output that eager returns as a view of an input or of
    another output (an OutputAlias that is not ``same``), that view of its base instead of
    the graph's copy. The view is made in the caller's grad mode, so autograd records it as
    it records eager's (its gradient reaches the base); an output that does not require
    grad although its base does is a view of the detached base (``x.detach()``: the
    detached input itself). ``single``: ``call`` returns its one output unwrapped."""
    views = [(i, a) for i, a in enumerate(aliases or ()) if a is not None and not a.same]
    if not views:
        return call

    def with_views(*args):
        outs = call(*args)
        outs = [outs] if single else list(outs)
        for i, a in views:
            base = args[a.index] if a.base == "input" else outs[a.index]
            if base.requires_grad and not outs[i].requires_grad:
                base = base.detach()
                if (a.dtype, a.size, a.stride, a.offset) == (None, tuple(base.shape), base.stride(), 0):
                    outs[i] = base
                    continue
            outs[i] = a.view_of(base)
        return outs[0] if single else tuple(outs)
    return with_views


def output_aliases(outs, clones, mutated, new_val_tensors) -> list:
    """OutputAlias (or None) for each user output, from the storages of the traced values.

    After functionalization a view of an unmutated input still shares the clone's storage and
    outputs that are views of each other share one storage; a mutated input's new value is a
    fresh tensor (its copy-back comes last), which stands for the input when it has the
    input's layout. A view of an output is handed out as a view of it only when that output
    covers its whole storage (else the shared base is a value the graph does not return)."""
    def key(t):
        return t.untyped_storage().data_ptr()

    def has_memory(t):
        # a storage of no bytes has no address (every one reads 0), so it is nobody's base;
        # a zero-element view of a real storage (``x[5:2]``) still is a view of it
        return isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() > 0

    def layout(t):
        return (tuple(t.shape), tuple(t.stride()), t.storage_offset())
    bases = {}                                  # storage -> (kind, index, base tensor)
    for j, c in enumerate(clones):
        if has_memory(c) and j not in mutated:
            bases.setdefault(key(c), ("input", j, c))
    for j, nv in zip(mutated, new_val_tensors):
        c = clones[j]
        if has_memory(nv) and layout(nv) == layout(c):
            bases[key(nv)] = ("input", j, nv)
    def whole(o):
        return o.storage_offset() == 0 and o.is_contiguous() and \
            o.numel() * o.element_size() == o.untyped_storage().nbytes()
    tensors = [(i, o) for i, o in enumerate(outs) if has_memory(o)]
    for i, o in tensors:
        if key(o) not in bases and whole(o):
            bases[key(o)] = ("output", i, o)
    aliases = [None] * len(outs)
    for i, o in tensors:
        hit = bases.get(key(o))
        if hit is None or hit[0] == "output" and hit[2] is o:
            continue                            # its own memory (or a base of others)
        kind, j, base = hit
        dtype = None
        if o.dtype != base.dtype:
            try:
                dtype, base = o.dtype, base.view(o.dtype)
            except RuntimeError:   # a layout that cannot be viewed as the dtype: a copy
                continue
        aliases[i] = OutputAlias(kind, j, o is hit[2], tuple(o.shape), tuple(o.stride()),
                                 o.storage_offset() - base.storage_offset(), dtype)
    return aliases
