"""A wrapper-allocated pointwise buffer computed over a same-layout buffer that dies in its
kernel (pipeline.reuse_dead_buffers: a BatchNorm + activation written over the convolution
output it reads), and the cases where that would be wrong: the dying buffer read at other
elements, read later, or handed out."""
import re

import pytest
import torch
import torch.nn as nn

import tempa
from tempa.backend import pipeline
from tempa.introspect import entries

from .helpers import close


@pytest.fixture(autouse=True)
def eager_layouts(monkeypatch):
    monkeypatch.setattr(tempa.config, "cpu_conv_layout", "eager")


def _compiled(fn, *args):
    c = tempa.compile(fn)
    with torch.no_grad():
        got, want = c(*args), fn(*args)
        again = c(*args)
    assert close(got, want, atol=1e-5, rtol=1e-5) and close(again, want, atol=1e-5, rtol=1e-5)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert g.stride() == w.stride()
    (entry,) = entries(c)
    assert entry.kernels.fallback_reason is None
    return entry.kernels.wrapper_source


def _reused(src):
    return re.findall(r"^\s+(buf\d+) = (buf\d+)$", src, re.M)


def _net():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                      nn.Conv2d(8, 8, 1), nn.BatchNorm2d(8), nn.ReLU6()).eval()
    for bn in (m[1], m[4]):
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
    return m


def test_batchnorm_and_activation_written_over_the_convolution_output():
    src = _compiled(_net(), torch.randn(2, 4, 10, 10))
    # the first BN + ReLU over the first convolution's result; the last one is returned
    # (allocated: the wrapper may allocate a returned buffer in the output's shape)
    assert len(_reused(src)) == 1, src
    assert src.count("_empty_strided(") == 1, src


def test_off_allocates_each_kernel_output(monkeypatch):
    monkeypatch.setattr(pipeline, "reuse_dead_buffers", lambda lowered, sched: [])
    from tempa.backend import compile_graph
    monkeypatch.setattr(compile_graph, "reuse_dead_buffers", lambda lowered, sched: [])
    src = _compiled(_net(), torch.randn(2, 4, 10, 10))
    assert not _reused(src)


def test_not_over_a_buffer_read_at_other_elements():
    w = torch.randn(8, 4, 3, 3)

    def f(x):
        y = torch.nn.functional.conv2d(x, w)
        return torch.relu(y + y.transpose(-1, -2)) * 2     # other elements of y, in place
    src = _compiled(f, torch.randn(2, 4, 10, 10))
    assert not _reused(src), src


def test_not_over_a_buffer_read_later_or_returned():
    w = torch.randn(8, 4, 3, 3)
    w2 = torch.randn(8, 8, 1, 1)

    def later(x):
        y = torch.nn.functional.conv2d(x, w)
        z = torch.relu(y * 3)
        return torch.nn.functional.conv2d(z, w2) + y

    def returned(x):
        y = torch.nn.functional.conv2d(x, w)
        return torch.relu(y * 3), y
    x = torch.randn(2, 4, 10, 10)
    for fn in (later, returned):
        src = _compiled(fn, x)
        lines = src.splitlines()
        y = re.match(r"\s+(buf\d+) = _o", next(l for l in lines if " = _o" in l)).group(1)
        # the relu over y (the first kernel) may not write over y; a kernel after the last
        # read of y may
        first_kernel = next(i for i, l in enumerate(lines) if "_S" in l and "(_e := " in l)
        over_y = [i for i, l in enumerate(lines) if re.fullmatch(r"\s+buf\d+ = %s" % y, l)]
        assert all(i > first_kernel + 1 for i in over_y), src
        if fn is returned:
            assert not over_y, src
