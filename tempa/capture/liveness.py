"""Bytecode analysis for the capture frontend: offsets, stack depths, liveness, blocks.

Everything here reads a code object through :mod:`dis` (CPython 3.11, 3.12 and 3.13) and
never imports torch. Offsets are byte offsets as ``dis`` and ``frame.f_lasti`` report
them; CACHE entries are never instructions, EXTENDED_ARG prefixes are (a jump may target
them), and an offset inside an instruction is an error.

Public API
----------
``instructions(code) -> tuple[dis.Instruction, ...]``
    The instructions, CACHE entries excluded, in offset order.
``instruction_at(code, offset) -> dis.Instruction``
    The instruction starting at ``offset``. An EXTENDED_ARG prefix offset resolves to the
    instruction it extends. ``ValueError`` if no instruction starts there.
``offset_after(code, offset) -> int``
    The offset of the instruction that executes next in straight-line order after the one
    at ``offset`` (its CACHE entries skipped; if the next instruction carries EXTENDED_ARG
    prefixes, the offset of the first prefix). The interpreter resumes *after* a breaking
    CALL at ``offset_after(code, call_offset)``, with the call's result pushed.
``stack_depth_at(code, offset) -> int``
    Value-stack depth just before the instruction at ``offset`` (NULLs count as entries).
    Forward dataflow over the CFG with ``dis.stack_effect`` (``jump=True`` on taken
    branches); exception handlers start at the table's depth, +1 if ``lasti`` is pushed,
    +1 for the exception. ``ValueError`` for unreachable code.
``max_stack_depth(code) -> int``
    The largest depth reached anywhere (equals ``co_stacksize`` for compiler output).
``live_locals_at(code, offset) -> frozenset[str]``
    Plain fast locals (``co_varnames`` that are not cell variables) whose current value
    may be read at or after ``offset`` before being overwritten: backward dataflow over
    the CFG including exception edges. Cell and free variables are never included: they
    travel to resume functions as cells. ``DELETE_FAST`` counts as a read (it fails on an
    unbound local); ``LOAD_FAST_AND_CLEAR`` (3.12+ inlined comprehensions) counts as a read
    because its value is restored afterwards; loading the global ``super`` counts as a read
    of the first argument (zero-argument ``super()`` reads it implicitly); loading
    ``locals``/``vars``/``eval``/``exec``/``dir`` makes every local live.
``statement_starts(code) -> list[int]``
    Offsets of reachable instructions that begin a source line with an empty stack,
    after the prologue (RESUME). These are the natural resume points.
``statement_starts_with_depth(code) -> list[tuple[int, int]]``
    All reachable line starts after the prologue as ``(offset, depth)`` pairs, including
    those inside ``for`` loops (iterator on the stack) and ``with`` blocks (the bound
    ``__exit__`` on the stack) and exception handlers.
``exception_entries(code) -> tuple[ExceptionEntry, ...]``
    The parsed exception table (``start`` inclusive, ``end`` exclusive).
``handler_kind(code, target) -> str``
    What an exception-table target is: ``"comprehension"`` (3.12+ inlined comprehension
    cleanup, starts with SWAP), ``"with"``, ``"try"`` (PUSH_EXC_INFO) or ``"cleanup"``
    (the ``COPY 3; POP_EXCEPT; RERAISE`` after an except body, and anything else).
``in_try_block(code, offset) -> bool``
    True if an exception raised at ``offset`` reaches a real ``try``/``with``/``except``
    handler of this function. A 3.12+ comprehension handler only re-raises, so it counts
    only if the comprehension itself sits inside such a block.
``in_loop(code, offset) -> bool``
    True if the instruction at ``offset`` lies on a cycle of the control-flow graph
    (exception edges included): ``for``/``while`` bodies and headers, 3.12+ inlined
    comprehensions. (Not an interval test: 3.12+ places ``except`` bodies at the end of the
    function and jumps *back* from them, which is no loop.)
``stack_kinds_at(code, offset) -> tuple[str, ...]``
    A coarse label per stack slot, bottom first: ``"iter"`` (for-loop or comprehension
    iterator, pushed by GET_ITER), ``"with_exit"`` (bound ``__exit__`` pushed by
    BEFORE_WITH), ``"null"`` (PUSH_NULL, or the NULL half of LOAD_GLOBAL with the NULL
    bit; a method load's maybe-NULL slot is not labelled), ``"exc"``, ``"exc_info"``,
    ``"lasti"`` (exception handlers), ``"value"`` (anything else). Exact for the slots
    below the expression being evaluated; a consumed-and-replaced slot keeps the label
    of whoever pushed the slot count up, so do not trust ``"value"`` vs ``"null"`` for
    slots an instruction rewrote in place.
``stack_producers_at(code, offset) -> tuple[int, ...]``
    The offset of the instruction that pushed each slot (same caveat).
``enclosing_for_loops(code, offset) -> list[int]``
    Offsets of the FOR_ITER instructions whose body (FOR_ITER .. exit target) contains
    ``offset`` textually, outermost first (3.12+ ``except`` bodies moved to the end of
    the function are not seen: prefer ``stack_kinds_at``).

All results are cached per code object.
"""

from __future__ import annotations

import dis
import sys
from typing import NamedTuple

__all__ = [
    "ExceptionEntry",
    "instructions",
    "instruction_at",
    "offset_after",
    "stack_depth_at",
    "max_stack_depth",
    "live_locals_at",
    "statement_starts",
    "statement_starts_with_depth",
    "exception_entries",
    "handler_kind",
    "in_try_block",
    "in_loop",
    "enclosing_for_loops",
    "stack_kinds_at",
    "stack_producers_at",
]

PY = sys.version_info[:2]

_JUMP_OPS = frozenset(dis.hasjrel) | frozenset(dis.hasjabs) | frozenset(getattr(dis, "hasjump", ()))
# Instructions after which control never falls through to the next instruction.
_NO_FALLTHROUGH = frozenset(
    {
        "RETURN_VALUE",
        "RETURN_CONST",
        "RAISE_VARARGS",
        "RERAISE",
        "JUMP_FORWARD",
        "JUMP_BACKWARD",
        "JUMP_BACKWARD_NO_INTERRUPT",
        "JUMP",
        "JUMP_NO_INTERRUPT",
    }
)
_BACKWARD_JUMPS = frozenset(
    {
        "JUMP_BACKWARD",
        "JUMP_BACKWARD_NO_INTERRUPT",
        "POP_JUMP_BACKWARD_IF_TRUE",
        "POP_JUMP_BACKWARD_IF_FALSE",
        "POP_JUMP_BACKWARD_IF_NONE",
        "POP_JUMP_BACKWARD_IF_NOT_NONE",
    }
)
# Names whose call may read every local of the frame.
_READS_ALL_LOCALS = frozenset({"locals", "vars", "eval", "exec", "dir"})


class ExceptionEntry(NamedTuple):
    start: int  # inclusive
    end: int  # exclusive
    target: int
    depth: int
    lasti: bool


def _parse_varint(it):
    b = next(it)
    val = b & 63
    while b & 64:
        val <<= 6
        b = next(it)
        val |= b & 63
    return val


def _parse_exception_table(code) -> tuple[ExceptionEntry, ...]:
    # Same format on 3.11-3.13 (Objects/exception_handling_notes.txt).
    it = iter(code.co_exceptiontable)
    out = []
    try:
        while True:
            start = _parse_varint(it) * 2
            length = _parse_varint(it) * 2
            target = _parse_varint(it) * 2
            dl = _parse_varint(it)
            out.append(ExceptionEntry(start, start + length, target, dl >> 1, bool(dl & 1)))
    except StopIteration:
        return tuple(out)


def _has_arg(inst) -> bool:
    return inst.arg is not None


def _effect(inst, jump: bool) -> int:
    if inst.opname == "RETURN_GENERATOR" and PY < (3, 13):
        # dis says 0 on 3.11/3.12, but the resumed generator finds a value pushed (the
        # POP_TOP that follows removes it).
        return 1
    arg = inst.arg if _has_arg(inst) else None
    return dis.stack_effect(inst.opcode, arg, jump=jump)


# Instructions whose net pops leave no new value on top (labels below stay as they were).
_PURE_POPS = frozenset(
    """POP_TOP STORE_FAST STORE_NAME STORE_GLOBAL STORE_DEREF STORE_ATTR STORE_SUBSCR
    STORE_SLICE DELETE_SUBSCR STORE_FAST_STORE_FAST STORE_FAST_MAYBE_NULL POP_JUMP_IF_TRUE
    POP_JUMP_IF_FALSE POP_JUMP_IF_NONE POP_JUMP_IF_NOT_NONE POP_JUMP_FORWARD_IF_TRUE
    POP_JUMP_FORWARD_IF_FALSE POP_JUMP_FORWARD_IF_NONE POP_JUMP_FORWARD_IF_NOT_NONE
    POP_JUMP_BACKWARD_IF_TRUE POP_JUMP_BACKWARD_IF_FALSE POP_JUMP_BACKWARD_IF_NONE
    POP_JUMP_BACKWARD_IF_NOT_NONE JUMP_IF_TRUE_OR_POP JUMP_IF_FALSE_OR_POP RETURN_VALUE
    RETURN_CONST RAISE_VARARGS RERAISE END_FOR POP_EXCEPT LIST_APPEND SET_ADD MAP_ADD
    LIST_EXTEND SET_UPDATE DICT_UPDATE DICT_MERGE END_ASYNC_FOR PRINT_EXPR IMPORT_STAR
    END_SEND DELETE_FAST DELETE_NAME DELETE_GLOBAL DELETE_DEREF DELETE_ATTR""".split()
)
# Instructions with net effect >= 0 that consume the top of the stack (it is replaced).
_CONSUMES_TOP = frozenset(
    """UNARY_NEGATIVE UNARY_NOT UNARY_INVERT UNARY_POSITIVE LOAD_ATTR LOAD_METHOD TO_BOOL
    FORMAT_SIMPLE FORMAT_VALUE CONVERT_VALUE GET_AWAITABLE GET_AITER GET_ANEXT
    GET_YIELD_FROM_ITER CALL_INTRINSIC_1 UNPACK_SEQUENCE UNPACK_EX BUILD_LIST BUILD_TUPLE
    BUILD_SET BUILD_STRING BUILD_MAP BUILD_CONST_KEY_MAP MAKE_FUNCTION CHECK_EXC_MATCH
    CHECK_EG_MATCH STORE_FAST_LOAD_FAST LOAD_FROM_DICT_OR_DEREF LOAD_FROM_DICT_OR_GLOBALS
    PRECALL CALL MATCH_CLASS""".split()
)


def _apply_kinds(ins, kinds, effect):
    """Stack labels after ``ins``: a tuple of (label, producer offset) per slot.

    Only net stack effects are known from ``dis``; pops and pushes are inferred from the
    two tables above (best effort, exact for the common instructions)."""
    name = ins.opname
    off = ins.offset
    val = ("value", off)
    if name == "GET_ITER":
        return kinds[:-1] + (("iter", off),)
    if name == "BEFORE_WITH":
        return kinds[:-1] + (("with_exit", off), val)
    if name == "PUSH_EXC_INFO":
        return kinds[:-1] + (("exc_info", off), ("exc", off))
    if name == "PUSH_NULL":
        return kinds + (("null", off),)
    if name == "LOAD_GLOBAL" and ins.arg & 1:
        pair = (val, ("null", off)) if PY >= (3, 13) else (("null", off), val)
        return kinds + pair
    if name == "COPY":
        return kinds + (kinds[-ins.arg],)
    if name == "SWAP":
        n = ins.arg
        lst = list(kinds)
        lst[-1], lst[-n] = lst[-n], lst[-1]
        return tuple(lst)
    if effect < 0:
        kinds = kinds[:effect]
        if name in _PURE_POPS or not kinds:
            return kinds
        return kinds[:-1] + (val,)
    if name in _CONSUMES_TOP and not (name.startswith("BUILD_") and ins.arg == 0):
        return kinds[:-1] + (val,) * (1 + effect)
    return kinds + (val,) * effect


class _Analysis:
    """Per-code-object facts, computed once."""

    def __init__(self, code):
        self.code = code
        self.insts = tuple(dis.get_instructions(code))
        self.index = {ins.offset: i for i, ins in enumerate(self.insts)}
        self.entries = _parse_exception_table(code)
        cell_like = set(code.co_cellvars) | set(code.co_freevars)
        self.plain_locals = tuple(v for v in code.co_varnames if v not in cell_like)
        self._depths = None
        self._kinds = None
        self._cycle = None
        self._live = None
        self._line_starts = None

    # -- structure ---------------------------------------------------------------------
    def entry_for(self, offset):
        # The table is flat: at most one entry covers an offset (the innermost handler).
        for e in self.entries:
            if e.start <= offset < e.end:
                return e
        return None

    def successors(self, i):
        """(index, is_jump) pairs of normal control-flow successors of instruction i."""
        ins = self.insts[i]
        out = []
        if ins.opcode in _JUMP_OPS and isinstance(ins.argval, int):
            out.append((self.index[ins.argval], True))
        if ins.opname not in _NO_FALLTHROUGH and i + 1 < len(self.insts):
            out.append((i + 1, False))
        return out

    def resolve(self, offset) -> int:
        """Index of the instruction at offset, EXTENDED_ARG prefixes skipped."""
        i = self.index.get(offset)
        if i is None:
            raise ValueError(f"no instruction starts at offset {offset} in {self.code.co_name}")
        while self.insts[i].opname == "EXTENDED_ARG":
            i += 1
        return i

    # -- stack depth -------------------------------------------------------------------
    @property
    def depths(self):
        if self._depths is None:
            self._depths = self._compute_depths()
        return self._depths

    @property
    def slot_kinds(self):
        if self._depths is None:
            self._depths = self._compute_depths()
        return self._kinds

    def _compute_depths(self):
        # Forward dataflow of the stack depth, carrying a coarse label per stack slot:
        # "iter" (pushed by GET_ITER: a for-loop or comprehension iterator), "with_exit"
        # (the bound __exit__ pushed by BEFORE_WITH), "lasti"/"exc"/"exc_info" (exception
        # handlers), "value" otherwise. Labels come from the first path that reaches an
        # instruction; they are exact for the slots below the expression being evaluated,
        # which is what resume points need.
        n = len(self.insts)
        depth = [None] * n
        kinds = [None] * n
        depth[0] = 0
        kinds[0] = ()
        work = [0]
        while work:
            i = work.pop()
            d = depth[i]
            k = kinds[i]
            ins = self.insts[i]
            targets = []
            for j, jump in self.successors(i):
                e = _effect(ins, jump)
                targets.append((j, d + e, _apply_kinds(ins, k, e)))
            ex = self.entry_for(ins.offset)
            if ex is not None:
                t = ex.target
                hk = k[: ex.depth] + ((("lasti", t),) if ex.lasti else ()) + (("exc", t),)
                targets.append((self.index[ex.target], ex.depth + int(ex.lasti) + 1, hk))
            for j, dj, kj in targets:
                if depth[j] is None:
                    depth[j] = dj
                    kinds[j] = kj
                    work.append(j)
                elif depth[j] != dj:
                    raise AssertionError(
                        f"inconsistent stack depth at offset {self.insts[j].offset} in "
                        f"{self.code.co_name}: {depth[j]} vs {dj}"
                    )
        self._kinds = kinds
        return depth

    # -- loops -------------------------------------------------------------------------
    @property
    def in_cycle(self):
        if self._cycle is None:
            self._cycle = self._compute_cycles()
        return self._cycle

    def _compute_cycles(self):
        """in_cycle[i]: instruction i lies on a CFG cycle (Tarjan's SCC, iterative)."""
        n = len(self.insts)
        succ = []
        for i in range(n):
            s = [j for j, _ in self.successors(i)]
            e = self.entry_for(self.insts[i].offset)
            if e is not None:
                s.append(self.index[e.target])
            succ.append(s)
        index = [None] * n
        low = [0] * n
        on_stack = [False] * n
        stack = []
        result = [False] * n
        counter = 0
        for root in range(n):
            if index[root] is not None:
                continue
            call = [(root, 0)]
            index[root] = low[root] = counter
            counter += 1
            stack.append(root)
            on_stack[root] = True
            while call:
                v, pi = call[-1]
                if pi < len(succ[v]):
                    call[-1] = (v, pi + 1)
                    w = succ[v][pi]
                    if index[w] is None:
                        index[w] = low[w] = counter
                        counter += 1
                        stack.append(w)
                        on_stack[w] = True
                        call.append((w, 0))
                    elif on_stack[w]:
                        low[v] = min(low[v], index[w])
                    continue
                call.pop()
                if call:
                    u = call[-1][0]
                    low[u] = min(low[u], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack[w] = False
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1 or v in succ[v]:
                        for w in comp:
                            result[w] = True
        return result

    # -- liveness ----------------------------------------------------------------------
    def _uses_defs(self, ins):
        """Sequence of ('use'|'def', name) micro-steps of one instruction, in order."""
        name = ins.opname
        plain = self.plain_locals
        av = ins.argval
        if name in ("LOAD_FAST", "LOAD_FAST_CHECK"):
            return [("use", av)] if av in plain else []
        if name == "LOAD_FAST_AND_CLEAR":
            return [("use", av), ("def", av)] if av in plain else []
        if name == "STORE_FAST":
            return [("def", av)] if av in plain else []
        if name == "DELETE_FAST":
            return [("use", av), ("def", av)] if av in plain else []
        if name == "LOAD_FAST_LOAD_FAST":
            return [("use", a) for a in av if a in plain]
        if name == "STORE_FAST_LOAD_FAST":
            a, b = av
            return [("def", x) for x in (a,) if x in plain] + [("use", x) for x in (b,) if x in plain]
        if name == "STORE_FAST_STORE_FAST":
            return [("def", a) for a in av if a in plain]
        if name in ("LOAD_GLOBAL", "LOAD_NAME"):
            if av in _READS_ALL_LOCALS:
                return [("use", v) for v in plain]
            if av == "super" and self.code.co_varnames:
                first = self.code.co_varnames[0]
                return [("use", first)] if first in plain else []
        return []

    @property
    def live_in(self):
        if self._live is None:
            self._live = self._compute_live()
        return self._live

    def _compute_live(self):
        n = len(self.insts)
        steps = [self._uses_defs(ins) for ins in self.insts]
        succ = []
        for i in range(n):
            s = [j for j, _ in self.successors(i)]
            succ.append(s)
        handler = []
        for ins in self.insts:
            e = self.entry_for(ins.offset)
            handler.append(self.index[e.target] if e is not None else None)
        live = [frozenset()] * n
        changed = True
        while changed:
            changed = False
            for i in range(n - 1, -1, -1):
                out = set()
                for j in succ[i]:
                    out |= live[j]
                for kind, v in reversed(steps[i]):
                    if kind == "def":
                        out.discard(v)
                    else:
                        out.add(v)
                if handler[i] is not None:
                    # The instruction may raise before any of its stores happen.
                    out |= live[handler[i]]
                new = frozenset(out)
                if new != live[i]:
                    live[i] = new
                    changed = True
        return live

    # -- lines -------------------------------------------------------------------------
    @property
    def line_starts(self):
        if self._line_starts is None:
            starts = {off for off, line in dis.findlinestarts(self.code) if line is not None}
            self._line_starts = starts
        return self._line_starts

    def prologue_end(self) -> int:
        """Index of the first instruction after the first RESUME."""
        for i, ins in enumerate(self.insts):
            if ins.opname == "RESUME":
                return i + 1
        return 0


_CACHE: dict = {}
_BY_ID: dict = {}
_CACHE_MAX = 2048


def _analysis(code) -> _Analysis:
    # Fast path by identity (hashing a code object hashes its bytecode and constants);
    # the cached analysis holds the code object, so its id cannot be reused meanwhile.
    a = _BY_ID.get(id(code))
    if a is not None and a.code is code:
        return a
    key = (code, code.co_filename)
    a = _CACHE.get(key)
    if a is None:
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
            _BY_ID.clear()
        a = _CACHE[key] = _Analysis(code)
    _BY_ID[id(code)] = a
    return a


# ------------------------------------------------------------------------------------------
# Public functions
# ------------------------------------------------------------------------------------------


def instructions(code) -> tuple:
    return _analysis(code).insts


def instruction_at(code, offset: int) -> dis.Instruction:
    a = _analysis(code)
    return a.insts[a.resolve(offset)]


def offset_after(code, offset: int) -> int:
    a = _analysis(code)
    i = a.resolve(offset) + 1
    if i >= len(a.insts):
        raise ValueError(f"no instruction after offset {offset} in {code.co_name}")
    return a.insts[i].offset


def stack_depth_at(code, offset: int) -> int:
    a = _analysis(code)
    i = a.index.get(offset)
    if i is None:
        raise ValueError(f"no instruction starts at offset {offset} in {code.co_name}")
    d = a.depths[i]
    if d is None:
        raise ValueError(f"offset {offset} in {code.co_name} is unreachable")
    return d


def max_stack_depth(code) -> int:
    a = _analysis(code)
    best = 0
    for i, ins in enumerate(a.insts):
        d = a.depths[i]
        if d is None:
            continue
        best = max(best, d)
        for _, jump in a.successors(i) or [(None, False)]:
            best = max(best, d + _effect(ins, jump))
        if ins.opname == "RETURN_CONST" and PY >= (3, 13):
            best = max(best, d + 1)  # the compiler counts its LOAD_CONST half
    return best


def live_locals_at(code, offset: int) -> frozenset:
    a = _analysis(code)
    i = a.index.get(offset)
    if i is None:
        raise ValueError(f"no instruction starts at offset {offset} in {code.co_name}")
    return a.live_in[i]


def statement_starts_with_depth(code) -> list:
    a = _analysis(code)
    out = []
    for i in range(a.prologue_end(), len(a.insts)):
        ins = a.insts[i]
        if ins.offset in a.line_starts and a.depths[i] is not None:
            out.append((ins.offset, a.depths[i]))
    return out


def statement_starts(code) -> list:
    return [off for off, d in statement_starts_with_depth(code) if d == 0]


def exception_entries(code) -> tuple:
    return _analysis(code).entries


def handler_kind(code, target: int) -> str:
    a = _analysis(code)
    i = a.index[target]
    first = a.insts[i]
    if first.opname == "SWAP":
        return "comprehension"
    if first.opname == "PUSH_EXC_INFO":
        nxt = a.insts[i + 1] if i + 1 < len(a.insts) else None
        if nxt is not None and nxt.opname == "WITH_EXCEPT_START":
            return "with"
        return "try"
    return "cleanup"


def in_try_block(code, offset: int) -> bool:
    a = _analysis(code)
    seen = set()
    off = offset
    while True:
        e = a.entry_for(off)
        if e is None:
            return False
        if handler_kind(code, e.target) != "comprehension":
            return True
        if e.target in seen:
            return False
        seen.add(e.target)
        off = e.target  # the comprehension handler re-raises: where does that go?


def in_loop(code, offset: int) -> bool:
    a = _analysis(code)
    i = a.index.get(offset)
    if i is None:
        raise ValueError(f"no instruction starts at offset {offset} in {code.co_name}")
    return a.in_cycle[i]


def stack_kinds_at(code, offset: int) -> tuple:
    """Coarse labels of the stack slots before ``offset``, bottom first (see module doc)."""
    return tuple(k for k, _ in _slots(code, offset))


def stack_producers_at(code, offset: int) -> tuple:
    """Offset of the instruction that pushed each stack slot before ``offset``, bottom
    first (for "exc"/"lasti" slots: the handler's offset). Exact for "iter"/"with_exit"
    slots; for "value" slots only where the value was pushed by a non-consuming
    instruction."""
    return tuple(p for _, p in _slots(code, offset))


def _slots(code, offset):
    stack_depth_at(code, offset)  # validates
    a = _analysis(code)
    return a.slot_kinds[a.index[offset]]


def enclosing_for_loops(code, offset: int) -> list:
    """FOR_ITER offsets whose loop body contains ``offset`` (outermost first).

    The body of a FOR_ITER at F spans (F, exit) where exit is its jump target (the
    instruction after the loop on 3.11, END_FOR on 3.12+). Inside the body the iterator
    is on the stack.
    """
    a = _analysis(code)
    out = []
    for ins in a.insts:
        if ins.opname == "FOR_ITER" and ins.offset < offset < ins.argval:
            out.append(ins.offset)
    return out

