"""A graph holding value-dependent ops, compiled in pieces around them
(backend/split_at_values.py, issue 16 item 7): the ops run as ATen calls, the work between
them is kernels, shape-generic in the sizes they compute; one capture and one compile serve
every value. Each test asserts the path: no fallback reason on the graph or its pieces,
kernels in every piece, and no new kernels after the first call."""
import importlib.util
import logging

import pytest
import torch

import tempa


@pytest.fixture(autouse=True)
def _fresh():
    tempa.reset()
    yield
    tempa.reset()


def _same(got, want):
    assert type(got) is type(want), (type(got), type(want))
    if isinstance(want, (tuple, list)):
        for g, w in zip(got, want, strict=True):
            _same(g, w)
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, (got, want)
        torch.testing.assert_close(got, want)
    else:
        assert got == want, (got, want)


def _copies(args):
    return [a.clone() if isinstance(a, torch.Tensor) else a for a in args]


def _run(fn, calls, generic=True, **options):
    """``fn`` compiled, called with each of ``calls`` beside eager (on copies); returns the
    split graph's BackendInfo after checking that one capture served every call and that no
    call after the first compiled anything."""
    fast = tempa.compile(fn, **options)
    kernels = None
    for args in calls:
        _same(fast(*_copies(args)), fn(*_copies(args)))
        kernels = tempa.stats().kernels_compiled if kernels is None else kernels
    s = tempa.stats()
    assert (s.captures, s.graph_breaks, s.recompiles, s.eager_fallbacks) == (1, 0, 0, 0), s
    assert s.kernels_compiled == kernels, "a call after the first compiled new code"
    info = tempa.entries(fast)[0].compiled.tempa_info
    _compiled_in_pieces(info, generic)
    return info


def _compiled_in_pieces(info, generic=True):
    assert info.fallback_reason is None, info.fallback_reason
    assert "split_at_values" in info.passes and info.pieces, info.notes
    for p in info.pieces:
        assert p.fallback_reason is None and p.kernel_count > 0, (p.fallback_reason, p.notes)
    if generic:   # the piece after a value-sized op: generic code over its size
        assert any(p.dynamic.startswith("generic in u") for p in info.pieces), \
            [p.dynamic for p in info.pieces]


def test_unique_consecutive_any_length():
    def f(x):
        return torch.unique_consecutive(x * 3) + 1

    info = _run(f, [(torch.tensor([1, 1, 2, 2, 1, 3]),), (torch.tensor([4, 5, 6, 7, 8, 9]),),
                    (torch.tensor([0, 0, 0, 0, 0, 0]),), (torch.tensor([5, 5, 2, 2, 2, 2]),)])
    assert "unique_consecutive" in info.passes["split_at_values"]


@pytest.mark.parametrize("shape", [(12,), (3, 4)])
def test_nonzero_with_the_empty_result(shape):
    # 2-D: nonzero's result is column-major, its shape-generic code keeps that layout
    def f(x):
        return (x.sin() > 0.2).nonzero() * 2 + 1

    calls = [(torch.randn(shape),), (torch.randn(shape),), (-torch.ones(shape),),
             (torch.ones(shape),)]
    _run(f, calls)


def test_boolean_mask_between_pointwise_work():
    def f(x):
        y = (x * 1.5).relu().sin() + 0.25
        picked = y[y > 0.5]
        return picked.exp().sum() + (y * 3).cos().sum(), picked * 2

    one = torch.full((64,), -1.0)
    one[7] = 1.0
    _run(f, [(torch.randn(64),), (torch.randn(64),), (-torch.ones(64),), (one,),
             (torch.ones(64),)])


def test_a_max_over_an_empty_mask_raises_as_eager():
    # an empty result: the piece runs op by op on that call, so eager's error is raised
    def f(x):
        return x[x > 0].max() * 2

    fast = tempa.compile(f)
    x = torch.randn(32).abs() + 0.1
    _same(fast(x), f(x))
    with pytest.raises(RuntimeError) as want:
        f(-torch.ones(32))
    with pytest.raises(RuntimeError) as got:
        fast(-torch.ones(32))
    assert str(got.value) == str(want.value)
    _compiled_in_pieces(tempa.entries(fast)[0].compiled.tempa_info)


def test_an_empty_first_result_still_compiles_generic_code():
    def f(x):
        return (x[x > 0] * 3).exp()

    _run(f, [(-torch.ones(16),), (torch.randn(16),), (torch.randn(16),)])


def test_masked_select():
    def f(x, m):
        return torch.masked_select(x.cos(), m).exp() - 1

    torch.manual_seed(0)
    _run(f, [(torch.randn(16), torch.rand(16) > p) for p in (0.5, 0.2, 0.9, 1.0)])


def test_masked_write_to_an_input():
    def f(x):
        x[x < 0] = 0.0
        return x * 2 + 1

    fast = tempa.compile(f)
    for _ in range(3):
        x = torch.randn(16)
        y = x.clone()
        _same(fast(x), f(y))
        _same(x, y)
    _compiled_in_pieces(tempa.entries(fast)[0].compiled.tempa_info, generic=False)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64])
def test_item_into_arithmetic_keeps_python_number_promotion(dtype):
    # x * v for a Python float v: float32 for an int tensor, float64's own precision for a
    # float64 tensor; the number enters the piece as a 0-d tensor, the code holds no value
    def f(x, t):
        v = t.item()
        return x * (v * 2 + 1) - v / 4, x + t.long().item()

    x = torch.arange(6).to(dtype)
    _run(f, [(x, torch.tensor(2.0)), (x, torch.tensor(-3.5)), (x, torch.tensor(1e-7))],
         generic=False)


def test_item_into_sizes_arange_and_slicing():
    def f(x, t):
        n = t.item()
        torch._check(n >= 0)
        torch._check(n <= x.shape[0])
        return torch.arange(n, dtype=torch.float32) * 2 + x[:n]

    x = torch.randn(10)
    info = _run(f, [(x, torch.tensor(n)) for n in (3, 6, 0, 1, 10, 2)])
    assert any("ds0 = a" in (p.wrapper_source or "") for p in info.pieces)


def test_an_int_item_as_a_value_of_any_op_is_a_symbolic_int():
    # torch.full's fill value is no operand of arithmetic: the number enters the piece as
    # a symbolic int its generic code reads (ds0 = a...), never as a constant
    def f(x, t):
        n = t.item()
        return torch.full((4,), n) * x + n

    x = torch.arange(4)
    info = _run(f, [(x, torch.tensor(n)) for n in (5, 9, 3, 12)], generic=False)
    assert any(p.dynamic.startswith("generic in u0=input") for p in info.pieces), \
        [p.dynamic for p in info.pieces]


def test_training_through_a_mask():
    def f(x, w):
        y = (x * w).tanh()
        m = y[y > 0]
        return (m * m).sum() + y.sum()

    fast = tempa.compile(f)
    for k in range(3):
        x = torch.randn(32)
        w1 = torch.randn(32, requires_grad=True)
        w2 = w1.detach().clone().requires_grad_()
        got, want = fast(x, w1), f(x, w2)
        got.backward()
        want.backward()
        _same(got, want)
        _same(w1.grad, w2.grad)
        if k == 0:
            kernels = tempa.stats().kernels_compiled
    assert tempa.stats().kernels_compiled == kernels and tempa.stats().captures == 1
    info = tempa.entries(fast)[0].compiled.tempa_info
    _compiled_in_pieces(info)
    assert all(p.backward is not None for p in info.pieces), "a piece without its backward"
    with torch.no_grad():
        x, w = torch.randn(32), torch.randn(32, requires_grad=True)
        _same(fast(x, w), f(x, w))


def test_a_value_dependent_op_inside_no_grad_runs_the_graph_as_aten_and_says_so(caplog):
    def f(x):
        with torch.no_grad():
            m = x[x > 0]
        return m * 2

    fast = tempa.compile(f)
    with caplog.at_level(logging.WARNING, logger="tempa.fallbacks"):
        x = torch.randn(8, requires_grad=True)
        _same(fast(x), f(x))
    info = tempa.entries(fast)[0].compiled.tempa_info
    assert "grad mode" in info.fallback_reason
    assert any("grad mode" in r.getMessage() for r in caplog.records)


def test_the_driver_shows_cuts_glue_and_pieces():
    def f(x, t):
        n = t.item()
        y = x * n
        return y[y > 1].sum()

    fast = tempa.compile(f)
    fast(torch.randn(8), torch.tensor(2.0))
    text = tempa.entries(fast)[0].compiled.tempa_info.trace()
    assert "l_t_.item()" in text and "tempa_piece_1(" in text and "piece 2" in text


cuda = pytest.mark.skipif(not (torch.cuda.is_available() and importlib.util.find_spec("triton")),
                          reason="needs CUDA and Triton")


@cuda
@pytest.mark.parametrize("mode", [None, "reduce-overhead"])
def test_on_the_gpu_pieces_are_triton_kernels(mode):
    # the number enters its piece as a 0-d tensor on the GPU; the piece after the mask is
    # shape-generic Triton code, without CUDA graphs (they are recorded per shape)
    def f(x, t):
        v = t.item()
        y = (x * v).relu() + 0.5
        picked = y[y > 1.0]
        return picked.exp().sum() + (y * 3).cos().sum(), picked * 2

    calls = [(torch.randn(256, device="cuda"), torch.tensor(v, device="cuda"))
             for v in (2.0, -1.0, 3.5, 0.25)]
    info = _run(f, calls, mode=mode)
    assert all(p.inference.triton_source for p in info.pieces), [p.notes for p in info.pieces]
