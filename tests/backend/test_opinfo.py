"""PyTorch's OpInfo samples (CPU float32) through the backend, compared with eager.

Default: a quick subset. ``TEMPA_OPINFO=1``: every op in op_db (slow); prints the pass rate
and the failures. A failure is a wrong value or an error eager does not raise; an op the
backend cannot compile must fall back to ATen and still be right, never silently wrong.
"""
import os
import warnings

import pytest
import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from tempa.backend import tempa_backend

QUICK = ["add", "sub", "mul", "div", "neg", "abs", "exp", "log", "sqrt", "rsqrt", "sigmoid",
         "tanh", "sin", "relu" if False else "nn.functional.relu", "clamp", "where", "maximum",
         "minimum", "pow", "sum", "mean", "amax", "amin", "var", "softmax", "log_softmax",
         "nn.functional.layer_norm", "nn.functional.gelu", "nn.functional.silu", "cat", "permute",
         "transpose", "reshape", "view", "expand", "squeeze", "unsqueeze", "gather",
         "index_select", "mm", "bmm", "addmm", "matmul", "nn.functional.linear", "masked_fill",
         "argmax", "cumsum", "remainder", "floor_divide", "isnan", "eq", "lt", "logical_and",
         "t", "narrow", "select", "split", "stack", "flip", "tril", "nn.functional.embedding"]


NONDETERMINISTIC = {"cauchy", "exponential", "geometric", "uniform", "multinomial",
                    "log_normal", "nn.functional.fractional_max_pool2d",
                    "nn.functional.fractional_max_pool3d", "nn.functional.rrelu",
                    "nn.functional.multi_head_attention_forward"}


def _graph_for(op, sample):
    """An FX graph calling ``op`` with the sample's tensors as placeholders."""
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    tens = [i for i, l in enumerate(leaves) if isinstance(l, torch.Tensor)]
    g = fx.Graph()
    phs = {i: g.placeholder(f"t{i}") for i in tens}

    def body(*ts):
        vals = list(leaves)
        for i, t in zip(tens, ts):
            vals[i] = t
        inp, args, kwargs = pytree.tree_unflatten(vals, spec)
        return op.op(inp, *args, **kwargs)
    out = g.call_function(body, tuple(phs[i] for i in tens))
    g.output(out)
    return fx.GraphModule(torch.nn.Module(), g), [leaves[i] for i in tens]


def _same(a, b):
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.shape != b.shape or a.dtype != b.dtype:
            return False
        if a.dtype.is_floating_point or a.dtype.is_complex:
            return torch.allclose(a, b, rtol=1e-4, atol=1e-5, equal_nan=True)
        return torch.equal(a, b)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b or (isinstance(a, float) and a != a and b != b)


def _f64(t):
    return t.to(torch.float64) if isinstance(t, torch.Tensor) and t.dtype.is_floating_point else t


def run_ops(names=None, max_samples=3):
    from torch.testing._internal.common_methods_invocations import op_db
    results = {"pass": [], "fail": [], "skip": []}
    for op in op_db:
        if names is not None and op.name not in names:
            continue
        if op.variant_test_name and names is not None:
            continue
        try:
            samples = list(op.sample_inputs("cpu", torch.float32, requires_grad=False))[:max_samples]
        except Exception:   # noqa: BLE001
            results["skip"].append(op.name)
            continue
        ok = True
        why = ""
        for s in samples:
            try:
                gm, ins = _graph_for(op, s)
                if any(t.layout != torch.strided for t in ins):
                    continue
                ref = gm(*[t.clone() for t in ins])
                if any(isinstance(t, torch.Tensor) and t.layout != torch.strided
                       for t in pytree.tree_leaves(ref)):
                    continue
            except Exception:   # noqa: BLE001 - eager itself rejects: nothing to compare
                continue
            if op.name in NONDETERMINISTIC or "empty" in op.name or "rand" in op.name \
                    or "dropout" in op.name or "normal" in op.name or "bernoulli" in op.name:
                continue   # random or uninitialised values: nothing to compare
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    c = tempa_backend(gm, [t.clone() for t in ins])
                    out = c(*[t.clone() for t in ins])
            except Exception as e:   # noqa: BLE001
                ok, why = False, f"error: {type(e).__name__}: {str(e)[:80]}"
                break
            try:
                same = _same(out, ref)
            except Exception:   # noqa: BLE001 - exotic dtypes: compare in float64
                same = _same(pytree.tree_map(_f64, out), pytree.tree_map(_f64, ref))
            if not same:
                ok, why = False, "WRONG RESULT"
                break
        name = op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")
        (results["pass"] if ok else results["fail"]).append(name if ok else (name, why))
    return results


def _report(r):
    n = len(r["pass"]) + len(r["fail"])
    print(f"\nOpInfo: {len(r['pass'])}/{n} ops pass ({100 * len(r['pass']) / max(n, 1):.1f}%), "
          f"{len(r['skip'])} skipped")
    for name, why in r["fail"]:
        print(f"  FAIL {name}: {why}")


def test_opinfo_quick():
    pytest.importorskip("expecttest")   # torch.testing._internal needs it
    r = run_ops(set(QUICK), max_samples=2)
    _report(r)
    wrong = [f for f in r["fail"] if f[1] == "WRONG RESULT"]
    assert not wrong, wrong
    assert len(r["pass"]) >= 0.9 * (len(r["pass"]) + len(r["fail"]))


@pytest.mark.skipif(not os.environ.get("TEMPA_OPINFO"), reason="full sweep: set TEMPA_OPINFO=1")
def test_opinfo_full():
    pytest.importorskip("expecttest")
    r = run_ops(None, max_samples=3)
    _report(r)
    wrong = [f for f in r["fail"] if f[1] == "WRONG RESULT"]
    assert not wrong, wrong
