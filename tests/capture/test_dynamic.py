"""Dynamic shapes (issue 7): a changing batch size or sequence length costs at most one
recompile, and the guards follow what the code branched on."""
import logging

import pytest
import torch
import torch.nn.functional as F

import tempa
from tests.capture.paths import counts
from tests.models import zoo, gpt as gpt_mod
from tests.models.compare import assert_same


def test_seed_mlp_batch_8_to_64_at_most_two_captures():
    model = zoo.make("mlp_seed").model
    fast = tempa.compile(model, backend="eager")
    for b in range(8, 65):
        x = torch.randn(b, 32)
        assert_same(fast(x), model(x))
    assert tempa.stats().captures == 2
    dynamic_entry = tempa.entries(fast)[0]
    assert "x.shape[0] >= 2" in dynamic_entry.guards


def test_gpt_sequence_and_batch_sweep_at_most_two_captures():
    cfg = gpt_mod.small_config()
    cfg.block_size = 256
    torch.manual_seed(0)
    model = gpt_mod.GPT(cfg).eval()
    fast = tempa.compile(model, backend="eager")
    for t, b in [(16, 2), (17, 3), (40, 8), (128, 5), (64, 2), (100, 7), (33, 4)]:
        idx = torch.randint(0, cfg.vocab_size, (b, t))
        assert_same(fast(idx), model(idx), rtol=1e-4, atol=1e-4)
    assert tempa.stats().captures == 2


@pytest.mark.parametrize("name", ["hf_gpt2", "hf_bert"])
def test_hf_models_sequence_and_batch_sweep(name):
    case = zoo.make(name)
    model = case.model
    fast = tempa.compile(model, backend="eager")
    vocab = model.config.vocab_size
    for b, t in [(2, 8), (3, 11), (4, 16), (2, 5), (5, 9)]:
        torch.manual_seed(b * 100 + t)
        kwargs = {"input_ids": torch.randint(0, vocab, (b, t)),
                  "attention_mask": torch.ones(b, t, dtype=torch.long)}
        kwargs["attention_mask"][0, -2:] = 0
        assert_same(fast(**kwargs), model(**kwargs), *case.tolerance)
    assert tempa.stats().captures == 2


def test_shape_dependent_branch_recompiles_exactly_when_it_flips():
    def f(x):
        if x.shape[0] > 32:
            return x * 2
        return x - 1

    fast = tempa.compile(f, backend="eager")
    sizes = [8, 9, 10, 20, 31, 32, 33, 40, 64, 12]
    for n in sizes:
        x = torch.randn(n, 4)
        assert_same(fast(x), f(x))
    # 8 (static), 9 (dynamic, n <= 32), 33 (dynamic, n > 32): the branch flipped once.
    assert tempa.stats().captures == 3


def test_dynamic_true_and_false():
    def f(x):
        return (x * 2).sum(dim=0)

    fast = tempa.compile(f, backend="eager", dynamic=True)
    for n in (3, 4, 5, 6):
        assert_same(fast(torch.ones(n, 2)), f(torch.ones(n, 2)))
    assert tempa.stats().captures == 1
    tempa.reset()
    fast = tempa.compile(f, backend="eager", dynamic=False)
    for n in (3, 4, 5, 6):
        assert_same(fast(torch.ones(n, 2)), f(torch.ones(n, 2)))
    assert tempa.stats().captures == 4


def test_mark_dynamic_and_mark_static():
    def f(x):
        return x.view(x.shape[0] * x.shape[1]) + 1

    fast = tempa.compile(f, backend="eager")
    x = torch.randn(6, 4)
    tempa.mark_dynamic(x, 0)
    fast(x)
    for n in (7, 8, 9):
        y = torch.randn(n, 4)
        assert_same(fast(y), f(y))
    assert tempa.stats().captures == 1
    tempa.reset()
    fast = tempa.compile(f, backend="eager")
    for n in (6, 7, 8):
        y = torch.randn(n, 4)
        tempa.mark_static(y)
        assert_same(fast(y), f(y))
    assert tempa.stats().captures == 3


def test_view_divisibility_is_guarded():
    def f(x):
        n = x.shape[0]
        return x.view(n // 2, 2, -1).sum(dim=1)

    fast = tempa.compile(f, backend="eager", dynamic=True)
    for n in (4, 6, 8):
        x = torch.randn(n, 3)
        assert_same(fast(x), f(x))
    with pytest.raises(RuntimeError):
        fast(torch.randn(5, 3))          # eager raises too: 5 rows do not split into pairs
    with pytest.raises(RuntimeError):
        f(torch.randn(5, 3))
    assert counts() == (1, 0, 0, 0)


def test_recompile_log_names_the_dynamic_dimension(caplog):
    def f(x):
        return x.relu()

    tempa.logs.enable("recompiles")
    fast = tempa.compile(f, backend="eager")
    with caplog.at_level(logging.INFO, logger="tempa.recompiles"):
        fast(torch.randn(4, 3))
        fast(torch.randn(5, 3))
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "the size of x changed in dim(s) [0]" in text and "takes any size there" in text


def test_returned_sizes_are_computed_per_call():
    def f(x):
        b, t = x.shape
        return x.sum(), b * t, x.shape

    fast = tempa.compile(f, backend="eager", dynamic=True)
    for n in (3, 5):
        out = fast(torch.ones(n, 4))
        assert out[1] == n * 4 and out[2] == torch.Size([n, 4])
    assert counts() == (1, 0, 0, 0)


def test_float_computed_from_sizes():
    def f(x):
        return x * (1.0 / x.shape[0]) + x.shape[1] / 2

    fast = tempa.compile(f, backend="eager", dynamic=True)
    for n in (3, 5, 7):
        x = torch.randn(n, 4)
        assert_same(fast(x), f(x))
    assert tempa.stats().captures == 1


# Every matmul that is not 2-d @ 2-d, and F.linear where ATen routes it to matmul (no bias,
# or a non-contiguous 3-d input), goes through ATen's composite matmul. On torch 2.11 its
# fake kernel pinned the symbolic sizes to their example values (with an input that needs
# grad) or raised (without), so each new size recompiled, or the capture was dropped for
# eager. The GPT's tied lm_head is `F.linear(x, wte.weight)` with no bias. These must give
# one symbolic graph on every torch version, in grad mode and under no_grad.
_W = torch.randn(6, 8, requires_grad=True)
_B = torch.randn(6, requires_grad=True)
_MATMUL_CASES = {
    "linear_3d_no_bias": (lambda x: F.linear(x, _W), (2, 8)),
    "linear_3d_bias_non_contiguous": (lambda x: F.linear(x.transpose(0, 1), _W, _B), (2, 8)),
    "linear_4d_no_bias": (lambda x: F.linear(x.unsqueeze(1), _W), (2, 8)),
    "matmul_3d_2d": (lambda x: x @ _W.t(), (2, 8)),
    "matmul_2d_3d": (lambda x: torch.matmul(_W, x.transpose(1, 2)), (2, 8)),
    "matmul_3d_1d": (lambda x: x.matmul(_B.new_ones(8)), (2, 8)),
    "matmul_1d_3d": (lambda x: _B.new_ones(8) @ x.transpose(1, 2), (2, 8)),
    "matmul_4d_4d_attention": (lambda x: (x.unsqueeze(1) @ x.unsqueeze(1).transpose(-2, -1)).softmax(-1), (2, 8)),
}


@pytest.mark.parametrize("grad", [True, False], ids=["grad", "no_grad"])
@pytest.mark.parametrize("name", sorted(_MATMUL_CASES))
def test_matmul_and_linear_keep_sizes_symbolic(name, grad):
    fn, _ = _MATMUL_CASES[name]
    fast = tempa.compile(fn, backend="eager", dynamic=True)
    with torch.set_grad_enabled(grad):
        for b, t in [(2, 5), (3, 7), (4, 11), (5, 3)]:
            x = torch.randn(b, t, 8, requires_grad=grad)
            out = fast(x)
            assert_same(out, fn(x))
            assert out.requires_grad == grad
    assert tempa.stats().captures == 1, tempa.stats()
    (entry,) = tempa.entries(fast)
    # dim 2 (8, the weight's) is pinned, correctly; the batch and length must stay symbols
    pinned = [g for g in entry.guards if "specialized" in g and not g.startswith("x.shape[2]")]
    assert not pinned, pinned


def test_size_one_after_a_dimension_became_dynamic_is_its_own_static_graph():
    """Size 1 stays a constant in capture (as in torch.compile), so a batch of 1 that
    arrives after batch became dynamic is captured for 1 and guarded on it. A regression:
    its guard said "any size" and served the next batch of 33 with code made for 1."""
    torch.manual_seed(0)
    m = zoo.make("mlp_seed").model
    tempa.reset()
    compiled = tempa.compile(m)
    with torch.no_grad():
        for b in (8, 9, 33, 1, 33, 2):
            x = torch.randn(b, 32)
            torch.testing.assert_close(compiled(x), m(x))
    guards = [" ".join(e.guards) for e in tempa.entries(compiled)]
    one = [g for g in guards if "of shape (1, " in g]
    assert len(one) == 1, guards
    assert tempa.stats().captures == 3


def test_symbolic_capture_failing_in_a_fake_kernel_compiles_per_shape(caplog):
    """nn.Bilinear's aten._trilinear asserts on symbolic sizes under fake tensors (torch 2.11
    to 2.13). That looked like an error of the user's code, so every later size ran eagerly
    and was captured again on every call. Now the call is captured with its real sizes, the
    function compiles per shape from then on, and tempa says so once."""
    torch.manual_seed(0)
    bl = torch.nn.Bilinear(5, 6, 7)
    c = tempa.compile(bl)
    with caplog.at_level(logging.WARNING):
        for n in (4, 5, 6, 7):
            x, y = torch.randn(n, 5), torch.randn(n, 6)
            torch.testing.assert_close(c(x, y), bl(x, y))
    assert len(tempa.entries(c)) >= 2
    captures = tempa.stats().captures
    x, y = torch.randn(6, 5), torch.randn(6, 6)
    torch.testing.assert_close(c(x, y), bl(x, y))
    assert tempa.stats().captures == captures          # served by an entry, not recaptured
    said = [r.getMessage() for r in caplog.records if "per shape" in r.getMessage()]
    assert len(said) <= 1
    assert not [r for r in caplog.records if r.name.startswith("torch._subclasses")]
