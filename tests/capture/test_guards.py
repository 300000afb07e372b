"""Guards and recompiles (issue 2)."""
import warnings

import torch
import torch.nn as nn

import tempa
from tests.capture.paths import counts
from tests.models.compare import assert_same

FLAG = True


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.drop = nn.Dropout(0.5)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(self.drop(torch.relu(self.fc1(x))))


def test_batch_8_then_9_recompiles_then_both_served_from_cache():
    model = Mlp().eval()
    fast = tempa.compile(model, backend="eager")
    x8, x9 = torch.randn(8, 32), torch.randn(9, 32)
    assert_same(fast(x8), model(x8))
    assert_same(fast(x9), model(x9))
    s = tempa.stats()
    assert (s.captures, s.recompiles) == (2, 1)
    for _ in range(3):
        assert_same(fast(x8), model(x8))
        assert_same(fast(x9), model(x9))
    assert tempa.stats().captures == 2


def test_eval_train_switch_recompiles():
    torch.manual_seed(0)
    model = Mlp().eval()
    fast = tempa.compile(model, backend="eager")
    x = torch.randn(8, 32)
    assert_same(fast(x), model(x))
    model.train()
    torch.manual_seed(1)
    out = fast(x)
    assert tempa.stats().recompiles == 1
    torch.manual_seed(1)
    assert_same(out, model(x))                      # the same dropout mask as eager
    model.eval()
    assert not torch.allclose(out, model(x))        # dropout was active in training mode
    model.train()
    model.eval()
    assert_same(fast(x), model(x))
    assert tempa.stats().captures == 2               # eval entry reused


def test_global_flag_read_in_forward_is_guarded():
    global FLAG

    def f(x):
        if FLAG:
            return x * 2
        return x * 3

    fast = tempa.compile(f, backend="eager")
    x = torch.ones(3)
    FLAG = True
    assert_same(fast(x), x * 2)
    FLAG = False
    try:
        assert_same(fast(x), x * 3)
    finally:
        FLAG = True
    assert tempa.stats().captures == 2


def test_python_constants_are_guarded():
    def f(x, scale, mode="add"):
        return x * scale if mode == "mul" else x + scale

    fast = tempa.compile(f, backend="eager")
    x = torch.ones(2)
    assert_same(fast(x, 2), x + 2)
    assert_same(fast(x, 3), x + 3)
    assert_same(fast(x, 3, mode="mul"), x * 3)
    assert_same(fast(x, 2.0), x + 2.0)
    assert tempa.stats().captures == 4


def test_recompile_limit_then_eager_with_one_warning(monkeypatch):
    monkeypatch.setattr(tempa.config, "recompile_limit", 3)

    def f(x, n):
        return x + n

    fast = tempa.compile(f, backend="eager")
    x = torch.zeros(2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for n in range(6):   # floats: guarded by value (ints become symbols, as in torch.compile)
            assert_same(fast(x, n + 0.5), x + (n + 0.5))
    mine = [w for w in caught if "recompile_limit" in str(w.message)]
    assert len(mine) == 1
    assert "f" in str(mine[0].message) and "n ==" in str(mine[0].message)
    s = tempa.stats()
    assert s.captures == 3 and s.eager_fallbacks == 1


def test_replacing_a_submodule_or_parameter_never_leaves_a_stale_entry():
    model = Mlp().eval()
    fast = tempa.compile(model, backend="eager")
    x = torch.randn(4, 32)
    assert_same(fast(x), model(x))
    model.fc2 = nn.Linear(64, 10)                     # new submodule
    assert_same(fast(x), model(x))
    model.fc1.weight = nn.Parameter(torch.randn(64, 32))  # new parameter
    assert_same(fast(x), model(x))
    model.fc1.register_buffer("unused", torch.ones(1))
    assert_same(fast(x), model(x))
    assert counts() == (4, 0, 0, 0)


def test_tensor_properties_are_guarded():
    def f(x):
        return x * 2

    fast = tempa.compile(f, backend="eager")
    x = torch.randn(4, 4)
    fast(x)
    fast(x.t())                                # other strides
    fast(x.double())                           # other dtype
    fast(x.clone().requires_grad_())           # requires_grad
    assert tempa.stats().captures == 4
    y = x.clone().requires_grad_()
    out = fast(y)
    out.sum().backward()
    assert_same(y.grad, torch.full((4, 4), 2.0))


def test_grad_mode_is_guarded():
    model = Mlp().eval()
    fast = tempa.compile(model, backend="eager")
    x = torch.randn(2, 32)
    out = fast(x)
    assert out.requires_grad
    with torch.no_grad():
        out2 = fast(x)
    assert not out2.requires_grad
    assert tempa.stats().captures == 2


def test_outer_autocast_is_captured_and_guarded():
    model = Mlp().eval()
    fast = tempa.compile(model, backend="eager")
    x = torch.randn(4, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, ref = fast(x), model(x)
    assert out.dtype == torch.bfloat16 and ref.dtype == torch.bfloat16
    assert_same(out, ref)
    assert_same(fast(x), model(x))          # outside autocast: a second entry, fp32
    assert fast(x).dtype == torch.float32
    assert tempa.stats().captures == 2


def test_dtype_read_under_autocast_is_autocasts():
    # Code that reads a result's dtype under autocast sees what eager sees (bfloat16 from a
    # linear), static and symbolic captures alike.
    w = torch.randn(6, 8)

    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = torch.nn.functional.linear(x, w)
            return y * 2 if y.dtype == torch.bfloat16 else y - 1

    for dynamic in (False, True):
        tempa.reset()
        fast = tempa.compile(f, backend="eager", dynamic=dynamic)
        for x in (torch.randn(3, 8), torch.randn(2, 5, 8)):
            out = fast(x)
            assert out.dtype == torch.bfloat16
            assert_same(out, f(x))
    assert counts() == (2, 0, 1, 0)


def test_model_half_and_double_after_compile():
    model = Mlp().eval()
    fast = tempa.compile(model, backend="eager")
    x = torch.randn(4, 32)
    assert_same(fast(x), model(x))
    model.double()                            # parameters change dtype in place
    assert_same(fast(x.double()), model(x.double()))
    assert fast(x.double()).dtype == torch.float64
    assert counts() == (2, 0, 1, 0)
