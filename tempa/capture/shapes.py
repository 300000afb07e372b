"""Symbolic sizes: one graph for every batch size or sequence length.

A dynamic dimension enters capture as a ``torch.SymInt`` backed by PyTorch's ShapeEnv
(part of torch.fx's symbolic-shapes layer). Shape arithmetic in the user's code (``B * T``,
``C // n_head``) then builds sympy expressions, and every decision the code or an operator
makes about a size (``if T > 512``, a ``view`` that needs divisibility, a broadcast that
needs ``s0 != 1``) is recorded by the ShapeEnv as a guard. This module

- chooses which dimensions are symbolic (``SymbolicInputs``),
- turns a SymInt used by a graph op into FX nodes (``size`` of the input it came from, then
  ``operator`` arithmetic), so the graph computes sizes from its inputs at run time, and
- renders the ShapeEnv's guards and value ranges as Python over the entry's arguments.
"""
from __future__ import annotations

import dataclasses
import operator

import sympy
import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import ShapeEnv, DimDynamic, StatelessSymbolicContext, \
    free_unbacked_symbols
from torch._guards import GuardSource, Source
from torch.utils._sympy import functions as symfn

from .breaks import Unsupported


def make_shape_env() -> ShapeEnv:
    # Sizes 0 and 1 stay static, as in torch.compile: whether a dim is 1 decides
    # broadcasting and contiguity, so a graph for size >= 2 stays free of such cases.
    return ShapeEnv(specialize_zero_one=True, duck_shape=False)


@dataclasses.dataclass(frozen=True)
class IntSource(Source):
    """Where a symbolic Python int was read (the ShapeEnv names each symbol by a source)."""
    expr: str

    @property
    def name(self) -> str:
        return self.expr

    def guard_source(self):
        return GuardSource.LOCAL


class SymbolicSizes:
    """Which symbol stands for which input dimension (or input int), and the FX nodes
    computing them."""

    def __init__(self, graph: fx.Graph, shape_env: ShapeEnv):
        self.graph = graph
        self.env = shape_env
        # symbol -> [(tensor expression, dim, placeholder)]; dim None: the placeholder is
        # the int itself (an int input), read at the expression, bound to a local of the
        # entry before the graph runs (``int_locals``)
        self.sources: dict[sympy.Symbol, list[tuple[str, int | None, fx.Node]]] = {}
        self.int_locals: dict[sympy.Symbol, str] = {}
        self._nodes: dict[sympy.Expr, fx.Node] = {}

    def context_for(self, tensor: torch.Tensor, dims) -> StatelessSymbolicContext:
        return StatelessSymbolicContext(dynamic_sizes=[
            DimDynamic.DYNAMIC if d in dims else DimDynamic.STATIC for d in range(tensor.dim())])

    def register(self, fake: torch.Tensor, expr: str, node: fx.Node) -> None:
        for d, size in enumerate(fake.shape):
            if isinstance(size, torch.SymInt):
                sym = size.node.expr
                if isinstance(sym, sympy.Symbol):
                    self.sources.setdefault(sym, []).append((expr, d, node))

    def int_input(self, value: int, expr: str, node: fx.Node, local: str) -> torch.SymInt:
        """The Python int ``value`` read at ``expr`` as a symbol backed by its value (as a
        dynamic size is): the graph input ``node``, so every decision made on it (a branch,
        ``max``, an index, a shape) becomes a guard on the symbol, not on this value. Not
        assumed positive, and 0 and 1 are not specialized (a counter starts at 0)."""
        source = IntSource(expr)
        sym = self.env.create_unspecified_symbol(value, source=source, dynamic_dim=DimDynamic.DYNAMIC)
        self.sources[sym] = [(expr, None, node)]
        self.int_locals[sym] = local
        return self.env.create_symintnode(sym, hint=value, source=source)

    def names(self, *, in_body: bool = False) -> dict:
        """symbol -> the Python expression that reads it: in the guards, or (``in_body``)
        in the entry's body after the graph, where an int input is the local bound before
        the graph ran (the side effects replayed there may have written its attribute)."""
        out = {}
        for sym, src in self.sources.items():
            expr, dim, _ = src[0]
            if dim is not None:
                out[sym] = f"{expr}.shape[{dim}]"
            else:
                out[sym] = self.int_locals[sym] if in_body else expr
        return out

    def bind(self, symbol: sympy.Symbol, node: fx.Node) -> None:
        """``node`` computes the unbacked ``symbol`` (a captured ``.item()``)."""
        self._nodes[symbol] = node

    def bind_unbacked_sizes(self, fake: torch.Tensor, node: fx.Node) -> None:
        """A size of the result ``node`` that is a new unbacked symbol (the length of
        ``unique_consecutive``'s result) is computed as ``node.size(d)``."""
        for d, size in enumerate(fake.shape):
            if isinstance(size, torch.SymInt):
                sym = size.node.expr
                if isinstance(sym, sympy.Symbol) and sym not in self._nodes and \
                        sym not in self.sources and free_unbacked_symbols(size):
                    self._nodes[sym] = self.graph.call_method("size", (node, d))

    @property
    def active(self) -> bool:
        return bool(self.sources)

    # -- sizes used by graph operations ------------------------------------------------
    def node_for(self, value: torch.SymInt):
        """An FX node (or int) computing ``value`` at run time."""
        expr = self.env.replace(value.node.expr)
        return self._build(expr)

    def float_node_for(self, value: torch.SymFloat):
        """A float computed from sizes (``1.0 / x.shape[0]``): an FX node, or, for an
        expression this module cannot build, the value itself with a guard on it."""
        try:
            return self._build(self.env.replace(value.node.expr))
        except Unsupported:
            return float(value)   # specializes: the guard keeps it correct

    def expr_node(self, expr):
        """An FX node (or constant) computing the sympy ``expr`` (a relation too) at run time."""
        expr = self.env.replace(expr)
        for rel, op in _OPERATORS.items():
            if isinstance(expr, rel):
                return self.graph.call_function(op, (self._build(expr.lhs), self._build(expr.rhs)))
        return self._build(expr)

    def _build(self, expr):
        if isinstance(expr, (int, sympy.Integer)):
            return int(expr)
        if isinstance(expr, float):
            return expr
        hit = self._nodes.get(expr)
        if hit is not None:
            return hit
        if isinstance(expr, sympy.Symbol):
            src = self.sources.get(expr)
            if not src:
                raise Unsupported("symbolic size", f"a size {expr} with no input")
            _, dim, placeholder = src[0]
            if dim is None:
                return placeholder   # an int input
            node = self.graph.call_method("size", (placeholder, dim))
        elif isinstance(expr, sympy.Add):
            node = self._fold(operator.add, expr.args)
        elif isinstance(expr, sympy.Mul):
            node = self._fold(operator.mul, expr.args)
        elif isinstance(expr, symfn.FloorDiv):
            node = self.graph.call_function(operator.floordiv, tuple(self._build(a) for a in expr.args))
        elif isinstance(expr, (symfn.Mod, symfn.PythonMod)):
            node = self.graph.call_function(operator.mod, tuple(self._build(a) for a in expr.args))
        elif isinstance(expr, sympy.Pow) and expr.exp.is_Integer and expr.exp > 0:
            node = self.graph.call_function(operator.pow, (self._build(expr.base), int(expr.exp)))
        elif isinstance(expr, (symfn.FloatTrueDiv, symfn.IntTrueDiv)):
            node = self.graph.call_function(operator.truediv, tuple(self._build(a) for a in expr.args))
        elif isinstance(expr, symfn.ToFloat):
            node = self.graph.call_function(float, (self._build(expr.args[0]),))
        elif isinstance(expr, sympy.Float):
            return float(expr)
        elif isinstance(expr, (symfn.Max, sympy.Max)):
            node = self.graph.call_function(max, tuple(self._build(a) for a in expr.args))
        elif isinstance(expr, (symfn.Min, sympy.Min)):
            node = self.graph.call_function(min, tuple(self._build(a) for a in expr.args))
        elif isinstance(expr, sympy.Abs):
            node = self.graph.call_function(abs, (self._build(expr.args[0]),))
        else:
            raise Unsupported("symbolic size", f"size expression {expr} ({type(expr).__name__})")
        self._nodes[expr] = node
        return node

    def _fold(self, op, args):
        parts = [self._build(a) for a in args]
        node = parts[0]
        for p in parts[1:]:
            node = self.graph.call_function(op, (node, p))
        return node

    # -- guards ----------------------------------------------------------------------
    def guard_expressions(self) -> list[tuple[str, str]]:
        """(Python expression, description) pairs: ranges, equalities between inputs that
        share a symbol, and every guard the ShapeEnv recorded."""
        names = self.names()
        out = []
        for sym, srcs in self.sources.items():
            first = names[sym]
            for expr, d, _ in srcs[1:]:
                out.append((f"{expr}.shape[{d}] == {first}", f"{expr}.shape[{d}] equals {first}"))
            vr = self.env.var_to_range.get(sym)
            if vr is not None and sym not in self.env.replacements:
                lo, hi = vr.lower, vr.upper
                if lo not in (-sympy.oo, -int_oo()) and int(lo) > 0:
                    out.append((f"{first} >= {int(lo)}", f"{first} >= {int(lo)}"))
                if hi not in (sympy.oo, int_oo()):
                    out.append((f"{first} <= {int(hi)}", f"{first} <= {int(hi)}"))
        for sym, repl in self.env.replacements.items():
            if sym in names:
                py = render(sympy.Eq(sym, repl), names)
                out.append((py, f"{names[sym]} == {repl} (specialized)"))
        for g in self.env.guards:
            if not g.expr.free_symbols <= set(names):
                continue
            py = render(g.expr, names)
            out.append((py, f"size relation {g.expr} holds"))
        return out


def specialized(value):
    """``value`` with each symbolic number in it replaced by its value in this capture,
    which guards it (``int(s)`` adds ``s == 4``). For code that reads a number's text:
    ``str``/``repr``/``format`` of a SymInt give its expression (``s26``), which capture
    would bake in as if it were the value."""
    if isinstance(value, torch.SymInt):
        return int(value)
    if isinstance(value, torch.SymFloat):
        return float(value)
    if isinstance(value, torch.SymBool):
        return bool(value)
    if isinstance(value, torch.Size):
        return torch.Size([specialized(v) for v in value])
    if type(value) in (tuple, list):
        return type(value)(specialized(v) for v in value)
    if type(value) is dict:
        return {k: specialized(v) for k, v in value.items()}
    return value


def int_oo():
    from torch.utils._sympy.numbers import int_oo as oo
    return oo


_OPERATORS = {sympy.Eq: operator.eq, sympy.Ne: operator.ne, sympy.Lt: operator.lt,
              sympy.Le: operator.le, sympy.Gt: operator.gt, sympy.Ge: operator.ge}
_REL = {sympy.Eq: "==", sympy.Ne: "!=", sympy.Lt: "<", sympy.Le: "<=", sympy.Gt: ">",
        sympy.Ge: ">="}


def render(expr, names: dict) -> str:
    """A sympy expression over size symbols as Python source."""
    if isinstance(expr, sympy.Symbol):
        return names[expr]
    if isinstance(expr, (sympy.Integer, int)):
        return str(int(expr))
    if expr is sympy.true:
        return "True"
    if expr is sympy.false:
        return "False"
    for rel, op in _REL.items():
        if isinstance(expr, rel):
            return f"({render(expr.lhs, names)} {op} {render(expr.rhs, names)})"
    if isinstance(expr, sympy.Add):
        return "(" + " + ".join(render(a, names) for a in expr.args) + ")"
    if isinstance(expr, sympy.Mul):
        return "(" + " * ".join(render(a, names) for a in expr.args) + ")"
    if isinstance(expr, symfn.FloorDiv):
        return f"({render(expr.args[0], names)} // {render(expr.args[1], names)})"
    if isinstance(expr, (symfn.Mod, symfn.PythonMod)):
        return f"({render(expr.args[0], names)} % {render(expr.args[1], names)})"
    if isinstance(expr, sympy.Pow) and expr.exp.is_Integer:
        return f"({render(expr.base, names)} ** {int(expr.exp)})"
    if isinstance(expr, (symfn.PowByNatural,)):
        return f"({render(expr.args[0], names)} ** {render(expr.args[1], names)})"
    if isinstance(expr, sympy.And):
        return "(" + " and ".join(render(a, names) for a in expr.args) + ")"
    if isinstance(expr, sympy.Or):
        return "(" + " or ".join(render(a, names) for a in expr.args) + ")"
    if isinstance(expr, sympy.Not):
        return f"(not {render(expr.args[0], names)})"
    if isinstance(expr, (symfn.Max, sympy.Max)):
        return "max(" + ", ".join(render(a, names) for a in expr.args) + ")"
    if isinstance(expr, (symfn.Min, sympy.Min)):
        return "min(" + ", ".join(render(a, names) for a in expr.args) + ")"
    if isinstance(expr, sympy.Abs):
        return f"abs({render(expr.args[0], names)})"
    if isinstance(expr, symfn.CleanDiv):
        return f"({render(expr.args[0], names)} // {render(expr.args[1], names)})"
    raise Unsupported("symbolic size", f"cannot guard on size expression {expr}")
