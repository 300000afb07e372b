"""Outputs that are views of an input in another dtype (``z.real``, ``z.imag``,
``view_as_real``, ``x.view(torch.int32)``) are handed out as those views: the view of the
input was rebuilt with as_strided in the input's own dtype, which raised ("out of bounds
for storage") or read the wrong elements."""
import pytest
import torch

from .helpers import compile_fn


@pytest.mark.parametrize("fn, make", [
    (lambda z: (z.real, z.imag), lambda: torch.randn(3, dtype=torch.complex64)),
    (lambda z: torch.view_as_real(z)[1:], lambda: torch.randn(3, dtype=torch.complex64)),
    (lambda x: (x.view(torch.int32), x * 2), lambda: torch.randn(4)),
    (lambda x: x[1:].view(torch.int16), lambda: torch.randn(4)),
], ids=["real_imag", "view_as_real", "float_as_int", "slice_as_int16"])
def test_a_dtype_view_of_an_input_is_that_view(fn, make):
    x = make()
    got, want = compile_fn(fn, x)(x), fn(x)
    got, want = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        assert (g.dtype, g.shape, g.stride()) == (w.dtype, w.shape, w.stride())
        torch.testing.assert_close(g, w)
        same = w.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
        assert (g.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()) == same
        if same:
            assert g.data_ptr() == w.data_ptr()       # the same elements
