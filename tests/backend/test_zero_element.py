"""Zero-element tensors through the CPU backend: an empty output is an empty tensor of
eager's shape, strides and dtype, a view of the input where eager's is, and a graph
holding one still compiles (it ran eagerly after a ZeroDivisionError in the scheduler)."""
import pytest
import torch

from .helpers import compile_fn


def compiled(fn, *inputs):
    c = compile_fn(fn, *inputs)
    assert c.tempa_info.fallback_reason is None, c.tempa_info.fallback_reason
    return c


@pytest.mark.parametrize("fn", [
    lambda x: x[5:2],
    lambda x: x[:, 0:0],
    lambda x: x.t()[:, 2:2],
    lambda x: (x[:, 0:0], x * 2),
], ids=["rows", "columns", "transposed", "with_pointwise"])
def test_an_empty_slice_is_a_view_of_the_input(fn):
    x = torch.randn(4, 3)
    got, want = compiled(fn, x)(x), fn(x)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        assert (g.shape, g.stride(), g.dtype) == (w.shape, w.stride(), w.dtype)
        assert (g.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()) == \
            (w.untyped_storage().data_ptr() == x.untyped_storage().data_ptr())
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("fn", [
    lambda x: (x * 2, (x + 1)[:, 0:0]),
    lambda x: ((x + 1)[:, 0:0] * 3, x.sum(1)),
    lambda x: (x.new_zeros(4, 0) + x[:, :1], x.exp()),
], ids=["pointwise_then_empty", "empty_then_reduction", "broadcast_to_empty"])
def test_a_graph_with_an_empty_computed_buffer_compiles(fn):
    x = torch.randn(4, 3)
    got, want = compiled(fn, x)(x), fn(x)
    for g, w in zip(got, want):
        assert (g.shape, g.dtype) == (w.shape, w.dtype)
        torch.testing.assert_close(g, w)
