"""Torch-level FX graph -> functional ATen FX graph, and the joint forward/backward graph.

Why not ``make_fx``: it imports the dynamo and inductor packages on first use (3-4 s
of cold start on this machine), and so does anything that runs meta/fake kernels
(``torch._disable_dynamo``). This module records ATen calls with a small
``TorchDispatchMode`` while running the graph on *real* tensors (private clones, so user
state never changes during compilation; the joint trace, which never writes its inputs,
reads them through aliases). That costs one eager execution of the graph at
compile time and buys exact shapes/strides/dtypes, autocast as eager applies it, and no
meta-kernel gaps. ``torch.func.functionalize`` turns mutations into functional ops plus
trailing ``copy_`` nodes into the mutated inputs, which the wrapper performs explicitly.

The joint graph (for autograd) replays the functional forward graph on tensors that require
grad, then records what ``torch.autograd.grad`` runs. Nodes recorded before the backward
marker are the forward; everything after is the backward; forward values the backward reads
are the saved tensors (a "default partition").
"""
from __future__ import annotations

import contextlib

import operator
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn.functional as F
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
            with self:
                r = self.decomps[func](*args, **kwargs)
            if r is not NotImplemented:
                return r
        if _DATA_DEPENDENT & set(func.tags) and not _static_index(func, args):
            raise UntraceableGraph(f"data-dependent op {func}")
        if self.strict_functional and func._schema.is_mutable:
            raise UntraceableGraph(f"mutating op {func} in the backward")
        if func is aten.lift_fresh.default or func is aten.lift_fresh_copy.default:
            return func(*args, **kwargs)
        out = func(*args, **kwargs)
        node = self.graph.call_function(self._recorded_target(func, args), self.lookup(args),
                                        self.lookup(kwargs))
        node.meta["bw"] = self.backward_started
        node.meta["grad"] = torch.is_grad_enabled()
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


def _attention_for(gm, inputs):
    """When the graph may be differentiated (some input requires grad), trace
    scaled_dot_product_attention through its math decomposition on the CPU if a call has an
    attention mask or dropout: the fused CPU kernel's backward gives no gradient for a mask
    that requires one (T5's position bias) and NaN for fully masked rows, where the
    decomposed graph matches eager. Calls without either (ViT, Whisper's encoder, a causal
    decoder without padding) keep the fused kernel and its backward, as eager runs them.
    Why: the decomposition's two batched matmuls, softmax and their backward made a ViT-B
    training step ~15% slower than the fused kernels (benchmarks/README.md)."""
    needs_grad = any(isinstance(t, torch.Tensor) and t.requires_grad for t in inputs)
    on_cpu = all(not isinstance(t, torch.Tensor) or t.device.type == "cpu" for t in inputs)
    if needs_grad and on_cpu and any(_masked_or_dropped(n) for n in gm.graph.nodes
                                     if n.op == "call_function" and n.target in _SDPA):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel([SDPBackend.MATH])
    return contextlib.nullcontext()


def _masked_or_dropped(node) -> bool:
    """An SDPA call whose mask may be a tensor or whose dropout may be nonzero."""
    def arg(i, name, default):
        return node.args[i] if len(node.args) > i else node.kwargs.get(name, default)
    dropout = arg(4, "dropout_p", 0.0)
    return arg(3, "attn_mask", None) is not None or not isinstance(dropout, (int, float)) or dropout != 0


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


def trace_forward(gm: fx.GraphModule, inputs: list, decomps: dict) -> Traced:
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
    with torch.enable_grad(), _attention_for(gm, inputs), nodynamo.resolved(), rng_untouched(), rec:
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
    graph.output(tuple(out_nodes) + tuple(new_vals))
    graph.eliminate_dead_code()
    root = torch.nn.Module()
    for k, v in rec.constants.items():
        setattr(root, k, v)
    res = Traced(graph_module(root, graph), len(outs), mutated, dict(rec.constants), aliases)
    res.single = single
    return res


# --- the convolution layout policy -------------------------------------------------------------

# Where 4-D convolutions run: "eager" (the layouts eager gives them) or "channels_last"
# (NHWC: the input and weight of each convolution converted where they are not already).
# Why: cuDNN's bf16/fp16 tensor-core convolutions work in NHWC, so an NCHW convolution pays
# transposes inside cuDNN (forward and both backward ones); Inductor's layout optimization
# runs CUDA convolutions channels-last too. The conversion is an op in the traced graph, so
# the traced metas of what follows a convolution (eager's TensorIterator keeps the layout
# of its inputs) are channels-last: the pointwise kernels between convolutions read and
# write NHWC and no extra copy is made, and a weight is converted in the kernel that casts
# it to bf16 under autocast. What the user sees keeps eager's layout: each returned tensor
# gets the strides the eager-layout trace gave it, each gradient its input's layout (as
# AccumulateGrad gives .grad), and a mutated input is written in its own strides (the
# copy-back). The target chooses (config.gpu_conv_layout, config.cpu_conv_layout); a
# shape-generic graph keeps eager's layouts. A grouped convolution with several channels
# per group keeps its layout (cuDNN's NHWC grouped kernels are slow; Inductor skips such
# graphs too); depthwise ones convert.
CONV_LAYOUTS = ("eager", "channels_last")


def _wants_channels_last(n) -> bool:
    """Is ``n`` a 4-D convolution whose input or weight is not channels-last yet?"""
    if n.op != "call_function" or n.target is not aten.convolution.default or len(n.args) < 9:
        return False
    x, w = (a.meta.get("traced_meta") if isinstance(a, fx.Node) else None for a in n.args[:2])
    if x is None or w is None or len(x.shape) != 4 or len(w.shape) != 4:
        return False
    groups, transposed = n.args[8], n.args[6]
    per_group = w.shape[0] // groups if transposed else w.shape[1]
    if groups > 1 and per_group > 1:
        return False
    return not (is_channels_last(x) and is_channels_last(w))


def is_channels_last(tm) -> bool:
    """Is the traced value ``tm`` (a TracedMeta of a 4-D tensor) laid out channels-last?"""
    return torch.empty_strided(tm.shape, tm.stride, device="meta").is_contiguous(
        memory_format=torch.channels_last)


def converts_convolutions(gm: fx.GraphModule) -> int:
    """How many convolutions of the functional graph ``gm`` the channels-last policy converts."""
    return sum(_wants_channels_last(n) for n in gm.graph.nodes)


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
            env[n] = _replayed(n.target, args, kwargs)
    raise AssertionError("a graph without an output node")


def _in_traced_layout(t, node):
    """``t`` with the strides ``node`` was traced with (eager's), copied where they differ."""
    tm = node.meta.get("traced_meta") if isinstance(node, fx.Node) else None
    if not isinstance(t, torch.Tensor) or tm is None or tuple(t.stride()) == tuple(tm.stride):
        return t
    return _Restrided.apply(t, tuple(tm.stride))


def _grad_in_input_layout(g, inp):
    """The gradient ``g`` of ``inp`` in the layout AccumulateGrad gives ``.grad``: ``inp``'s
    strides where it is dense, else contiguous."""
    if g is None:
        return g
    want = tuple(inp.stride()) if _dense(inp.shape, inp.stride()) else tuple(_contiguous(inp.shape))
    return g if tuple(g.stride()) == want else _restrided(g, want)


def _dense(shape, stride) -> bool:
    """Do these strides cover one block of memory once, in some order of the dims?"""
    expected = 1
    for st, size in sorted((st, size) for size, st in zip(shape, stride) if size != 1):
        if st != expected:
            return False
        expected *= size
    return True


def _contiguous(shape) -> tuple:
    return torch.empty(shape, device="meta").stride()


def _restrided(t, stride):
    """``t`` copied into memory of exactly ``stride`` (size-1 dims included): ATen's
    functional copy keeps its destination's strides, and lowers to one kernel writing them."""
    return aten.copy.default(torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device), t)


class _Restrided(torch.autograd.Function):
    """``_restrided`` with its gradient passed through (aten.copy has no derivative)."""

    @staticmethod
    def forward(ctx, t, stride):
        return _restrided(t, stride)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def _channels_last_backward(grad, inp, weight, *rest, **kwargs):
    """convolution_backward with a channels-last gradient where its input is channels-last
    (cuDNN would transpose the gradient itself); the decomposition the channels-last joint
    trace records the backward with."""
    if grad.dim() == 4 and inp.dim() == 4 and inp.is_contiguous(memory_format=torch.channels_last) \
            and not grad.is_contiguous(memory_format=torch.channels_last):
        return aten.convolution_backward.default(grad.contiguous(memory_format=torch.channels_last),
                                                 inp, weight, *rest, **kwargs)
    return NotImplemented


_CHANNELS_LAST_BACKWARD = {aten.convolution_backward.default: _channels_last_backward}


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
    with _attention_for(traced.gm, inputs), nodynamo.resolved(), rng_untouched(), rec:
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
# The hard activations are kept whole for a different reason, their kinks: they decompose
# into clamp, whose gradient passes at the bounds (and at NaN) where eager's own backward
# passes none (hardtanh_backward is zero at x <= min_val and x >= max_val, so ReLU6 at
# exactly 0 and 6; hardsigmoid's at x = +-3; hardswish's is 0 at -3 and 1 at 3).
KEEP_WHOLE_FOR_AUTOGRAD = frozenset({aten._softmax, aten._log_softmax, aten.logsumexp,
                                     aten.native_layer_norm, aten.gelu, aten.silu,
                                     aten.hardtanh, aten.hardsigmoid, aten.hardswish})


def trace_training(gm: fx.GraphModule, inputs: list, decomps: dict, conv_layout: str = "eager") -> Joint:
    """The joint forward/backward graph of ``gm``: trace a forward that keeps the ops of
    KEEP_WHOLE_FOR_AUTOGRAD whole, then replay it with grad (``trace_joint``), its
    convolutions in ``conv_layout`` (see CONV_LAYOUTS)."""
    forward_decomps = {op: fn for op, fn in decomps.items()
                       if op.overloadpacket not in KEEP_WHOLE_FOR_AUTOGRAD}
    traced = trace_forward(gm, inputs, forward_decomps)
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


def _replayed(target, args, kwargs):
    """One node of the functional forward, replayed with grad by the joint trace."""
    if target is aten.as_strided.default and not kwargs and _is_restride(*args, *[None] * (4 - len(args))):
        return _Restride.apply(*args, *[None] * (4 - len(args)))
    return target(*args, **kwargs)


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
            elif n.meta.get("bw") or n.op == "get_attr" or (n.op == "call_function" and n.target in _RECOMPUTE):
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
        via = via_inputs(n, memo)
        return via if via is not None and via < own else None

    def keep(n, memo):
        """Bytes to keep in the forward so that ``n`` is available in the backward."""
        if n in needed or n in live_bw or n in user_outputs:
            return 0
        if n not in memo:
            memo[n] = None                # (a DAG: only guards against surprises)
            if n.op == "call_function" and n.target in _RECOMPUTE:
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
