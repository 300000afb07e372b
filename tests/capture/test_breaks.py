"""Graph breaks (issue 3): each kind of break gives eager's results on every call, side
effects happen in order, and explain/fullgraph/disable report them."""
import logging
import math
import traceback

import numpy as np
import pytest
import torch
import torch.nn as nn

import tempa
from tests.capture.paths import counts
from tests.models.compare import assert_same


def both(fn, *args, backend="eager", calls=3, **kwargs):
    """Run fn eagerly and compiled on the same inputs; return the compiled function."""
    fast = tempa.compile(fn, backend=backend)
    for _ in range(calls):
        assert_same(fast(*args, **kwargs), fn(*args, **kwargs))
    return fast


class JaringanPutus(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        y = torch.relu(self.fc1(x))
        if y.sum() > 0:
            y = y * 1.0
        return self.fc2(y)


BRANCH_LINE = JaringanPutus.forward.__code__.co_firstlineno + 2   # `if y.sum() > 0:`


def test_seed_explain_prints_2_graphs_1_break_5_ops():
    torch.manual_seed(0)
    model = JaringanPutus()
    x = torch.randn(4, 32)
    laporan = tempa.explain(model)(x)
    assert (laporan.graph_count, laporan.graph_break_count, laporan.op_count) == (2, 1, 5)
    reason = laporan.break_reasons[0]
    assert reason.type == "data-dependent branch"
    assert reason.filename == __file__ and reason.lineno == BRANCH_LINE and reason.hint
    text = str(laporan)
    assert "if y.sum() > 0:" in text and "Graph count: 2" in text


@pytest.mark.parametrize("backend", ["eager", "tempa"])
def test_tensor_branch_takes_each_side_on_alternate_calls(backend):
    def f(x):
        y = x * 2
        if y.sum() > 0:
            z = y + 1
        else:
            z = y - 1
        return z * 3

    fast = tempa.compile(f, backend=backend)
    for i in range(6):
        x = torch.randn(5) + (3 if i % 2 else -3)
        assert_same(fast(x), f(x))
    s = tempa.stats()
    assert s.graph_breaks == 1 and s.captures == 3   # the function + both resume functions


def test_seed_graph_break_model_matches_eager_on_both_branches():
    model = JaringanPutus()
    fast = tempa.compile(model)
    x = torch.randn(4, 32)
    assert_same(fast(x), model(x))
    with torch.no_grad():
        model.fc1.bias.fill_(-1e4)            # y == 0: the other branch
    assert_same(fast(x), model(x))
    assert counts() == (3, 1, 0, 0)


def test_print_happens_every_call_in_order(capsys):
    def f(x):
        print("before", x.shape[0])
        y = x + 1
        print("middle")
        return y * 2

    fast = both(f, torch.ones(3))
    out = capsys.readouterr().out.splitlines()
    assert out == ["before 3", "middle"] * 6
    assert tempa.stats().graph_breaks >= 1


def test_appending_to_a_list_and_setting_attributes():
    log = []

    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.calls = 0
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            self.calls += 1
            log.append(self.calls)
            return self.lin(x) * self.calls

    model = Counter()
    fast = tempa.compile(model, backend="eager")
    x = torch.randn(2, 4)
    outs = [fast(x) for _ in range(3)]
    assert model.calls == 3 and log == [1, 2, 3]
    for i, out in enumerate(outs, 1):
        assert_same(out, model.lin(x) * i)
    assert counts() == (3, 0, 2, 0)


def test_logging_is_a_side_effect_each_call(caplog):
    logger = logging.getLogger("tempa.test.user")

    def f(x):
        logger.warning("value %s", x.shape)
        return x.sin()

    with caplog.at_level(logging.WARNING, logger="tempa.test.user"):
        both(f, torch.ones(2))
    assert [r.getMessage() for r in caplog.records if r.name == "tempa.test.user"] == \
        ["value torch.Size([2])"] * 6
    assert counts() == (5, 3, 0, 0)


def test_numpy_and_math_on_item_values():
    def f(x):
        s = x.abs().sum().item()
        scale = math.sqrt(s) + float(np.float32(2.0))
        return x * scale

    both(f, torch.arange(4.0))
    assert tempa.stats().graph_breaks >= 1


def test_tolist_used_by_python():
    def f(x):
        sizes = x.tolist()
        return torch.ones(int(sum(sizes)))

    both(f, torch.tensor([1, 2, 3]))
    assert counts() == (2, 1, 0, 0)


def test_unknown_c_function_breaks():
    def f(x):
        y = x + 1
        z = np.asarray(y.detach().numpy()).sum()
        return y * float(z)

    both(f, torch.ones(3))
    assert counts() == (1, 0, 0, 0)


def test_try_except_around_tensor_code():
    def f(x):
        try:
            y = x.relu()
            if y.sum() > 100:
                raise ValueError("big")
            y = y + 1
        except ValueError:
            y = x - 1
        return y * 2

    fast = tempa.compile(f, backend="eager")
    for x in (torch.ones(3), torch.full((3,), 100.0), torch.ones(3)):
        assert_same(fast(x), f(x))
    assert counts() == (1, 1, 0, 0)


def test_generator_inside_forward():
    def f(xs):
        total = sum(x * 2 for x in xs)
        return tuple(t.relu() for t in xs), total

    both(f, [torch.randn(3), torch.randn(3)])
    assert counts() == (1, 0, 0, 0)


class Inner(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        y = self.lin(x)
        if y.mean() > 0:
            return y * 2
        return y / 2


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(8, 8)
        self.inner = Inner()
        self.post = nn.Linear(8, 8)

    def forward(self, x):
        return self.post(self.inner(torch.tanh(self.pre(x))))


def test_break_inside_a_submodule_compiles_the_callee_separately():
    model = Outer()
    fast = tempa.compile(model, backend="eager")
    for i in range(4):
        x = torch.randn(3, 8) * (1 + i)
        assert_same(fast(x), model(x))
    report = tempa.explain(model)(torch.randn(3, 8))
    # Outer: graph before the call + graph after; Inner: graph before its branch + after.
    assert report.graph_count == 4
    assert report.graph_break_count == 2


def test_break_inside_a_loop():
    def f(x, n):
        for i in range(n):
            x = x * 2
            if x.sum() > 10:
                x = x - 1
            print(i)
        return x + 1

    for start in (0.1, 3.0):
        both(f, torch.full((3,), start), 4)
    assert counts() == (2, 2, 0, 0)


def test_break_inside_no_grad_and_autocast_blocks():
    def f(x):
        y = x * 2
        with torch.no_grad():
            z = y + 1
            print("inside", torch.is_grad_enabled())
            w = z * 3
        grad_after = torch.is_grad_enabled()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            a = w @ w.t()
            print("autocast", torch.is_autocast_enabled("cpu"))
            b = a @ a
        return y, w, b, grad_after

    x = torch.randn(4, 4, requires_grad=True)
    fast = tempa.compile(f, backend="eager")
    for _ in range(2):
        out, ref = fast(x), f(x)
        assert_same(out, ref, atol=1e-2, rtol=1e-2)
        assert out[0].requires_grad and not out[1].requires_grad
        assert out[2].dtype == torch.bfloat16 and out[3] is True
    assert torch.is_grad_enabled() and not torch.is_autocast_enabled("cpu")
    assert counts() == (5, 4, 0, 0)


def test_user_exception_propagates_with_the_users_line():
    def f(x):
        y = x + 1
        if y.shape[0] == 3:
            raise KeyError("no such thing")
        return y

    fast = tempa.compile(f, backend="eager")
    with pytest.raises(KeyError) as err:
        fast(torch.ones(3))
    frames = [fr for fr in err.traceback if str(fr.path) == __file__]
    assert any("raise KeyError" in str(fr.statement) for fr in frames)
    assert_same(fast(torch.ones(2)), torch.ones(2) + 1)
    assert counts() == (1, 0, 0, 0)


def test_fullgraph_raises_graph_break_error_naming_the_place():
    fast = tempa.compile(JaringanPutus(), fullgraph=True)
    with pytest.raises(tempa.GraphBreakError) as err:
        fast(torch.randn(4, 32))
    msg = str(err.value)
    assert "data-dependent branch" in msg and f"{__file__}:{BRANCH_LINE}" in msg and "hint" in msg


def test_disable_runs_eagerly_and_breaks_the_caller():
    calls = []

    @tempa.disable
    def helper(y):
        calls.append(torch.compiler.is_compiling())
        return y * 2

    def f(x):
        return helper(x + 1) - 1

    fast = both(f, torch.ones(3))
    assert calls == [False] * 6
    report = tempa.explain(f)(torch.ones(3))
    assert [r.type for r in report.break_reasons] == ["disabled by tempa.disable"]
    assert tempa.disable(helper) is helper


def test_breaks_are_logged_once_with_reason(caplog):
    def f(x):
        print("side effect")
        return x + 1

    tempa.logs.enable("breaks")
    with caplog.at_level(logging.INFO, logger="tempa.breaks"):
        both(f, torch.ones(2))
    msgs = [r.getMessage() for r in caplog.records if r.name == "tempa.breaks"]
    assert len(msgs) == 1 and "print / side effect" in msgs[0]


def test_break_inside_except_body_runs_the_frame_eagerly():
    def f(x):
        try:
            raise ValueError("x")
        except ValueError:
            print("handling")
            y = x + 1
        return y * 2

    both(f, torch.ones(2))
    assert tempa.stats().eager_fallbacks == 1


@torch.compiler.disable
def _raises(t):
    raise ValueError("raised after the break")


def test_a_traceback_through_the_generated_entry_shows_its_source():
    def f(x):
        return _raises(x * 2)

    with pytest.raises(ValueError) as raised:
        tempa.compile(f, backend="eager")(torch.ones(2))
    frames = [fr for fr in traceback.extract_tb(raised.value.__traceback__)
              if fr.filename.startswith("<tempa entry for ")]
    # the entry runs the breaking call itself; its line is in linecache, so the traceback
    # (and pdb) shows it
    assert len(frames) == 1 and frames[0].line.startswith("___r = ___F"), frames
    assert counts() == (1, 1, 0, 0)


def test_break_types_are_specific_and_each_has_a_hint():
    from tempa.capture.breaks import BREAK_TYPES

    def f(x):
        return x.grad_fn, x * 2

    out = tempa.explain(f)(torch.ones(2, requires_grad=True) * 1)
    assert out.break_reasons and out.break_reasons[0].type == "tensor attribute"
    assert "outside the compiled function" in out.break_reasons[0].hint
    assert all(hint for hint in BREAK_TYPES.values())
    assert "unsupported construct" not in BREAK_TYPES   # no catch-all type


@pytest.mark.parametrize("body, kind", [
    (lambda x: ({1: x} | {2: x}, x + 1), "operator on a container of tensors"),
    (lambda x: setattr(x * 2, "requires_grad", True), "tensor attribute"),
])
def test_former_catch_all_breaks_have_their_own_type(body, kind):
    out = tempa.explain(body)(torch.ones(2))
    assert [r.type for r in out.break_reasons] == [kind]
    assert out.break_reasons[0].hint
