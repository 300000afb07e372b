"""Compiling never moves the user's RNG: compile-time timing (the measured convolution
layout, freezing's packed-GEMM choice, a convolution's contiguous-argument timing) draws its
example tensors from a generator of its own (lower/matmul.py example_generator), so after a
compiled first call ``torch.randn`` draws what it draws after eager's. Before, each timed
example came from the global generator, and a seeded program's later random numbers
differed from eager's once a model was compiled."""
import pytest
import torch
import torch.nn as nn

import tempa
from tempa.backend.lower import layout_timing, matmul


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    tempa.reset()
    # timings are cached per process and shape: start from none, so this test's compile times
    monkeypatch.setattr(layout_timing, "_seconds", {})
    monkeypatch.setattr(matmul, "_packing_seconds", {})
    yield
    tempa.reset()


def _draws_after_first_call(fn, inp):
    torch.manual_seed(0)
    with torch.no_grad():
        fn(inp)
    return torch.randn(4)


def _depthwise_net():
    return nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.BatchNorm2d(16),
                         nn.ReLU6(), nn.Conv2d(16, 32, 1)).eval()


@pytest.mark.parametrize("case", ["measured conv layout", "freezing"])
def test_the_first_compiled_call_leaves_the_global_rng_where_eager_leaves_it(case, monkeypatch):
    if case == "measured conv layout":
        monkeypatch.setattr(tempa.config, "cpu_conv_layout", "measured")
        model, inp, options = _depthwise_net(), torch.randn(2, 16, 32, 32), None
    else:
        if not torch.backends.mkl.is_available():
            pytest.skip("MKL's packed GEMM")
        model, inp, options = nn.Linear(256, 256), torch.randn(64, 256), {"freezing": True}
    compiled = tempa.compile(model, options=options)
    got = _draws_after_first_call(compiled, inp)
    # the compile did time (else this test would check nothing)
    assert layout_timing._seconds or matmul._packing_seconds
    assert torch.equal(got, _draws_after_first_call(model, inp))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_trial_run_at_compile_time_leaves_the_cuda_rng_as_a_plain_call_does():
    # a graph with a value-sized op is compiled in pieces and run once on copies of its
    # inputs (split_at_values); its dropout drew from CUDA's generator, which the trial run
    # used to restore only on the CPU. The first call (compile, trial run, the call itself)
    # must leave the generator where a later call (the call alone) leaves it.
    def f(x):
        return torch.nn.functional.dropout(x[x > 0] * 3, p=0.5, training=True).exp()

    x = torch.randn(4096, device="cuda")
    compiled = tempa.compile(f)
    after = []
    for _ in range(2):
        torch.manual_seed(0)
        compiled(x)
        after.append(torch.rand(8, device="cuda"))
    assert torch.equal(after[0], after[1])
