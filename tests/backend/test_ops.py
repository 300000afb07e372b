"""The loop IR's named ops (backend/ops.py) and the two tables that spell them: C++
(codegen/emit.py ``CPP_OPS``) and Triton (codegen/triton_emit.py ``TRITON_OPS``).

Every op must be spelled by both renderers; an unknown name is an ``UnknownOp`` error, not an
ATen fallback. The Triton spellings cannot run here (no GPU), so each op's emitted Triton
text is executed with torch functions standing in for ``tl`` / ``libdevice`` and the
prelude's helpers, and compared with the torch op it stands for."""
import re
import textwrap
import types

import pytest
import torch

from tempa.backend import ops
from tempa.backend.codegen import emit, triton_emit
from tempa.backend.codegen.triton_emit import TritonEmitter
from tempa.backend.ir import ScalarExpr, Unlowerable
from tempa.backend.lower import pointwise as pw

DTYPES = [torch.float32, torch.float64, torch.int64, torch.bool]


def test_every_op_has_both_spellings_and_nothing_else():
    assert set(emit.CPP_OPS) == set(ops.OPS)
    assert set(triton_emit.TRITON_OPS) == set(ops.OPS)


def test_the_aten_tables_name_only_known_ops():
    for table in (pw.UNARY, pw.BINARY, pw.COMPARE, pw.LOGICAL):
        assert set(table.values()) <= set(ops.OPS), table


def _args(op, dt):
    return [ScalarExpr(f"a{i}", torch.bool if op.name == "where" and i == 0 else dt) for i in range(op.arity)]


@pytest.mark.parametrize("name", sorted(ops.OPS))
@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_cpp_renders_every_op(name, dt):
    op = ops.OPS[name]
    k = emit.Emitter()
    v = k.op(name, _args(op, dt), dt)
    assert v.dtype == (torch.bool if op.predicate else dt)
    (line,) = k.lines
    assert re.fullmatch(rf"  const {emit.ctype(v.dtype)} {v.expr} = .+;", line), line
    assert all(f"a{i}" in line for i in range(op.arity)), line
    assert "{" not in line


@pytest.mark.parametrize("name", sorted(ops.OPS))
@pytest.mark.parametrize("dt", DTYPES, ids=str)
def test_triton_renders_every_op_as_python(name, dt):
    op = ops.OPS[name]
    k = TritonEmitter(two_d=False)
    try:
        v = k.op(name, _args(op, dt), dt)
    except Unlowerable:
        # a spelling Triton lacks on purpose says so: only integer / bool pow
        assert name == "pow" and not dt.is_floating_point
        return
    assert v.dtype == (torch.bool if op.predicate else dt)
    (line,) = k.lines
    compile(line.strip(), "<op>", "exec")
    assert all(f"a{i}" in line for i in range(op.arity)), line
    called = set(re.findall(r"\b(t_\w+)\(", line))
    assert called <= set(re.findall(r"^def (t_\w+)", triton_emit.PRELUDE, re.M)), called


def test_triton_spellings_that_differ_by_dtype():
    def text(name, dt, n=2):
        k = TritonEmitter(two_d=False)
        k.op(name, [ScalarExpr(f"a{i}", dt) for i in range(n)], dt)
        return k.lines[0].split(" = ", 1)[1]
    assert text("div", torch.int64) == "a0 // a1"
    assert text("div", torch.float32) == "a0 / a1"
    assert text("maximum", torch.bool) == "t_or(a0, a1)"
    assert text("minimum", torch.bool) == "t_and(a0, a1)"
    assert text("floor", torch.int64, 1) == "(a0)"
    assert text("fmod", torch.int64) == "(a0 % a1)"
    assert text("relu", torch.float32, 1) == "tl.where(a0 < 0, 0.0, a0)"    # NaN stays NaN
    assert text("bitwise_not", torch.bool, 1) == "(a0 == 0)"
    assert text("bitwise_not", torch.int64, 1) == "(~a0)"


def test_an_unknown_op_is_an_error_not_a_fallback():
    assert not issubclass(ops.UnknownOp, Unlowerable)
    x = ScalarExpr("a0", torch.float32)
    for k in (emit.Emitter(), TritonEmitter(two_d=False)):
        with pytest.raises(ops.UnknownOp, match="no_such_op"):
            k.op("no_such_op", [x], torch.float32)
        with pytest.raises(ops.UnknownOp, match="takes 1 arguments"):
            k.op("exp", [x, x], torch.float32)
    with pytest.raises(ops.UnknownOp, match="no_such_op"):
        pw.pointwise(_node_with_meta(), "no_such_op", [1.0])


def _node_with_meta():
    g = torch.fx.Graph()
    n = g.placeholder("x")
    n.meta["traced_meta"] = types.SimpleNamespace(shape=(2,), dtype=torch.float32)
    return n


# --- the Triton spellings, executed with torch standing in for Triton ------------------------

def _fake_triton():
    tl = types.SimpleNamespace(
        exp=torch.exp, exp2=torch.exp2, log=torch.log, log2=torch.log2, sqrt_rn=torch.sqrt,
        sin=torch.sin, cos=torch.cos, abs=torch.abs, floor=torch.floor, ceil=torch.ceil,
        erf=torch.erf, where=torch.where)
    libdevice = types.SimpleNamespace(
        log10=torch.log10, log1p=torch.log1p, expm1=torch.expm1, tan=torch.tan, tanh=torch.tanh,
        sinh=torch.sinh, cosh=torch.cosh, asin=torch.asin, acos=torch.acos, atan=torch.atan,
        asinh=torch.asinh, acosh=torch.acosh, atanh=torch.atanh, erfc=torch.erfc,
        lgamma=torch.lgamma, nearbyint=torch.round, trunc=torch.trunc, pow=torch.pow,
        atan2=torch.atan2, fmod=torch.fmod)
    ns = {"tl": tl, "libdevice": libdevice, "triton": types.SimpleNamespace(jit=lambda f: f)}
    prelude = "\n".join(l for l in triton_emit.PRELUDE.splitlines() if not l.startswith(("import", "from")))
    exec(prelude, ns)  # noqa: S102 - the prelude's helpers, our own text
    return ns


# torch's spelling of each op, where it is not the op's own name
_TORCH = {"round": torch.round, "floordiv": torch.floor_divide, "relu": torch.relu,
          "where": torch.where, "sign": torch.sign}
# Integer-only ops, and remainder (its Triton helper relies on C's %, which torch's % is not)
_NOT_ON_FLOATS = {"bitwise_not", "bitwise_and", "bitwise_or", "bitwise_xor", "remainder"}
# Computed in bool by their lowerings (the arguments cast to bool first)
_IN_BOOL = {"logical_and", "logical_or", "logical_xor"}
_VALUES = [-2.5, -1.0, -0.5, -0.0, 0.0, 0.3, 0.5, 1.5, 2.5, 3.0, float("inf"), float("-inf"), float("nan")]


@pytest.mark.parametrize("name", sorted(set(ops.OPS) - _NOT_ON_FLOATS))
def test_triton_float_spellings_compute_what_torch_computes(name):
    """Each spelling on floats (and the logical ops on bools) including signed zeros,
    infinities and NaN."""
    op = ops.OPS[name]
    vals = torch.tensor(_VALUES)
    # every pair of values for binary ops: the first argument varies fastest
    grids = torch.meshgrid(*[vals] * min(op.arity, 2), indexing="ij") if op.arity > 1 else (vals,)
    args = [g.reshape(-1) for g in grids]
    dt = torch.bool if name in _IN_BOOL else torch.float32
    if name == "where":
        args = [args[0] > 0, args[0], args[1]]
    elif dt == torch.bool:
        args = [a != 0 for a in args]
    k = TritonEmitter(two_d=False)
    v = k.op(name, [ScalarExpr(f"a{i}", torch.bool if name == "where" and i == 0 else dt)
                    for i in range(op.arity)], dt)
    ns = _fake_triton()
    ns.update({f"a{i}": a for i, a in enumerate(args)})
    exec(textwrap.dedent("\n".join(k.lines)), ns)  # noqa: S102 - the emitted kernel text
    got = ns[v.expr]
    want = _TORCH.get(name, getattr(torch, name, None))(*args)
    if name == "sigmoid":       # torch's sigmoid is exact at the tails, 1 / (1 + e**-x) too
        want = 1 / (1 + torch.exp(-args[0]))
    torch.testing.assert_close(got.to(want.dtype), want, equal_nan=True, rtol=1e-6, atol=1e-6,
                               msg=lambda m: f"{name}: {k.lines}\n{m}")


def test_triton_fp64_literals_are_fp64_constants():
    # Triton makes a Python float literal fp32: an Adam step's libdevice.pow(0.999, t) with t
    # fp64 failed to compile, and fp64 arithmetic with 0.1 lost the literal's low bits
    def text(name, dt, const_first):
        k = TritonEmitter(two_d=False)
        c, t = k.const(0.1, dt), ScalarExpr("t", dt)
        k.op(name, [c, t] if const_first else [t, c], dt)
        return k.lines[0].split(" = ", 1)[1]
    assert text("pow", torch.float64, True) == "libdevice.pow(tl.full([1], 0.1, tl.float64), t)"
    assert text("mul", torch.float64, False) == "t * tl.full([1], 0.1, tl.float64)"
    assert text("mul", torch.float32, False) == "t * 0.1"        # fp32 keeps its literal
    k = TritonEmitter(two_d=False)
    k.op("sqrt", [ScalarExpr("t", torch.float64)], torch.float64)
    k.op("sqrt", [ScalarExpr("u", torch.float32)], torch.float32)
    assert [line.split(" = ", 1)[1] for line in k.lines] == ["libdevice.sqrt(t)", "tl.sqrt_rn(u)"]
    k = TritonEmitter(two_d=False)
    folded = k.op("add", [k.const(0.1, torch.float64), k.const(0.2, torch.float64)], torch.float64)
    assert folded.expr in k.consts and not k.lines                # constants still fold
