"""Distributed training wrappers around compiled code: DDP, FSDP2 (``fully_shard``) and any
module whose hooks must run as eager runs them.

The wrappers' own Python (DDP's forward with its reducer calls, FSDP2's all-gather and
reduce-scatter hooks) is a sequence of C++ side effects on process-group state: capture
would break on the first of them and compile nothing. torch.compile solves this by not
tracing the wrapper and compiling the module underneath; tempa does the same, explicitly:

* ``tempa.compile(DDP(model))`` runs DDP's ``forward`` eagerly and the inner module's
  ``forward`` compiled. Each captured graph is cut at DDP's gradient-bucket boundaries and
  every piece is compiled on its own (its own forward and backward), so the parameters of a
  bucket get their gradients, and DDP starts that bucket's all-reduce, as soon as the
  backward of their piece is done, while the earlier pieces' backward still runs.
* A module with forward hooks (FSDP2 puts its unshard/reshard there) runs its hooks
  eagerly around its compiled ``forward``: FSDP2's collectives stay where it puts them.

Both rest on ``call_with_compiled_forward``: ``nn.Module.__call__`` reads ``self.forward``,
so the compiled forward is set as an instance attribute for the duration of one call.
"""
from __future__ import annotations

import contextlib

import torch
import torch.fx
from torch.nn.parallel import DistributedDataParallel

from . import counters, logs

_graph_log = logs.get("graphs")
_fallback_log = logs.get("fallbacks")


# -- hooks eager, forward compiled ------------------------------------------------------------

def has_module_hooks(mod: torch.nn.Module) -> bool:
    return bool(mod._forward_hooks or _pre_hooks_besides_lazy_init(mod) or mod._backward_hooks or
                mod._backward_pre_hooks)


def _pre_hooks_besides_lazy_init(mod: torch.nn.Module) -> bool:
    """A lazy module's own pre-hook (which creates its parameters on the first call) is no
    hook of the user's: capture runs it itself, once (calls.call_module)."""
    init = getattr(mod, "_initialize_hook", None)
    return any(init is None or key != init.id for key in mod._forward_pre_hooks)


def call_with_compiled_forward(mod: torch.nn.Module, compiled_forward, args, kwargs):
    """``mod(*args, **kwargs)`` as eager runs it (pre-hooks, backward hooks, forward hooks,
    global hooks), with ``compiled_forward`` in place of ``forward``."""
    with forward_replaced(mod, compiled_forward):
        return torch.nn.Module.__call__(mod, *args, **kwargs)


@contextlib.contextmanager
def forward_replaced(mod: torch.nn.Module, forward):
    """``mod.forward`` is ``forward`` inside the block (an instance attribute, which
    ``nn.Module.__call__`` reads first); restored afterwards, also when the block raises. A
    call of the same module nested in this one (recursion, activation checkpointing
    recomputing it in the backward) nests the same way."""
    saved = mod.__dict__.get("forward", _ABSENT)
    mod.__dict__["forward"] = forward
    try:
        yield
    finally:
        if saved is _ABSENT:
            mod.__dict__.pop("forward", None)
        else:
            mod.__dict__["forward"] = saved


_ABSENT = object()


@contextlib.contextmanager
def forwards_replaced(pairs):
    """``forward_replaced`` for every (module, forward) pair at once."""
    with contextlib.ExitStack() as stack:
        for mod, forward in pairs:
            stack.enter_context(forward_replaced(mod, forward))
        yield


# -- DDP ---------------------------------------------------------------------------------------

def is_ddp(model) -> bool:
    return isinstance(model, DistributedDataParallel)


def ddp_forward_runner(ddp, inner_forward):
    """A function running ``ddp(*args)`` eagerly, with the inner module's forward replaced
    by ``inner_forward`` (the compiled one) for the duration of the call."""
    inner = ddp.module

    def run(*args, **kwargs):
        with forward_replaced(inner, inner_forward):
            return ddp(*args, **kwargs)
    return run


def bucket_caps(ddp) -> tuple[int, int]:
    """(first bucket's byte cap, every later bucket's) as DDP's reducer uses them when it
    rebuilds its buckets after the first iteration (in gradient-ready order)."""
    config = getattr(ddp, "_bucket_config", None)
    cap = ddp.bucket_bytes_cap
    first = config.first_bucket_bytes_cap if config is not None else cap
    return min(first, cap), cap


def split_backend(backend, ddp):
    """Wrap a ``(gm, example_inputs) -> callable`` backend: cut each graph at DDP's bucket
    boundaries and compile every piece separately (see the module docstring)."""
    first_cap, cap = bucket_caps(ddp)

    def ddp_split(gm: torch.fx.GraphModule, example_inputs):
        pieces = bucket_partition(gm, example_inputs, first_cap, cap)
        n = max(pieces.values(), default=0) + 1
        if n == 1:
            _graph_log.info("DDP: compiled the inner module %s as one graph (its parameters "
                            "fill one bucket of bucket_bytes_cap=%d)", type(ddp.module).__name__,
                            cap)
        else:
            _graph_log.info("DDP: compiled the inner module %s, split into %d graphs at bucket "
                            "boundaries (bucket_bytes_cap=%d, first bucket %d)",
                            type(ddp.module).__name__, n, cap, first_cap)
        if n == 1:
            compiled = backend(gm, example_inputs)
            return _annotate(compiled, [compiled])
        counters.bump("graphs_compiled", n - 1)   # api counted the captured graph as one
        return chain_pieces(gm, pieces, backend)
    ddp_split.supports_dynamic = getattr(backend, "supports_dynamic", False)
    return ddp_split


def _annotate(run, pieces):
    """``run`` carrying ``ddp_pieces`` (what tests and tools read to see the split)."""
    try:
        run.ddp_pieces = pieces
        return run
    except AttributeError:   # a bound method cannot carry attributes: wrap it
        def run_pieces(*args):
            return run(*args)
        run_pieces.ddp_pieces = pieces
        if hasattr(run, "tempa_info"):
            run_pieces.tempa_info = run.tempa_info
        return run_pieces


def bucket_partition(gm, example_inputs, first_cap: int, cap: int) -> dict:
    """Node -> piece index, in graph order. Parameters are assigned to buckets the way DDP's
    reducer does it, in the order their gradients become ready (the reverse of their first
    use): a bucket closes once its bytes reach its cap (``first_cap`` for the first). The
    piece of a bucket starts at the first use of its earliest-used parameter."""
    nodes = list(gm.graph.nodes)
    order = {node: i for i, node in enumerate(nodes)}
    placeholders = [n for n in nodes if n.op == "placeholder"]
    params = [(node, t) for node, t in zip(placeholders, example_inputs)
              if isinstance(t, torch.nn.Parameter) and t.requires_grad and
              not getattr(t, "_ddp_ignored", False) and node.users]
    first_use = {node: min(order[u] for u in node.users) for node, _ in params}
    params.sort(key=lambda p: first_use[p[0]], reverse=True)   # gradient-ready order

    starts = []     # the first-use index of each bucket's earliest parameter
    size, limit = 0, first_cap
    for node, t in params:
        size += t.numel() * t.element_size()
        if size >= limit:
            starts.append(first_use[node])
            size, limit = 0, cap
    if size == 0 and starts:   # the earliest bucket closed exactly: it starts the graph
        starts.pop()
    cuts = sorted(starts)
    piece = 0
    partition = {}
    for node in nodes:
        if node.op in ("placeholder", "output"):
            continue
        while piece < len(cuts) and order[node] >= cuts[piece]:
            piece += 1
        partition[node] = piece
    return _renumber(partition)


def _renumber(partition: dict) -> dict:
    """Pieces numbered 0..n-1 without gaps (a cut before the first compute node is empty)."""
    used = sorted(set(partition.values()))
    index = {p: i for i, p in enumerate(used)}
    return {node: index[p] for node, p in partition.items()}


def chain_pieces(gm, partition, backend):
    """Split ``gm`` into its pieces and return a callable running them in order, each piece
    compiled by ``backend`` on its first call, with the tensors it receives then."""
    pieces, plan, output_template = split_graph(gm, partition)
    lazy = [_LazyPiece(piece, backend, f"{i + 1}/{len(pieces)}") for i, piece in enumerate(pieces)]
    steps = [(piece, inputs, outputs, drop) for piece, (inputs, outputs, drop) in zip(lazy, plan)]
    n_inputs = sum(1 for n in gm.graph.nodes if n.op == "placeholder")

    def run_pieces(*args):
        values = dict(zip(range(n_inputs), args))
        for piece, inputs, outputs, drop in steps:
            results = piece(*[values[i] for i in inputs])
            values.update(zip(outputs, results))
            for i in drop:       # activations no later piece reads: free them now
                del values[i]
        return torch.fx.node.map_aggregate(output_template, lambda i: values[i]
                                           if isinstance(i, _Slot) else i)
    return _annotate(run_pieces, lazy)


class _Slot(int):
    """A value's index in ``run_pieces``'s table (a distinct type from the graph's ints)."""


def split_graph(gm, partition):
    """The pieces of ``gm`` as GraphModules, in order, and for each piece (the slots it reads,
    the slots it writes, the slots dead after it); plus the graph's output with slots in
    place of nodes. A slot numbers a placeholder (by position) or a node's value."""
    nodes = list(gm.graph.nodes)
    slot = {}
    for node in nodes:
        if node.op == "placeholder":
            slot[node] = _Slot(len(slot))
    output_node = next(n for n in nodes if n.op == "output")
    n_pieces = max(partition.values(), default=-1) + 1
    members = [[n for n in nodes if partition.get(n) == k] for k in range(n_pieces)]

    def piece_of(user):   # the output node reads after every piece
        return n_pieces if user is output_node else partition[user]

    pieces, plan, last_read = [], [], {}
    for k, body in enumerate(members):
        graph = torch.fx.Graph()
        env, inputs = {}, []
        for node in body:
            for used in node.all_input_nodes:
                if used not in env and partition.get(used) != k:
                    env[used] = graph.placeholder(used.name)
                    env[used].meta = dict(used.meta)
                    inputs.append(slot[used])
                    last_read[slot[used]] = k
            env[node] = graph.node_copy(node, lambda n: env[n])
        exported = [n for n in body if any(piece_of(u) > k for u in n.users)]
        for node in exported:
            slot[node] = _Slot(len(slot))
        graph.output(tuple(env[n] for n in exported))
        pieces.append(torch.fx.GraphModule(gm, graph))
        plan.append((inputs, [slot[n] for n in exported]))
    output_template = torch.fx.node.map_arg(output_node.args[0], lambda n: slot[n])
    final = set(s for s in _slots_in(output_template))
    dead = [[s for s, k2 in last_read.items() if k2 == k and s not in final]
            for k in range(n_pieces)]
    return pieces, [(i, o, d) for (i, o), d in zip(plan, dead)], output_template


def _slots_in(template):
    found = []
    torch.fx.node.map_aggregate(template, lambda v: found.append(v) if isinstance(v, _Slot) else v)
    return found


class _LazyPiece(torch.nn.Module):
    """One bucket's graph: compiled by the backend on its first call (its inputs are the
    previous piece's real outputs, which carry the autograd state the backend needs)."""

    def __init__(self, gm, backend, name):
        super().__init__()
        self.gm = gm
        self.name = name
        self.__dict__["_backend"] = backend
        self.__dict__["compiled"] = None

    def forward(self, *inputs):
        compiled = self.compiled
        if compiled is None:
            # (outside any saved_tensors_hooks, as api's capture: the backend traces with grad)
            with outside_saved_tensors_hooks():
                compiled = self.__dict__["compiled"] = self._compile(list(inputs))
        return compiled(*inputs)

    def _compile(self, inputs):
        try:
            return self._backend(self.gm, inputs)
        except Exception as e:
            from .configuration import config
            if config.raise_on_failure:
                raise
            counters.bump("eager_fallbacks")
            _fallback_log.warning("tempa: DDP piece %s: the backend failed (%s: %s); running "
                                  "that piece with ATen ops instead", self.name,
                                  type(e).__name__, e)
            return self.gm.forward

    @property
    def tempa_info(self):
        return getattr(self.compiled, "tempa_info", None)


def outside_saved_tensors_hooks():
    """A context in which tensors saved for backward skip the caller's saved_tensors_hooks
    (activation checkpointing, offloading): capture and the backend run the code on clones
    with grad, and checkpoint would count those saves as the region's own (then raise: more
    tensors saved in the forward than in its recomputation). Identity hooks shadow the
    caller's; with no hooks active nothing is pushed (torch.func.grad refuses any)."""
    if torch._C._autograd._top_saved_tensors_default_hooks(False) is None:
        return contextlib.nullcontext()
    return torch.autograd.graph.saved_tensors_hooks(_same, _same)


def _same(t):
    return t
