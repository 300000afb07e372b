"""A graph holding value-dependent operations, compiled in pieces around them (the pass
``split_at_values``).

A value-dependent operation gives a result only the run knows: ``t.item()`` (a number),
``nonzero``, ``x[mask]``, ``masked_select``, ``unique_consecutive`` (a tensor whose size is
computed from values), ``x[mask] = v``. Capture keeps them in the graph, as torch.compile
does with ``capture_scalar_outputs`` and ``capture_dynamic_output_shape_ops``: their numbers
and sizes are unbacked symbols of its ShapeEnv (capture/graph.py, capture/scalars.py).
Generated kernels need every size before they run, so this pass cuts the graph at those
operations, as Inductor runs a fallback kernel between generated ones and reads the
unbacked sizes from its results:

- the value-dependent operation runs as its ATen call (a *cut*);
- each *piece* between cuts is compiled as any graph is (``tempa_backend``). A piece after
  a cut is given the cut's results as inputs: their value-sized dims are symbolic sizes its
  shape-generic code (dynamic.py) reads from them on each call, and a captured int it uses
  as a size (``torch.arange(n)``, ``x[:n]``) is a symbolic int input;
- Python arithmetic on captured numbers, comparisons and ``torch._check`` run in Python
  between the pieces (the *glue*), and a number that is an operand of tensor arithmetic
  (``x * v``) enters a piece as a 0-d tensor of the dtype that keeps eager's type promotion
  (``_operand_dtype``), so that no piece's code holds one call's value.

The driver is an FX graph of its own: the cuts' and the glue's nodes as captured, one call
per piece (``tempa_info.passes["split_at_values"]`` shows its code). Pieces chain through
autograd: a compiled piece whose inputs require grad is an autograd node of its own (its
training variant), and a cut is an ATen op autograd records.

Sizes 0 and 1: a piece whose value-sized dims are 0 or 1 on a call (an empty mask, one
match) runs as its torch-level graph, op by op, on that call, so that a max over nothing
raises and a size of 1 broadcasts as in eager; its generic code covers sizes from 2 up, as
for sizes read from inputs (the capture's ShapeEnv specializes 0 and 1 there).
"""
from __future__ import annotations

import operator
import time

import torch
import torch.fx as fx
from torch.amp import autocast_mode

from .. import logs
from .dynamic import _resize, dynamic_dims, from_values, symbol_ranges
from .entry import BackendInfo, _writes_in_place, run_graph, tempa_backend
from .lower.trace import rng_untouched

# How a node runs in the driver
CUT = "cut"          # a value-dependent operation: its ATen call
GLUE = "glue"        # Python on captured numbers (and 0-d tensors made of them)
PIECE = "piece"      # compiled, with the nodes next to it
DRIVER = "driver"    # read by the driver itself (a get_attr)

# Arithmetic where a captured number may be a 0-d tensor instead (capture's
# graph._SCALAR_CONSUMERS and their tensor-method and torch-function spellings): with the
# dtype _operand_dtype picks, the result's dtype and values are the number's.
_ARITHMETIC = {operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
               operator.mod, operator.lt, operator.le, operator.gt, operator.ge, operator.eq,
               operator.ne, operator.iadd, operator.isub, operator.imul, operator.itruediv,
               torch.add, torch.sub, torch.mul, torch.div, torch.true_divide,
               torch.floor_divide, torch.remainder}
_ARITHMETIC_METHODS = {"add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder",
                       "add_", "sub_", "mul_", "div_", "lt", "le", "gt", "ge", "eq", "ne"}
# Nodes that change grad mode or autocast for the nodes after them (see _refused)
_STATE_TARGETS = (torch._C._set_grad_enabled, autocast_mode._enter_autocast,
                  autocast_mode._exit_autocast)
_OWN_DTYPES = {bool: torch.bool, int: torch.int64, float: torch.float64}
_EXAMPLES = {bool: True, int: 3, float: 1.5}


def value_dependent_ops(gm: fx.GraphModule) -> list:
    """The nodes of ``gm`` whose results only the run knows (the cuts), in graph order."""
    if not any(_maybe_cut(n) for n in gm.graph.nodes):   # the common case, cheaply
        return []
    return [n for n, kind in _kinds(gm.graph).items() if kind == CUT]


def compile_in_pieces(gm: fx.GraphModule, example_inputs, *, mode=None, options=None):
    """``gm`` as compiled pieces around its value-dependent ops, each piece compiled by
    ``tempa_backend`` with ``mode`` and ``options``, except that a piece whose sizes come
    from values gets neither CUDA graphs nor autotuning (both are made per shape, here per
    value). Each piece compiles on its first call; that call is made here, on private
    copies of ``example_inputs``."""
    t0 = time.perf_counter()
    info = BackendInfo()
    info.passes["captured"] = gm
    why = _refused(gm)
    if why:
        return _whole_graph_as_aten(gm, info, why)
    driver, pieces, cuts = split(gm)
    info.passes["split_at_values"] = (
        f"{len(pieces)} compiled pieces around {len(cuts)} value-dependent ops "
        f"({', '.join(cuts)}); the driver:\n{driver.code.strip()}")
    def compile_piece(piece, inputs, sizes_from_values):
        return tempa_backend(piece, inputs, mode=None if sizes_from_values else mode,
                             options=options)
    for p in pieces:
        p.compile_piece, p.whole = compile_piece, info
    copies = [_private_copy(t) for t in example_inputs]
    with rng_untouched():
        driver.forward(*copies)
    info.pieces = [p.info for p in pieces]
    info.kernel_count = sum(p.info.kernel_count for p in pieces)
    info.used_gcc = any(p.info.used_gcc for p in pieces)
    info.from_disk_cache = any(p.info.kernel_count for p in pieces) and \
        all(p.info.from_disk_cache for p in pieces if p.info.kernel_count)
    info.aten_fallbacks = [f"{c} (value-dependent)" for c in cuts] + \
        [f for p in pieces for f in p.info.aten_fallbacks]
    info.compile_seconds = time.perf_counter() - t0     # the first call's run included
    info.notes.append(info.passes["split_at_values"].splitlines()[0])
    for p in pieces:
        if p.info.fallback_reason:
            info.notes.append(f"{p.name} runs with ATen calls: {p.info.fallback_reason}")
        elif p.info.dynamic:
            info.notes.append(f"{p.name}: {p.info.dynamic}")
    forward = driver.forward

    def in_pieces(*args):
        return forward(*args)
    in_pieces.tempa_info = info
    in_pieces.driver = driver
    return in_pieces


# -- which node runs how -------------------------------------------------------------------

def _maybe_cut(n) -> bool:
    """Could ``n`` be a cut? Only an ``item`` or a node with an unbacked symbol can."""
    if n.op == "call_method" and n.target == "item" or _writes_through_mask(n):
        return True
    return "unbacked_symbol" in n.meta or bool(_symbols_in(n.meta.get("example_value")))


def _kinds(graph) -> dict:
    """node -> CUT | GLUE | PIECE | DRIVER, for every node but placeholders and the output."""
    kinds: dict = {}
    valued: set = set()            # cuts and glue: what only the run knows
    symbols: dict = {}             # node -> the unbacked symbols of its value
    for n in graph.nodes:
        symbols[n] = _symbols(n)
        if n.op in ("placeholder", "output"):
            continue
        kind = _kind(n, valued, symbols)
        kinds[n] = kind
        if kind in (CUT, GLUE):
            valued.add(n)
    return kinds


def _kind(n, valued, symbols) -> str:
    if n.op == "get_attr":
        return DRIVER
    if n.op == "call_method" and n.target == "item":
        return CUT
    inputs = n.all_input_nodes
    if _writes_through_mask(n):
        return CUT                 # x[mask] = v: index_put_ with a boolean index
    if not _has_tensor(n.meta.get("example_value")):
        # a number, a flag or None (torch._check): Python's where it depends on a value
        return GLUE if symbols[n] or any(a in valued for a in inputs) else PIECE
    if n.target is operator.getitem and inputs and inputs[0] in valued:
        return GLUE                # an item of a cut's tuple (torch.unique(..., return_counts))
    if symbols[n] - set().union(*(symbols[a] for a in inputs)):
        return CUT                 # its result has a size no input has: computed from values
    if n.target is torch.scalar_tensor and any(a in valued for a in inputs):
        return GLUE
    return PIECE


def _writes_through_mask(n) -> bool:
    if n.op != "call_function" or n.target is not operator.setitem or len(n.args) < 2:
        return False
    index = n.args[1] if isinstance(n.args[1], (tuple, list)) else (n.args[1],)
    return any(isinstance(i, fx.Node) and getattr(i.meta.get("example_value"), "dtype", None)
               in (torch.bool, torch.uint8) for i in index)


def _is_tensor(value) -> bool:
    """A tensor's example value: a (fake) tensor, or capture's metadata-only stand-in."""
    return isinstance(value, torch.Tensor) or (
        hasattr(value, "shape") and hasattr(value, "dtype") and hasattr(value, "device"))


def _has_tensor(value) -> bool:
    if _is_tensor(value):
        return True
    return isinstance(value, (tuple, list)) and any(_has_tensor(v) for v in value)


def _symbols(node) -> set:
    """Names of the unbacked symbols in a node's example value (sizes of a tensor, a number)
    and in the symbol capture gave the number it computes (meta["unbacked_symbol"])."""
    return _symbols_in(node.meta.get("example_value")) | \
        _symbols_in(node.meta.get("unbacked_symbol"))


def _symbols_in(value) -> set:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return {str(s) for s in value.node.expr.free_symbols if from_values(str(s))}
    if _is_tensor(value):
        return set().union(*(_symbols_in(s) for s in value.shape)) if len(value.shape) else set()
    if isinstance(value, (tuple, list)):
        return set().union(*(_symbols_in(v) for v in value)) if value else set()
    return set()


def _refused(gm) -> str | None:
    """Why the graph runs whole as ATen calls instead of in pieces, if it must."""
    if any(n.op == "call_function" and n.target in _STATE_TARGETS for n in gm.graph.nodes):
        return ("a value-dependent op in a graph that switches grad mode or autocast: its "
                "pieces would each run in the caller's mode")
    return None


def _whole_graph_as_aten(gm, info, why):
    info.fallback_reason = why
    info.aten_fallbacks = ["<whole graph>"]
    logs.get("fallbacks").warning("tempa backend: running a graph with eager ATen calls: %s", why)

    def compiled(*args):
        return run_graph(gm, args)
    compiled.tempa_info = info
    return compiled


def _describe(n) -> str:
    t = n.target
    return t if isinstance(t, str) else getattr(t, "__name__", str(t))


# -- the split -----------------------------------------------------------------------------

def split(gm: fx.GraphModule):
    """(driver, pieces, cuts): the driver is ``gm`` with each run of PIECE nodes replaced by
    one call of a ``Piece`` (a GraphModule of those nodes), the cuts and glue as captured;
    ``cuts`` names the value-dependent ops."""
    graph = _copy(gm.graph)
    kinds = _kinds(graph)
    _numbers_as_operands(graph, kinds)
    valued = {n for n, kind in kinds.items() if kind in (CUT, GLUE)}
    driver = fx.Graph()
    env: dict = {}
    pieces = []
    for n in graph.nodes:
        if n.op == "placeholder":
            env[n] = driver.node_copy(n)
    for step in _steps(graph, kinds):
        if isinstance(step, fx.Node):
            env[step] = driver.node_copy(step, lambda a: env[a])
            continue
        members = set(step)
        inputs = list(dict.fromkeys(a for m in step for a in m.all_input_nodes if a not in members))
        outputs = [m for m in step if any(u not in members for u in m.users)]
        piece = Piece(gm, step, inputs, outputs, f"piece {len(pieces) + 1}", valued)
        pieces.append(piece)
        call = driver.call_function(piece.callable(), tuple(env[a] for a in inputs))
        for k, m in enumerate(outputs):
            env[m] = driver.call_function(operator.getitem, (call, k))
    out = next(n for n in graph.nodes if n.op == "output")
    driver.output(fx.node.map_arg(out.args[0], lambda a: env[a]))
    cuts = [_describe(n) for n, kind in kinds.items() if kind == CUT]
    return fx.GraphModule(gm, driver), pieces, cuts


def _copy(graph: fx.Graph) -> fx.Graph:
    """A copy of ``graph`` without the 0-d tensors capture made of numbers that nothing reads
    (each captured number has one; they compute nothing)."""
    g = fx.Graph()
    g.output(g.graph_copy(graph, {}))
    for n in reversed(list(g.nodes)):
        if n.op == "call_function" and n.target is torch.scalar_tensor and not n.users:
            g.erase_node(n)
    return g


def _numbers_as_operands(graph, kinds) -> None:
    """A captured number that is an operand of tensor arithmetic (``x * v``) becomes a 0-d
    tensor made in the glue (``torch.scalar_tensor(v, dtype=..., device=...)``): the
    piece's code then reads it from memory instead of holding one call's value."""
    for n in list(graph.nodes):
        if kinds.get(n) != PIECE or not _is_arithmetic(n) or len(n.args) < 2:
            continue
        args = list(n.args)
        for pos in (0, 1):
            number, other = args[pos], args[1 - pos]
            if not (isinstance(number, fx.Node) and number in kinds
                    and kinds[number] in (CUT, GLUE) and isinstance(other, fx.Node)):
                continue
            kind = _number_kind(number)
            tensor = other.meta.get("example_value")
            if kind is None or not _is_tensor(tensor):
                continue
            dtype = _operand_dtype(kind, tensor)
            with graph.inserting_before(n):
                t = graph.call_function(torch.scalar_tensor, (number,),
                                        {"dtype": dtype, "device": tensor.device})
            t.meta["example_value"] = torch.empty((), dtype=dtype)
            kinds[t] = GLUE
            args[pos] = t
        n.args = tuple(args)


def _is_arithmetic(n) -> bool:
    return (n.op == "call_function" and n.target in _ARITHMETIC) or \
        (n.op == "call_method" and n.target in _ARITHMETIC_METHODS)


def _number_kind(node):
    """bool, int or float: the Python type of the number a node computes (None: not one)."""
    value = node.meta.get("example_value")
    for kind, sym in ((bool, torch.SymBool), (int, torch.SymInt), (float, torch.SymFloat)):
        if type(value) is kind or isinstance(value, sym):
            return kind
    return None


def _category(dtype) -> int:
    return 0 if dtype is torch.bool else 3 if dtype.is_complex else \
        2 if dtype.is_floating_point else 1


def _operand_dtype(kind, tensor) -> torch.dtype:
    """The dtype of a 0-d tensor that stands for a Python number of type ``kind`` beside
    ``tensor`` with eager's result. Beside a tensor with dims, of the number's category or a
    higher one, a 0-d tensor of the number's own dtype (bool, int64, float64) promotes it no
    more than the number does, and holds its value exactly; elsewhere (a float beside an int
    tensor, anything beside a 0-d tensor) the dtype the number gives the result."""
    own = _OWN_DTYPES[kind]
    dims = len(tensor.shape)
    if dims > 0 and _category(own) <= _category(tensor.dtype):
        return own
    return torch.result_type(torch.empty((1,) * dims, dtype=tensor.dtype), _EXAMPLES[kind])


def _steps(graph, kinds) -> list:
    """The driver's steps in order: a node (cut, glue, get_attr) or a list of PIECE nodes.
    A cut or glue node that reads nothing of the open piece runs before it (the piece grows
    on past it), unless one of the two writes in place: what either reads must be eager's."""
    steps, open_piece, members, writes = [], [], set(), False
    for n in graph.nodes:
        if n.op in ("placeholder", "output"):
            continue
        if kinds[n] == PIECE:
            open_piece.append(n)
            members.add(n)
            writes = writes or _writes_in_place(n)
            continue
        if open_piece and (writes or _writes_in_place(n)
                           or any(a in members for a in n.all_input_nodes)):
            steps.append(open_piece)
            open_piece, members, writes = [], set(), False
        steps.append(n)
    if open_piece:
        steps.append(open_piece)
    return steps


# -- a piece -------------------------------------------------------------------------------

class Piece:
    """One run of PIECE nodes as a GraphModule, compiled on its first call for each pattern
    of which inputs require grad (the variants a compiled graph builds follow that pattern,
    which the frontend guards for the graph's own inputs, not for these); on a call where
    one of its value-sized dims is 0 or 1, the GraphModule runs op by op."""

    def __init__(self, root, nodes, inputs, outputs, name, valued):
        graph = fx.Graph()
        env: dict = {}
        for a in inputs:
            ph = env[a] = graph.placeholder(a.name)
            ph.meta = dict(a.meta)
            symbol = a.meta.get("unbacked_symbol")
            if isinstance(symbol, torch.SymInt):
                ph.meta["example_value"] = symbol   # a number used as a size: a symbolic int
        for m in nodes:
            env[m] = graph.node_copy(m, lambda a: env[a])
        graph.output(tuple(env[m] for m in outputs))
        self.gm = fx.GraphModule(root, graph)
        self.name = name
        self.info = BackendInfo()
        self.whole = None                   # the split graph's BackendInfo
        self.compile_piece = None
        self.compiled: dict = {}            # requires_grad pattern -> callable
        self.dims = [(i, d, s) for i, d, s in dynamic_dims(self.gm) if from_values(s)]
        self.edges = [(i, d) for i, d, _ in self.dims]
        self.ranges = symbol_ranges(self.gm)
        # numbers computed from values that the piece's code would hold as constants (a
        # float or a bool that is no operand of arithmetic, an int without a size symbol)
        self.held = [a.name for a in inputs if a in valued and not _has_tensor(
            a.meta.get("example_value")) and not isinstance(
            a.meta.get("unbacked_symbol", a.meta.get("example_value")), torch.SymInt)]

    def callable(self):
        """``run`` as a function named after the piece (``tempa.piece_1`` in the driver's
        code)."""
        run = self.run

        def piece(*args):
            return run(*args)
        piece.__name__ = piece.__qualname__ = self.name.replace(" ", "_")
        piece.__module__ = "tempa"
        return piece

    def run(self, *args):
        key = tuple(a.requires_grad for a in args if isinstance(a, torch.Tensor))
        call = self.compiled.get(key)
        if call is None:
            call = self.compiled[key] = self._compile(args)
        if self.edges and self._at_edge(args):
            return run_graph(self.gm, args)
        return call(*args)

    def _at_edge(self, args) -> bool:
        for i, d in self.edges:
            if (args[i] if d is None else args[i].shape[d]) < 2:
                return True
        return False

    def _compile(self, args):
        if self.held:
            return self._as_aten(f"the numbers {', '.join(self.held)}, computed from tensor "
                                 "values, are arguments that are neither sizes nor operands of "
                                 "arithmetic: its code would hold one call's values")
        compiled = self.compile_piece(self.gm, self._generic_examples(list(args)), bool(self.dims))
        info = getattr(compiled, "tempa_info", None)
        if info is not None and not self.compiled:        # the first build: its record
            self.info = info
            info.notes.insert(0, f"{self.name} of a graph split at value-dependent ops")
        elif info is not None:                            # another requires_grad pattern
            self.info.kernel_count += info.kernel_count
            self.info.notes.append(f"built again for a new requires_grad pattern: "
                                   f"{info.kernel_count} kernels")
            if self.whole is not None:
                self.whole.kernel_count += info.kernel_count
        return compiled

    def _as_aten(self, why):
        self.info.fallback_reason = why
        self.info.aten_fallbacks = ["<whole piece>"]
        logs.get("fallbacks").warning("tempa backend: running %s of a graph split at "
                                      "value-dependent ops with eager ATen calls: %s",
                                      self.name, why)
        gm = self.gm

        def aten(*args):
            return run_graph(gm, args)
        return aten

    def _generic_examples(self, args):
        """The arguments to compile with: a value-sized dim below 2 on this call (the piece
        runs op by op on it) is moved to a size in its range from 2 up, for the code that
        serves the calls to come."""
        if not (self.edges and self._at_edge(args)):
            return args
        values = {}
        for _, _, s in self.dims:
            lo, hi = self.ranges.get(s, (None, None))
            low = max(2, lo) if lo is not None else 2
            values[s] = low + 2 if hi is None or low + 2 <= hi else low
        per_input: dict = {}
        for i, d, s in self.dims:
            per_input.setdefault(i, {})[d] = values[s]
        return [(per_input[i][None] if None in per_input[i] else _resize(a, per_input[i]))
                if i in per_input else a for i, a in enumerate(args)]


def _private_copy(t):
    """A copy of an example input for the first call made here: its own memory (the pieces
    may write to it), its requires_grad, its strides."""
    if not isinstance(t, torch.Tensor):
        return t
    c = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t.detach())
    return c.requires_grad_(t.requires_grad) if (t.is_floating_point() or t.is_complex()) else c
