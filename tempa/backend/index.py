"""Integer index expressions for the loop IR, with just enough algebra for views.

Why not sympy: importing it costs ~1 s of cold compile, and the views we lower (permute,
expand, slice, reshape) only need affine sums plus floor-division and modulo by constants.
An expression is a canonical sum ``const + sum(coef * atom)``; atoms are loop variables,
``FloorDiv``/``Mod`` of an expression, or an indirect index loaded from a tensor. Canonical
form makes structural equality meaningful, which the scheduler uses to prove that a consumer
reads exactly the element its producer wrote in the same loop iteration.
"""
from __future__ import annotations


class Atom:
    __slots__ = ()


class Var(Atom):
    __slots__ = ("name", "size", "_key")

    def __init__(self, name: str, size: int):
        self.name, self.size = name, size
        self._key = ("v", name)        # atoms are immutable; keys sort every IndexExpr built

    def key(self):
        return self._key

    def rng(self):
        return 0, max(self.size - 1, 0)

    def c(self):
        return self.name

    def __eq__(self, o):
        return isinstance(o, Var) and o.name == self.name

    def __hash__(self):
        return hash(("v", self.name))

    def __repr__(self):
        return self.name


class Indirect(Atom):
    """An index read from a tensor at run time (embedding, gather); bounds-checked in C++."""
    __slots__ = ("name", "lo", "hi", "_key")

    def __init__(self, name: str, lo: int, hi: int):
        self.name, self.lo, self.hi = name, lo, hi
        self._key = ("i", name)

    def key(self):
        return self._key

    def rng(self):
        return self.lo, self.hi

    def c(self):
        return self.name

    def __eq__(self, o):
        return isinstance(o, Indirect) and o.name == self.name

    def __hash__(self):
        return hash(("i", self.name))

    def __repr__(self):
        return self.name


class _DivMod(Atom):
    __slots__ = ("e", "d", "_key", "_h")
    TAG = ""

    def __init__(self, e: "IndexExpr", d: int):
        self.e, self.d = e, d
        self._key = self._h = None

    def key(self):
        if self._key is None:
            self._key = (self.TAG, self.e.key(), self.d)
        return self._key

    def __eq__(self, o):
        return type(o) is type(self) and o.d == self.d and o.e == self.e

    def __hash__(self):
        if self._h is None:
            self._h = hash((type(self).__name__, self.e, self.d))
        return self._h


class FloorDiv(_DivMod):
    __slots__ = ()
    TAG = "d"

    def rng(self):
        lo, hi = self.e.rng()
        return lo // self.d, hi // self.d

    def c(self):
        return f"(({self.e.c()}) / {self.d})"

    def __repr__(self):
        return f"({self.e!r})//{self.d}"


class Mod(_DivMod):
    __slots__ = ()
    TAG = "m"

    def rng(self):
        return 0, self.d - 1

    def c(self):
        return f"(({self.e.c()}) % {self.d})"

    def __repr__(self):
        return f"({self.e!r})%{self.d}"


class IndexExpr:
    """const + sum(coef * atom), canonical (terms sorted by atom key, no zero coefs)."""
    __slots__ = ("terms", "const", "_h", "_key")

    def __init__(self, terms=(), const: int = 0):
        d = {}
        for a, c in terms:
            d[a] = d.get(a, 0) + c
        for a in d:
            if type(a) is Mod:
                _recombine(d)
                break
        const = int(const) + d.pop(_CONST, 0)
        self.terms = tuple(sorted(((a, c) for a, c in d.items() if c), key=_term_key))
        self.const = const
        self._h = self._key = None

    @staticmethod
    def _canonical(terms: tuple, const: int) -> "IndexExpr":
        """An IndexExpr from terms already in canonical form (sorted, merged, no zero, nothing to
        recombine). Why: lowering builds ~10^5 index expressions for a GPT; most are a
        canonical one scaled or a single atom, which need no normalising."""
        ix = object.__new__(IndexExpr)
        ix.terms, ix.const = terms, const
        ix._h = ix._key = None
        return ix

    @staticmethod
    def of(x) -> "IndexExpr":
        if isinstance(x, IndexExpr):
            return x
        if isinstance(x, Atom):
            return IndexExpr._canonical(((x, 1),), 0)
        return IndexExpr._canonical((), int(x))

    def key(self):
        if self._key is None:
            self._key = (tuple((a.key(), c) for a, c in self.terms), self.const)
        return self._key

    def __eq__(self, o):
        o = IndexExpr.of(o)
        return self.key() == o.key()

    def __hash__(self):
        if self._h is None:
            self._h = hash(self.key())
        return self._h

    def __add__(self, o):
        o = IndexExpr.of(o)
        return IndexExpr(self.terms + o.terms, self.const + o.const)

    __radd__ = __add__

    def __sub__(self, o):
        return self + IndexExpr.of(o) * -1

    def __mul__(self, k: int):
        k = int(k)
        terms = tuple((a, c * k) for a, c in self.terms)
        if k == 0 or any(type(a) is Mod for a, _ in terms):
            return IndexExpr(terms, self.const * k)
        # scaling keeps the order (by atom), and with no Mod there is nothing to recombine
        return IndexExpr._canonical(terms, self.const * k)

    __rmul__ = __mul__

    def rng(self):
        lo = hi = self.const
        for a, c in self.terms:
            alo, ahi = a.rng()
            if c > 0:
                lo += c * alo
                hi += c * ahi
            else:
                lo += c * ahi
                hi += c * alo
        return lo, hi

    def atoms(self):
        return [a for a, _ in self.terms]

    def vars(self):
        """Every loop variable / indirect atom this expression depends on (recursively)."""
        out = set()
        for a, _ in self.terms:
            if isinstance(a, _DivMod):
                out |= a.e.vars()
            else:
                out.add(a)
        return out

    def floordiv(self, d: int) -> "IndexExpr":
        d = int(d)
        if d == 1:
            return self
        q = [(a, c // d) for a, c in self.terms if c % d == 0]
        r = IndexExpr([(a, c) for a, c in self.terms if c % d != 0], self.const % d)
        cq = self.const // d
        lo, hi = r.rng()
        if lo >= 0 and hi < d:
            return IndexExpr(q, cq)
        if len(r.terms) == 1 and r.const == 0 and r.terms[0][1] == 1 and isinstance(r.terms[0][0], FloorDiv):
            inner = r.terms[0][0]
            return IndexExpr(q, cq) + IndexExpr.of(FloorDiv(inner.e, inner.d * d))
        if lo >= 0 and hi < d * 1 and not q:
            return IndexExpr((), cq)
        split = _split_term(r, d)
        if split is not None:
            # (c*a + rest) // d == a // (d/c) when c divides d and 0 <= rest < c: a reshape
            # that merged dims (heads into the batch) divides only the outer index.
            a, c, rest = split
            return IndexExpr(q, cq) + IndexExpr.of(a).floordiv(d // c)
        return IndexExpr(q, cq) + IndexExpr.of(FloorDiv(r, d))

    def mod(self, d: int) -> "IndexExpr":
        d = int(d)
        if d == 1:
            return IndexExpr()
        r = IndexExpr([(a, c) for a, c in self.terms if c % d != 0], self.const % d)
        lo, hi = r.rng()
        if lo >= 0 and hi < d:
            return r
        split = _split_term(r, d)
        if split is not None:
            # (c*a + rest) % d == c*(a % (d/c)) + rest when c divides d and 0 <= rest < c
            a, c, rest = split
            return IndexExpr.of(a).mod(d // c) * c + rest
        return IndexExpr.of(Mod(r, d))

    def c(self) -> str:
        parts = []
        for a, c in self.terms:
            s = a.c()
            parts.append(s if c == 1 else f"{c}*{s}")
        if self.const or not parts:
            parts.append(str(self.const))
        return " + ".join(parts).replace("+ -", "- ")

    def __repr__(self):
        return self.c()


def _split_term(r: "IndexExpr", d: int):
    """(atom, c, rest) with r == c*atom + rest, c > 1 dividing d, atom >= 0 and 0 <= rest < c;
    the largest such c; None if there is none."""
    for a, c in sorted(r.terms, key=lambda t: -t[1]):
        if c <= 1 or d % c or a.rng()[0] < 0:
            continue
        rest = r - IndexExpr.of(a) * c
        lo, hi = rest.rng()
        if lo >= 0 and hi < c:
            return a, c, rest
    return None


def _recombine(d: dict) -> None:
    """Fold ``c*d*(e // d) + c*(e % d)`` back into ``c*e`` (a reshape followed by its inverse)."""
    mods = [(a, c) for a, c in d.items() if isinstance(a, Mod) and c]
    for m, c in mods:
        fd = FloorDiv(m.e, m.d)
        if d.get(fd, 0) == c * m.d and d.get(m, 0) == c:
            del d[fd], d[m]
            for a, k in m.e.terms:
                d[a] = d.get(a, 0) + k * c
            d[_CONST] = d.get(_CONST, 0) + m.e.const * c


class _Const(Atom):
    def key(self):
        return ("c",)


_CONST = _Const()


def _term_key(t):
    return t[0].key()


def contiguous_strides(sizes) -> tuple:
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


def flat_index(idx, strides, offset=0) -> IndexExpr:
    parts = [(IndexExpr.of(i), int(s)) for i, s in zip(idx, strides) if s]
    if any(type(a) is Mod for ix, _ in parts for a, _ in ix.terms):
        # summed one by one: recombining ``e // d`` with ``e % d`` depends on the order
        out = IndexExpr((), offset)
        for ix, s in parts:
            out = out + ix * s
        return out
    # no Mod: one sum gives the same canonical form as adding term by term, building once
    terms = []
    const = int(offset)
    for ix, s in parts:
        terms.extend((a, c * s) for a, c in ix.terms)
        const += ix.const * s
    return IndexExpr(terms, const)


def unflatten(flat: IndexExpr, sizes) -> list:
    """The per-dimension indices of a row-major position ``flat`` in a tensor of ``sizes``."""
    out = []
    strides = contiguous_strides(sizes)
    for s, st in zip(sizes, strides):
        if s == 1:
            out.append(IndexExpr())
        else:
            out.append(flat.floordiv(st).mod(s) if st != 1 else flat.mod(s))
    return out


class Cond:
    """A condition on indices for a piecewise value (``cat``, ``constant_pad_nd``,
    ``slice_scatter``, ``select_scatter``): a conjunction of comparisons, each
    ``expr op bound`` or ``(expr % modulus) op bound``, with ``op`` one of ``<``, ``>=``,
    ``==``. The empty conjunction always holds. Lowerings build it; each emitter renders it
    with its own spelling of an index (``IndexExpr.c()`` for C++, ``TritonEmitter.ix`` for
    Triton), so no backend parses another's text."""
    __slots__ = ("terms",)
    OPS = ("<", ">=", "==")

    def __init__(self, terms=()):
        self.terms = tuple(terms)       # (IndexExpr, op, bound, modulus or None)

    @staticmethod
    def compare(expr, op: str, bound: int, modulus: int | None = None) -> "Cond":
        assert op in Cond.OPS, op
        return Cond(((IndexExpr.of(expr), op, bound, modulus),))

    @staticmethod
    def within(expr, lo: int, hi: int) -> "Cond":
        """``lo <= expr < hi``."""
        return Cond.compare(expr, ">=", lo) & Cond.compare(expr, "<", hi)

    def __and__(self, other: "Cond") -> "Cond":
        return Cond(self.terms + other.terms)

    @property
    def always(self) -> bool:
        return not self.terms

    def parts(self, ix) -> list:
        """Each comparison's text, indices spelled by ``ix`` (an IndexExpr -> str)."""
        out = []
        for e, op, bound, modulus in self.terms:
            lhs = f"({ix(e)})" if modulus is None else f"(({ix(e)}) % {modulus})"
            out.append(f"{lhs} {op} {bound}")
        return out

    def c(self) -> str:
        """C++ (``&&`` short-circuits: a modulus is only taken where the bounds before it hold)."""
        return " && ".join(self.parts(IndexExpr.c)) or "true"

    def __repr__(self):
        return self.c()
