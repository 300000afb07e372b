"""Bytecode analysis (tempa.capture.liveness) on CPython 3.11, 3.12 and 3.13.

Checked against ``dis`` and the compiler: the maximum of the computed stack depths equals
``co_stacksize`` for every code object of a few stdlib modules and of the resume corpus;
exception-table depths are consistent; line starts match ``dis.findlinestarts``.
"""

import dis
import importlib.util
import sys
import types

import pytest

import tests.capture.resume_cases  # noqa: F401  (torch-free import of tempa.capture.*)
from tests.capture.resume_cases import corpus as C
from tempa.capture import liveness as L

PY = sys.version_info[:2]
pytestmark = pytest.mark.passes_without_capture("torch-free: calls the bytecode analysis directly")


def _walk(code):
    yield code
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            yield from _walk(c)


def _stdlib_codes(*mods):
    for m in mods:
        spec = importlib.util.find_spec(m)
        with open(spec.origin) as f:
            yield from _walk(compile(f.read(), spec.origin, "exec"))


def _corpus_codes():
    with open(C.__file__) as f:
        yield from _walk(compile(f.read(), C.__file__, "exec"))


def _offset_of_line(code, lineno, opname=None):
    for ins in L.instructions(code):
        if ins.positions.lineno == lineno and (opname is None or ins.opname == opname):
            return ins.offset
    raise AssertionError((lineno, opname))


def _line(fn, marker):
    """Line number of the first line of fn's source containing marker."""
    import inspect

    lines, start = inspect.getsourcelines(fn)
    for i, text in enumerate(lines):
        if marker in text:
            return start + i
    raise AssertionError(marker)


def _stmt(fn, marker):
    code = fn.__code__
    ln = _line(fn, marker)
    for off in [o for o, _ in L.statement_starts_with_depth(code)]:
        if L.instruction_at(code, off).positions.lineno == ln:
            return off
    raise AssertionError(marker)


# ------------------------------------------------------------------------------------
# Stack depth against the compiler


@pytest.mark.parametrize("mods", [("json.decoder", "textwrap", "difflib", "argparse", "dataclasses")])
def test_max_depth_equals_co_stacksize_stdlib(mods):
    n = 0
    for code in _stdlib_codes(*mods):
        assert L.max_stack_depth(code) == code.co_stacksize, code.co_name
        n += 1
    assert n > 200


def test_max_depth_equals_co_stacksize_corpus():
    for code in _corpus_codes():
        assert L.max_stack_depth(code) == code.co_stacksize, code.co_name
        a = L._analysis(code)
        for i, d in enumerate(a.depths):
            if d is not None:
                assert len(a.slot_kinds[i]) == d


def test_exception_table_depths_are_consistent():
    for code in list(_corpus_codes()) + list(_stdlib_codes("textwrap", "json.decoder")):
        for e in L.exception_entries(code):
            assert L.stack_depth_at(code, e.target) == e.depth + int(e.lasti) + 1
            for ins in L.instructions(code):
                if e.start <= ins.offset < e.end:
                    try:
                        d = L.stack_depth_at(code, ins.offset)
                    except ValueError:
                        continue  # unreachable
                    assert d >= e.depth, (code.co_name, ins.offset)


def f_depths(xs):
    total = 0
    for x in xs:
        with open("/dev/null") as fh:
            total += x
    return total


def test_depth_and_kinds_in_for_and_with():
    code = f_depths.__code__
    body = _stmt(f_depths, "total += x")
    assert L.stack_depth_at(code, body) == 2
    assert L.stack_kinds_at(code, body) == ("iter", "with_exit")
    prods = L.stack_producers_at(code, body)
    assert L.instruction_at(code, prods[0]).opname == "GET_ITER"
    assert L.instruction_at(code, prods[1]).opname == "BEFORE_WITH"
    assert L.stack_depth_at(code, _stmt(f_depths, "return total")) == 0
    assert L.enclosing_for_loops(code, body) == [
        i.offset for i in L.instructions(code) if i.opname == "FOR_ITER"
    ]


def test_unreachable_and_bad_offsets():
    def f():
        return 1

    code = f.__code__
    with pytest.raises(ValueError):
        L.stack_depth_at(code, 1)
    with pytest.raises(ValueError):
        L.instruction_at(code, 10_000)


# ------------------------------------------------------------------------------------
# Offsets


def g_call(a):
    r = len(a)
    return r


def test_offset_after_call_skips_caches():
    code = g_call.__code__
    insts = L.instructions(code)
    call = next(i for i in insts if i.opname == "CALL")
    nxt = L.offset_after(code, call.offset)
    assert L.instruction_at(code, nxt).opname == "STORE_FAST"
    ncache = {(3, 11): 4, (3, 12): 3, (3, 13): 3}[PY]
    assert nxt == call.offset + 2 + 2 * ncache
    assert all(i.opname != "CACHE" for i in insts)


def test_extended_arg_offsets_resolve():
    code = C.long_function.__code__
    insts = L.instructions(code)
    ext = [i for i in insts if i.opname == "EXTENDED_ARG"]
    assert ext
    e = ext[0]
    real = L.instruction_at(code, e.offset)
    assert real.opname != "EXTENDED_ARG" and real.offset > e.offset
    assert real.arg > 255
    # offset_after an instruction whose successor has a prefix returns the prefix
    prev = insts[insts.index(e) - 1]
    assert L.offset_after(code, prev.offset) == e.offset


# ------------------------------------------------------------------------------------
# Statement starts


def test_statement_starts_are_line_starts_with_empty_stack():
    for code in _corpus_codes():
        lines = {off for off, ln in dis.findlinestarts(code) if ln is not None}
        for off, d in L.statement_starts_with_depth(code):
            assert off in lines
            assert d == L.stack_depth_at(code, off)
        for off in L.statement_starts(code):
            assert L.stack_depth_at(code, off) == 0
            assert L.instruction_at(code, off).opname != "RESUME"


def test_statement_starts_cover_each_simple_statement():
    def f(a):
        b = a + 1
        c = b * 2
        print(c)
        return c

    code = f.__code__
    lines = {L.instruction_at(code, o).positions.lineno for o in L.statement_starts(code)}
    first = code.co_firstlineno
    assert lines == {first + 1, first + 2, first + 3, first + 4}


# ------------------------------------------------------------------------------------
# Liveness


def live_simple(a, b, c):
    x = a + 1
    y = x * 2  # a is dead from here
    b = 5  # old b never read
    print(y, b)
    return x


def test_liveness_basic():
    code = live_simple.__code__
    assert L.live_locals_at(code, _stmt(live_simple, "x = a + 1")) == {"a"}
    assert L.live_locals_at(code, _stmt(live_simple, "y = x * 2")) == {"x"}
    assert L.live_locals_at(code, _stmt(live_simple, "b = 5")) == {"x", "y"}
    assert L.live_locals_at(code, _stmt(live_simple, "print(y, b)")) == {"x", "y", "b"}
    assert L.live_locals_at(code, _stmt(live_simple, "return x")) == {"x"}


def live_loop(xs):
    acc = 0
    last = None
    for x in xs:
        acc += x
    while acc > 10:
        acc -= 3
    return acc, last


def test_liveness_loops():
    code = live_loop.__code__
    assert L.live_locals_at(code, _stmt(live_loop, "acc += x")) == {"acc", "x", "last"}
    assert L.live_locals_at(code, _stmt(live_loop, "acc -= 3")) == {"acc", "last"}


def live_except(a):
    fallback = a * 2
    tmp = 0
    try:
        tmp = int(a)
        r = tmp + 1
    except ValueError:
        r = fallback
    return r


def test_liveness_follows_exception_edges():
    code = live_except.__code__
    # fallback is only read in the handler; it must stay live through the try body
    live = L.live_locals_at(code, _stmt(live_except, "tmp = int(a)"))
    assert {"a", "fallback"} <= live and "tmp" not in live
    assert "fallback" in L.live_locals_at(code, _stmt(live_except, "r = tmp + 1"))


def live_misc(a, b):
    z = 1
    del z
    s = a
    q = locals()
    return q, s, b


def test_liveness_delete_and_locals():
    code = live_misc.__code__
    assert "z" in L.live_locals_at(code, _stmt(live_misc, "del z"))
    # locals() reads everything that might be bound
    assert {"a", "b", "s", "z"} <= L.live_locals_at(code, _stmt(live_misc, "q = locals()"))


def live_cells(a):
    k = a + 1

    def inner():
        return k

    return inner() + a


def test_cells_are_not_locals():
    code = live_cells.__code__
    for off in L.statement_starts(code):
        assert "k" not in L.live_locals_at(code, off)
    assert L.live_locals_at(code, L.statement_starts(code)[-1]) >= {"a", "inner"}


def test_liveness_super_reads_self():
    code = C.Child.compute.__code__
    live = L.live_locals_at(code, _stmt(C.Child.compute, "s = super()"))
    assert "self" in live


def live_comp(xs, k):
    ys = [x * k for x in xs]
    return ys


def test_liveness_comprehension_variable():
    code = live_comp.__code__
    live = L.live_locals_at(code, L.statement_starts(code)[0])
    assert "xs" in live
    # 3.11 builds the comprehension as a nested function: k becomes a cell variable
    assert ("k" in live) == (PY >= (3, 12))
    if PY >= (3, 12):
        # inlined: LOAD_FAST_AND_CLEAR saves the outer x (a read), restored afterwards
        assert "x" in live


def test_live_sets_are_plain_locals():
    # That dead locals are really dead is checked by test_resume's differential harness,
    # which passes only live (and bound) locals to every resume function.
    for code in _corpus_codes():
        plain = set(code.co_varnames) - set(code.co_cellvars) - set(code.co_freevars)
        for off in L.statement_starts(code):
            assert L.live_locals_at(code, off) <= plain


# ------------------------------------------------------------------------------------
# try / loop classification


def blocks(xs):
    a = [x + 1 for x in xs]
    try:
        b = [x * 2 for x in xs]
        c = len(b)
    except ValueError:
        c = -1
    with open("/dev/null"):
        d = c + 1
    for x in xs:
        d += x
    while d > 100:
        d -= 1
    try:
        pass
    except KeyError:
        d = 0
    e = d + 1
    return a, e


def _comp_body(code, lineno):
    """An offset inside the comprehension loop on that line (3.12+: inlined)."""
    for ins in L.instructions(code):
        if ins.positions.lineno == lineno and ins.opname == "FOR_ITER":
            return ins.offset
    return None


def test_in_try_block():
    code = blocks.__code__
    assert not L.in_try_block(code, _stmt(blocks, "a = [x + 1"))
    assert L.in_try_block(code, _stmt(blocks, "c = len(b)"))
    assert L.in_try_block(code, _stmt(blocks, "b = [x * 2"))
    assert L.in_try_block(code, _stmt(blocks, "d = c + 1"))  # with body
    assert not L.in_try_block(code, _stmt(blocks, "d += x"))
    assert not L.in_try_block(code, _stmt(blocks, "e = d + 1"))
    if PY >= (3, 12):
        outside = _comp_body(code, _line(blocks, "a = [x + 1"))
        inside = _comp_body(code, _line(blocks, "b = [x * 2"))
        e = [e for e in L.exception_entries(code) if e.start <= outside < e.end]
        assert e and L.handler_kind(code, e[0].target) == "comprehension"
        assert not L.in_try_block(code, outside)
        assert L.in_try_block(code, inside)
    kinds = {L.handler_kind(code, e.target) for e in L.exception_entries(code)}
    assert {"try", "with", "cleanup"} <= kinds


def test_in_loop():
    code = blocks.__code__
    assert not L.in_loop(code, _stmt(blocks, "a = [x + 1"))
    assert L.in_loop(code, _stmt(blocks, "d += x"))
    assert L.in_loop(code, _stmt(blocks, "d -= 1"))
    # 3.12+ jumps backwards from the except body at the end: not a loop
    assert not L.in_loop(code, _stmt(blocks, "e = d + 1"))
    assert not L.in_loop(code, _stmt(blocks, "c = len(b)"))
    if PY >= (3, 12):
        assert L.in_loop(code, _comp_body(code, _line(blocks, "a = [x + 1")))


def test_null_kinds_for_call_layouts():
    def f(a):
        return len(a) + abs(a[0])

    code = f.__code__
    insts = L.instructions(code)
    load = next(i for i in insts if i.opname == "LOAD_GLOBAL" and i.argval == "len")
    after_load = L.offset_after(code, load.offset)
    kinds = L.stack_kinds_at(code, after_load)
    assert kinds == (("value", "null") if PY >= (3, 13) else ("null", "value"))
    call = next(i for i in insts if i.opname == "CALL")
    assert L.stack_kinds_at(code, L.offset_after(code, call.offset)) == ("value",)
