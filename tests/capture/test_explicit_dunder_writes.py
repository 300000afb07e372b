"""A write spelled as an explicit dunder call (``x.__setitem__(0, v)``,
``torch.Tensor.__setitem__(x, 0, v)``, ``x.__iadd__(1)`` with its result unused) is kept
in the graph: its node returned None and nothing read it, so dead-code elimination
dropped it and the compiled call left ``x`` unchanged."""
import pytest
import torch

import tempa


@pytest.mark.parametrize("backend", ["eager", "tempa"])
@pytest.mark.parametrize("fn", [
    lambda x: x.__setitem__(0, 5.0) or x,
    lambda x: torch.Tensor.__setitem__(x, (slice(None), 1), 7.0) or x,
    lambda x: (x.__imul__(3), x * 2)[1],
    lambda x: (x[1].__setitem__(0, -1.0), x.sum())[1],
], ids=["method", "unbound", "imul_unused", "through_a_view"])
def test_explicit_dunder_writes_are_kept(fn, backend):
    x, cx = torch.arange(6.0).reshape(2, 3), torch.arange(6.0).reshape(2, 3)
    want, got = fn(x), tempa.compile(fn, backend=backend)(cx)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(cx, x)
    assert cx._version > 0
    s = tempa.stats()
    assert s.captures == 1 and s.graph_breaks == 0 and s.eager_fallbacks == 0
