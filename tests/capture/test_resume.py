"""Resume functions (tempa.capture.resume) on CPython 3.11, 3.12 and 3.13.

The core is a differential harness (resume_cases/harness.py): for every line start of
every corpus function whose stack holds nothing or only for-loop iterators and with-block
``__exit__`` methods, resume the function there with the frame's real locals and cells
(captured with sys.settrace) and check the return value or exception (type, message,
file and line) and every side effect equal a full run. Dedicated tests cover resuming
after a CALL with NULLs on the stack, unpassed locals, caching and the error paths.

Runs without torch: ``PYTHONPATH=. python3.12 -m pytest tests/capture/test_resume.py``.
"""

import dis
import os
import subprocess
import sys
import textwrap
import types

import pytest

from tests.capture.resume_cases import corpus as C  # noqa: I001  (sets up torch-free import)
from tests.capture.resume_cases import harness as H
from tempa.capture import liveness as L
from tempa.capture import resume as R

PY = sys.version_info[:2]
pytestmark = pytest.mark.passes_without_capture("torch-free: calls the bytecode analysis directly")


def _points():
    out = []
    for case, (fn, _) in C.CASES.items():
        pts = H.resume_points(fn.__code__)
        if len(pts) > 60:  # the long function: a sample, including its last statements
            pts = sorted(set(pts[::25] + pts[-12:]))
        out.extend((case, off, depth) for off, depth in pts)
    return out


POINTS = _points()
_REFS = {}


def _reference(case):
    if case not in _REFS:
        _REFS[case] = H.reference_run(case)
    return _REFS[case]


@pytest.mark.parametrize("case,offset,depth", POINTS, ids=[f"{c}@{o}/{d}" for c, o, d in POINTS])
def test_differential(case, offset, depth):
    got = H.resumed_run(case, offset)
    if got is None:
        pytest.skip("offset not executed with these inputs")
    assert got == _reference(case)


def test_harness_covers_every_case_and_slot_kind():
    cases = {c for c, _, _ in POINTS}
    assert cases == set(C.CASES)
    kinds = set()
    for case, off, depth in POINTS:
        kinds.update(L.stack_kinds_at(C.CASES[case][0].__code__, off))
    assert {"iter", "with_exit"} <= kinds
    assert sum(1 for _, _, d in POINTS if d == 0) > 150
    assert sum(1 for _, _, d in POINTS if d >= 2) > 3  # nested loop / loop + with


def test_references_are_sane():
    for case in C.CASES:
        out, log, _ = _reference(case)
        assert out[0] == ("raise" if case == "raises_late" else "ok"), (case, out)


def test_long_function_needs_extended_arg():
    code = C.long_function.__code__
    assert any(i.opname == "EXTENDED_ARG" for i in L.instructions(code))
    assert len(code.co_varnames) > 256
    jumps = [i for i in L.instructions(code) if i.opcode in dis.hasjrel and i.arg > 255]
    assert jumps  # a jump that needs EXTENDED_ARG
    # Resume at the last statement: locals beyond index 255 and a far jump target.
    last = L.statement_starts(code)[-1]
    assert last > 1024
    assert H.resumed_run("long_function", last) == H.reference_run("long_function")


def test_exception_points_at_the_user_line():
    code = C.raises_late.__code__
    off = L.statement_starts(code)[-2]  # `raise ValueError(...)`
    rc = R.make_resume_code(code, off, stack_size=0, live_locals=("y",))
    fn = rc.make_function(C.raises_late.__globals__, ())
    with pytest.raises(ValueError, match="bad 7") as info:
        fn(7)
    tb = info.tb
    while tb.tb_next:
        tb = tb.tb_next
    assert tb.tb_frame.f_code.co_filename == code.co_filename
    assert tb.tb_lineno == L.instruction_at(code, off).positions.lineno


# ------------------------------------------------------------------------------------
# Resuming after a CALL, with NULLs and method slots on the stack


def combine(a, b, k=0):
    C.LOG.append(("combine", a, b, k))
    return (a, b, k)


def middle(b):
    C.LOG.append(("middle", b))
    return b * 10


def call_mid(a, b):
    r = combine(a, middle(b), k=3)
    return r


class Holder:
    def meth(self, a, b):
        return ("meth", a, b)


def method_mid(h, a, b):
    return h.meth(a, middle(b))


def loop_call(xs):
    acc = []
    for x in C.T(xs):
        acc.append(middle(x))
    return acc


def _first_call_to(code, name):
    """Offset of the CALL that calls global ``name`` (the first CALL after its load)."""
    seen = False
    for ins in L.instructions(code):
        if ins.opname == "LOAD_GLOBAL" and ins.argval == name:
            seen = True
        elif seen and ins.opname == "CALL":
            return ins.offset
    raise AssertionError(name)


def test_resume_after_call_with_global_null():
    code = call_mid.__code__
    after = L.offset_after(code, _first_call_to(code, "middle"))
    kinds = L.stack_kinds_at(code, after)
    # [NULL, combine, a, result] on 3.11/3.12; [combine, NULL, a, result] on 3.13
    expected_null = 1 if PY >= (3, 13) else 0
    assert kinds[expected_null] == "null" and len(kinds) == 4
    nulls = tuple(i for i, k in enumerate(kinds) if k == "null")
    assert nulls == (expected_null,)
    rc = R.make_resume_code(code, after, stack_size=3, null_positions=nulls, live_locals=())
    fn = rc.make_function(call_mid.__globals__, ())
    C.reset()
    assert fn(combine, 1, 20) == (1, 20, 3)
    assert C.LOG == [("combine", 1, 20, 3)]
    assert rc.argnames == ("___stack0", "___stack1", "___stack2")


@pytest.mark.parametrize("layout", ["unbound_self", "null_bound"])
def test_resume_after_call_in_method_call(layout):
    code = method_mid.__code__
    after = L.offset_after(code, _first_call_to(code, "middle"))
    assert L.stack_depth_at(code, after) == 4
    h = Holder()
    if layout == "unbound_self":  # [method, self, a, res]: what LOAD_METHOD/LOAD_ATTR push
        stack, nulls = (Holder.meth, h, 1, 50), ()
    elif PY >= (3, 13):  # [bound, NULL, a, res]
        stack, nulls = (h.meth, 1, 50), (1,)
    else:  # [NULL, bound, a, res]
        stack, nulls = (h.meth, 1, 50), (0,)
    rc = R.make_resume_code(code, after, stack_size=len(stack), null_positions=nulls, live_locals=())
    assert rc.make_function(globals(), ())(*stack) == ("meth", 1, 50)


def test_resume_after_call_inside_loop():
    code = loop_call.__code__
    after = L.offset_after(code, _first_call_to(code, "middle"))
    kinds = L.stack_kinds_at(code, after)
    assert kinds[0] == "iter" and len(kinds) == 4
    acc = [0]
    it = iter([2, 3])
    rc = R.make_resume_code(code, after, stack_size=4, live_locals=("acc",))
    fn = rc.make_function(globals(), ())
    assert fn(it, list.append, acc, 10, acc) == [0, 10, 20, 30]


def comp_call(xs, outer):
    if outer:
        x = "outer"
    ys = [middle(x) for x in xs]
    try:
        return ys, x
    except UnboundLocalError:
        return ys, "x unbound"


@pytest.mark.skipif(PY < (3, 12), reason="comprehensions are inlined from 3.12 (PEP 709)")
@pytest.mark.parametrize("outer", [False, True])
def test_resume_inside_inlined_comprehension(outer):
    """[saved x (NULL if x was unbound), list, iterator, call result]: the saved outer x is
    restored by the original STORE_FAST after the loop, NULL included."""
    code = comp_call.__code__
    after = L.offset_after(code, _first_call_to(code, "middle"))
    assert L.stack_kinds_at(code, after) == ("value", "value", "iter", "value")
    assert L.in_loop(code, after) and not L.in_try_block(code, after)
    if outer:
        stack, nulls = ("outer", [10], iter([3]), 20), ()
    else:
        stack, nulls = ([10], iter([3]), 20), (0,)
    rc = R.make_resume_code(code, after, stack_size=len(stack), null_positions=nulls, live_locals=())
    fn = rc.make_function(globals(), ())
    expected = comp_call([1, 2, 3], outer)
    assert fn(*stack) == expected == ([10, 20, 30], "outer" if outer else "x unbound")


def test_stack_size_is_checked():
    code = call_mid.__code__
    after = L.offset_after(code, _first_call_to(code, "middle"))
    with pytest.raises(ValueError, match="stack holds 4"):
        R.make_resume_code(code, after, stack_size=4, null_positions=(0,), live_locals=())
    with pytest.raises(ValueError):
        R.make_resume_code(code, after + 1, stack_size=0, live_locals=())
    with pytest.raises(ValueError, match="plain local"):
        R.make_resume_code(C.closures.__code__, L.statement_starts(C.closures.__code__)[-1],
                           stack_size=0, live_locals=("x",))


# ------------------------------------------------------------------------------------
# Unpassed locals, caching, unsupported code


def reads_two(a, b):
    x = a + 1
    y = b + 2
    C.LOG.append("mid")
    return x + y


def test_unpassed_local_raises_unbound_local_error():
    code = reads_two.__code__
    off = L.statement_starts(code)[-1]  # return x + y  (3.13: LOAD_FAST_LOAD_FAST x, y)
    assert L.live_locals_at(code, off) == {"x", "y"}
    rc = R.make_resume_code(code, off, stack_size=0, live_locals=("x",))
    fn = rc.make_function(reads_two.__globals__, ())
    with pytest.raises(UnboundLocalError):
        fn(1)
    names = [i.opname for i in L.instructions(rc.code)]
    if PY >= (3, 12):
        assert "LOAD_FAST" not in names and "LOAD_FAST_LOAD_FAST" not in names


_CRASH_PROBE = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    import tests.capture.resume_cases
    from tempa.capture import liveness as L, resume as R

    def f(a, b):
        x = a + 1
        y = b + 2
        for i in range(2):
            x = x + i
        print("mid")
        return x + y, [i * 2 for i in range(2)], a

    code = f.__code__
    results = []
    for off in L.statement_starts(code):
        rc = R.make_resume_code(code, off, stack_size=0, live_locals=())
        fn = rc.make_function({{"print": lambda *a: None, "range": range}}, ())
        try:
            fn()
        except UnboundLocalError:
            results.append("unbound")
    print("OK", len(results), len(L.statement_starts(code)))
    """
)


def test_no_crash_when_nothing_is_passed():
    """In a subprocess: a crash (SIGSEGV on 3.12+ without LOAD_FAST_CHECK) must not kill pytest."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(
        [sys.executable, "-c", _CRASH_PROBE.format(root=root)],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    _, n_unbound, n_points = proc.stdout.split()
    assert n_unbound == n_points


def gen(n):
    yield n


async def coro(n):
    return n


def test_generators_and_coroutines_are_unsupported():
    for fn in (gen, coro):
        code = fn.__code__
        with pytest.raises(R.ResumeUnsupported) as info:
            R.make_resume_code(code, L.statement_starts(code)[0], stack_size=0, live_locals=())
        assert isinstance(info.value, NotImplementedError)


def test_cache_returns_one_code_per_key():
    code = reads_two.__code__
    off = L.statement_starts(code)[-1]
    a = R.make_resume_code(code, off, stack_size=0, live_locals=("x", "y"))
    b = R.make_resume_code(code, off, stack_size=0, live_locals=["x", "y"])
    c = R.make_resume_code(code, off, stack_size=0, live_locals=("y", "x"))
    assert a is b and a is not c
    assert a.argnames == ("x", "y") and c.argnames == ("y", "x")
    assert a.make_function(globals(), ())(1, 2) == 3 == c.make_function(globals(), ())(2, 1)


def test_cells_become_freevars_and_closure_is_checked():
    fn = C.closures
    code = fn.__code__
    off = L.statement_starts(code)[-1]
    rc = R.make_resume_code(code, off, stack_size=0, live_locals=("r1", "r2", "g", "lam"))
    assert rc.freevars == tuple(code.co_freevars) + tuple(code.co_cellvars)
    assert rc.code.co_freevars == rc.freevars and rc.code.co_cellvars == ()
    with pytest.raises(ValueError):
        rc.make_function(fn.__globals__, ())
    cells = rc.closure_for(fn.__closure__, {"x": 5, "scale": types.CellType(3)})
    assert all(isinstance(c, types.CellType) for c in cells)
    f2 = rc.make_function(fn.__globals__, cells)
    g = lambda y: 0  # noqa: E731
    assert f2(1, 2, g, lambda z: -z) == (1, 2, 0, 0, 5)


def test_zero_arg_super_is_made_explicit():
    """Zero-argument super() reads the frame's first local slot; in a resume function that
    slot is ___stack0 or whichever live local comes first."""
    fn = C.Child.compute
    code = fn.__code__
    lineno = code.co_firstlineno + 4  # s = super()
    off = next(o for o in L.statement_starts(code) if L.instruction_at(code, o).positions.lineno == lineno)
    live = tuple(sorted(L.live_locals_at(code, off), reverse=True))  # y, self: self not first
    assert live[-1] == "self" and live[0] != "self"
    rc = R.make_resume_code(code, off, stack_size=0, live_locals=live)
    ops = [(i.opname, i.argval) for i in L.instructions(rc.code)]
    assert ("LOAD_DEREF", "__class__") in ops
    f2 = rc.make_function(fn.__globals__, rc.closure_for(fn.__closure__))
    obj = C.Child()
    obj.calls = 1
    C.reset()
    values = {"self": obj, "y": 6}
    assert f2(*(values[n] for n in live)) == (14, 1)
    assert C.LOG == [("base", 6)]


def test_resume_code_metadata():
    code = C.fstrings.__code__
    off = L.statement_starts(code)[2]
    rc = R.make_resume_code(code, off, stack_size=0, live_locals=("name",), name="my_resume")
    assert rc.code.co_name == "my_resume"
    assert rc.code.co_filename == code.co_filename
    assert rc.code.co_argcount == 1 and rc.code.co_varnames[0] == "name"
    assert not rc.code.co_flags & (R.CO_VARARGS | R.CO_VARKEYWORDS)
    default = R.make_resume_code(code, off, stack_size=0, live_locals=("name",))
    assert default.code.co_name == f"fstrings_resume_at_{off}"


def _loop_building_a_list(x, n):
    out = []
    for i in range(n):
        out.append(x * i)
    return out


@pytest.mark.skipif(sys.version_info < (3, 12), reason="END_FOR exists from 3.12")
def test_resume_at_a_loop_exit_with_a_null_below_the_iterator():
    # CPython's FOR_ITER jumps over END_FOR (and 3.13's POP_TOP after it) when the iterator
    # is exhausted; a resume function that ran END_FOR popped the NULL under the iterator:
    # a segfault, seen on 3.12 with a graph break forced at the loop's exit.
    code = _loop_building_a_list.__code__
    end_for = next(i.offset for i in dis.get_instructions(code) if i.opname == "END_FOR")
    rc = R.make_resume_code(code, end_for, stack_size=1, null_positions=(1,),
                            live_locals=["out"])
    # Run in a child: a regression is a crash of the interpreter, not an exception.
    script = textwrap.dedent(f"""
        import sys, types
        sys.path.insert(0, {os.getcwd()!r})
        import tests.capture.resume_cases
        from tempa.capture import resume as R
        from tests.capture.test_resume import _loop_building_a_list as f
        import dis
        code = f.__code__
        end_for = next(i.offset for i in dis.get_instructions(code) if i.opname == "END_FOR")
        rc = R.make_resume_code(code, end_for, stack_size=1, null_positions=(1,),
                                live_locals=["out"])
        print(types.FunctionType(rc.code, {{}})(iter([]), [1, 2]))
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[1, 2]"
    assert rc.stack_size == 1
