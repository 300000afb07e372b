"""The write_in_place pass (backend/pipeline.py): a mutated input's new value is computed
straight into the input (one loop, no temporary, no copy-back loop) where that is safe, and
kept in a temporary plus a copy-back where something still reads the old value."""
import pytest
import torch

import tempa


@pytest.fixture(autouse=True)
def _fresh():
    tempa.reset()
    yield
    tempa.reset()


def _run(fn, *inputs):
    """fn eagerly and compiled on twins of ``inputs``: (eager out, compiled out, the twins
    after each call, and the inference graph's pass outputs)."""
    eager_in = [t.clone() for t in inputs]
    fast_in = [t.clone() for t in inputs]
    want = fn(*eager_in)
    fast = tempa.compile(fn)
    got = fast(*fast_in)
    assert tempa.stats().kernels_compiled > 0 and tempa.stats().eager_fallbacks == 0
    return want, got, eager_in, fast_in, tempa.entries(fast)[0].kernels.inference.passes


def _same(a, b):
    if isinstance(a, torch.Tensor):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)
    else:
        assert a is None and b is None


def test_an_sgd_momentum_update_is_one_loop_over_its_tensors():
    def step(p, g, buf):
        with torch.no_grad():
            buf.mul_(0.9).add_(g)
            p.add_(buf, alpha=-0.1)

    args = [torch.randn(16, 8, dtype=torch.float64) for _ in range(3)]
    want, got, eager_in, fast_in, passes = _run(step, *args)
    for a, b in zip(eager_in, fast_in):
        _same(a, b)
    assert passes["write_in_place"] == "written in place: in0, in2"
    assert "copy-back" not in str(passes["schedule"])


def test_a_later_member_reads_the_value_just_written():
    # p's update reads b's new value in the same loop, after b's store: the C++ emitter
    # must load it again rather than reuse its load of b's old value
    def step(p, g, b):
        with torch.no_grad():
            b.lerp_(g, 0.1)
            p.sub_(b * 0.5)

    args = [torch.randn(32, dtype=torch.float64) for _ in range(3)]
    _, _, eager_in, fast_in, passes = _run(step, *args)
    for a, b in zip(eager_in, fast_in):
        _same(a, b)
    assert passes["write_in_place"] == "written in place: in0, in2"


def test_a_value_read_from_other_elements_keeps_its_temporary():
    def transpose(x):
        x.copy_(x.t() * 2)
        return x.sum()

    want, got, eager_in, fast_in, passes = _run(transpose, torch.randn(8, 8, dtype=torch.float64))
    _same(want, got)
    _same(eager_in[0], fast_in[0])
    assert passes["write_in_place"] == "none written in place"


def test_the_old_value_read_after_the_write_keeps_its_temporary():
    def f(x):
        old = x.clone()
        x.mul_(2)
        return old.sum() + x.sum()

    want, got, eager_in, fast_in, _ = _run(f, torch.randn(8, 4, dtype=torch.float64))
    _same(want, got)
    _same(eager_in[0], fast_in[0])


def test_swapped_inputs():
    def swap(x, y):
        t = x.clone()
        x.copy_(y)
        y.copy_(t)

    _, _, eager_in, fast_in, _ = _run(swap, torch.randn(8, dtype=torch.float64),
                                      torch.randn(8, dtype=torch.float64))
    for a, b in zip(eager_in, fast_in):
        _same(a, b)


def test_a_returned_new_value_stays_its_own_tensor():
    def f(x):
        y = x + 1
        x.copy_(y)
        return y

    want, got, eager_in, fast_in, _ = _run(f, torch.randn(6, dtype=torch.float64))
    _same(want, got)
    _same(eager_in[0], fast_in[0])
    assert got.data_ptr() != fast_in[0].data_ptr()
    got.add_(1)                        # eager's y is not x: writing it leaves x alone
    _same(eager_in[0], fast_in[0])


def test_a_transposed_input_keeps_its_copy_back():
    def f(x, g):
        x.add_(g)

    x = torch.randn(8, 6, dtype=torch.float64).t()
    g = torch.randn(6, 8, dtype=torch.float64)
    eager_x, fast_x = x.clone().t().contiguous().t(), x.clone().t().contiguous().t()
    f(eager_x, g)
    tempa.compile(f)(fast_x, g)
    _same(eager_x, fast_x)


def test_an_optimizer_step_matches_eager_over_several_steps():
    torch.manual_seed(0)
    models = [torch.nn.Linear(16, 8).double() for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    opts = [torch.optim.Adam(m.parameters(), lr=0.01) for m in models]
    step = tempa.compile(opts[1].step)
    x = torch.randn(4, 16, dtype=torch.float64)
    for _ in range(4):
        for m, o, s in zip(models, opts, (opts[0].step, step)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            s()
    for a, b in zip(*(m.parameters() for m in models)):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)
    reports = [e.kernels.inference.passes.get("write_in_place") for e in tempa.entries(step)]
    assert any(r and r.startswith("written in place") for r in reports), reports


def test_a_cache_row_update_writes_only_its_rows():
    # a StaticCache's index_copy_ is traced as a functional index_put: run as index_put_ on
    # the cache itself, not a copy of the whole cache plus a copy-back
    def update(cache, pos, k):
        cache.index_copy_(2, pos, k)
        return cache.sum()

    for pos in (3, 9):
        cache, k = torch.randn(1, 2, 16, 4, dtype=torch.float64), torch.randn(1, 2, 1, 4, dtype=torch.float64)
        want, got, eager_in, fast_in, passes = _run(update, cache, torch.tensor([pos]), k)
        _same(want, got)
        _same(eager_in[0], fast_in[0])
        assert passes["write_in_place"] == "written in place: in0"
        assert "index_put_" in passes["wrap"] and "copy-back" not in str(passes["schedule"])
        tempa.reset()


def test_a_cache_whose_old_value_is_read_afterwards_is_copied():
    def update(cache, pos, k):
        old = cache.clone()
        cache.index_copy_(2, pos, k)
        return (cache - old).sum()

    cache, k = torch.randn(1, 2, 16, 4, dtype=torch.float64), torch.randn(1, 2, 1, 4, dtype=torch.float64)
    want, got, eager_in, fast_in, passes = _run(update, cache, torch.tensor([5]), k)
    _same(want, got)
    _same(eager_in[0], fast_in[0])
    assert passes["write_in_place"] == "none written in place"
