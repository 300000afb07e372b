"""Shape-generic CPU code (issue 7): one capture and one gcc run serve every size."""
import pytest
import torch

import tempa
from tempa.backend import dynamic
from tests.models import gpt as gpt_mod
from tests.models import zoo
from tests.models.compare import assert_same


@pytest.fixture(autouse=True)
def _fresh(tmp_path):
    old = tempa.config.cache_dir
    tempa.config.cache_dir = str(tmp_path)     # an empty cache: gcc runs are counted
    tempa.reset()
    yield
    tempa.reset()
    tempa.config.cache_dir = old


def _infos(fast):
    return [e.compiled.tempa_info for e in tempa.entries(fast) if hasattr(e.compiled, "tempa_info")]


def test_seed_mlp_batch_8_to_64_one_generic_graph_grad_mode():
    model = zoo.make("mlp_seed").model
    fast = tempa.compile(model)
    for b in range(8, 65):
        x = torch.randn(b, 32)
        out = fast(x)
        assert_same(out, model(x))
    out.sum().backward()                        # the autograd variant is the generic one
    s = tempa.stats()
    assert s.captures <= 2 and s.gcc_runs <= 2, s
    assert any(i.dynamic.startswith("generic") for i in _infos(fast)), [i.dynamic for i in _infos(fast)]


def test_seed_mlp_no_grad_generic_code_takes_sizes():
    model = zoo.make("mlp_seed").model
    fast = tempa.compile(model)
    with torch.no_grad():
        for b in (8, 9, 10, 37, 64):
            x = torch.randn(b, 32)
            assert_same(fast(x), model(x))
    info = [i for i in _infos(fast) if i.dynamic][0]
    assert info.dynamic.startswith("generic"), info.dynamic
    assert "int64_t ds0" in info.cpp_source and "ds0 = a0.shape[0]" in info.wrapper_source
    assert tempa.stats().gcc_runs <= 2


def test_gpt_batch_and_length_sweep_one_generic_graph():
    cfg = gpt_mod.small_config(block_size=256)
    torch.manual_seed(0)
    model = gpt_mod.GPT(cfg).eval()
    fast = tempa.compile(model)
    with torch.no_grad():
        for b, t in [(2, 16), (3, 17), (8, 40), (5, 128), (2, 64), (7, 100), (4, 33), (6, 127)]:
            idx = torch.randint(0, cfg.vocab_size, (b, t))
            assert_same(fast(idx), model(idx), rtol=1e-4, atol=1e-4)
    s = tempa.stats()
    assert s.captures <= 2 and s.gcc_runs <= 2, s
    assert any(i.dynamic.startswith("generic") for i in _infos(fast))


def test_not_generic_falls_back_per_shape_and_says_why(monkeypatch):
    monkeypatch.setattr(dynamic, "MAX_SYMBOLS", 0)    # any symbol: "too many to template"
    model = zoo.make("mlp_seed").model
    fast = tempa.compile(model)
    with torch.no_grad():
        for b in (8, 9, 10, 11):
            x = torch.randn(b, 32)
            assert_same(fast(x), model(x))
    info = [i for i in _infos(fast) if i.dynamic][0]
    assert info.dynamic.startswith("per-shape") and "dynamic sizes" in info.dynamic
    assert tempa.stats().gcc_runs == 4          # one per size: the static path's cost


def test_polynomial_fit():
    s = dynamic._Solver([[5, 6, 7], [20, 21, 22]])
    poly = s.fit([a * b * b + 3 * a + 1 for a in (5, 6, 7) for b in (20, 21, 22)])
    assert dynamic._render(poly) == "ds0*ds1*ds1 + 3*ds0 + 1"


def test_tied_sizes_are_checked_per_call():
    # two batch sizes equal in the examples are tied; a call where they differ still works
    def f(x, y):
        return x.sum(0) * 2 + y.sum(0)

    fast = tempa.compile(f)
    for bx, by in [(3, 3), (5, 5), (6, 6), (6, 9), (4, 4)]:
        x, y = torch.randn(bx, 4), torch.randn(by, 4)
        assert_same(fast(x, y), f(x, y))
    assert any(i.dynamic.startswith("generic") for i in _infos(fast))


def test_hf_bert_sweep_is_generic():
    case = zoo.make("hf_bert")
    model = case.model
    fast = tempa.compile(model)
    with torch.no_grad():
        for b, t in [(2, 8), (3, 11), (4, 16), (5, 9)]:
            kw = {"input_ids": torch.randint(0, model.config.vocab_size, (b, t)),
                  "attention_mask": torch.ones(b, t, dtype=torch.long)}
            kw["attention_mask"][0, -2:] = 0
            assert_same(fast(**kw), model(**kw), *case.tolerance)
    assert tempa.stats().gcc_runs <= 2
    assert any(i.dynamic.startswith("generic") for i in _infos(fast))


class _SmallCNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        nn = torch.nn
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Linear(16 * 4 * 4, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def test_cnn_batch_sweep_reuses_one_generic_kernel_set():
    """A serving batch sweep (issue 20, point 10): only the batch dimension, the one that
    changed, becomes symbolic; the image sizes stay static, so the kernels are generic in
    one size and gcc runs for the static graph and the generic one, not per batch size
    (with every dimension symbolic it ran for 12 of 15 sizes)."""
    torch.manual_seed(0)
    model = _SmallCNN().eval()
    fast = tempa.compile(model)
    with torch.no_grad():
        for b in (16, 4, 5, 7, 9, 12, 20, 24, 32, 33, 50, 64, 100):
            x = torch.randn(b, 3, 16, 16)
            assert_same(fast(x), model(x), rtol=1e-4, atol=1e-4)
    s = tempa.stats()
    assert s.gcc_runs <= 2 and s.captures <= 3, s
    dynamic_guards = [g for e in tempa.entries(fast) for g in e.guards if "('*', 3, 16, 16)" in g]
    assert dynamic_guards, [e.guards[:3] for e in tempa.entries(fast)]
    assert all(i.dynamic.startswith("generic") for i in _infos(fast) if i.dynamic)


def test_a_python_int_made_a_symbol_is_one_generic_graph():
    # automatic dynamic: the int becomes a symbolic input on the first change; its generic
    # code reads it as a size (ds0 = a1), its literal without C++'s LL suffix
    def f(x, k):
        return x * k + 1

    fast = tempa.compile(f)
    x = torch.randn(8)
    for k in (2, 3, 5, 7, 11, 4):
        torch.testing.assert_close(fast(x, k), f(x, k))
    info = next(i for i in _infos(fast) if i.dynamic)
    assert info.dynamic.startswith("generic"), info.dynamic
    assert "ds0 = a1" in info.wrapper_source
    assert tempa.stats().gcc_runs <= 2, tempa.stats()
