"""Slice bounds beyond the dim: ATen clamps them (``x[-4095:]`` of a 16-long dim is all of
it), and the slice / slice_scatter lowerings must index with the clamped bounds. Mistral's
sliding-window KV cache returns ``k[:, :, -4095:]``; the backward of that slice is a
slice_scatter whose unclamped start made it read its source thousands of rows past its end,
so training returned garbage (NaN, or errors of 100x the gradient) for the embedding."""
import pytest
import torch

import tempa

from .helpers import close, compile_fn


def _scatter(base, src):
    return torch.slice_scatter(base, src, dim=1, start=-100)


def _scatter_window(base, src):
    return torch.slice_scatter(base, src, dim=1, start=-100, end=-4)


def _slice_from_far_before(x):
    return x[:, -100:-2] * 2


@pytest.mark.parametrize("fn, src_cols", [(_scatter, 8), (_scatter_window, 4)])
def test_slice_scatter_with_start_before_the_dim(fn, src_cols):
    """The source is a window of a wider tensor, so an index past the window's end reads
    the wider tensor's other (known, nonzero) columns: a deterministic wrong answer."""
    base = torch.zeros(4, 8)
    src = torch.arange(4 * 200, dtype=torch.float32).reshape(4, 200)[:, :src_cols]
    assert close(compile_fn(fn, base, src)(base, src), fn(base, src))


def test_slice_with_bounds_before_the_dim():
    x = torch.randn(4, 8)
    assert close(compile_fn(_slice_from_far_before, x)(x), _slice_from_far_before(x))


class _WindowCache(torch.nn.Module):
    """A decoder layer's shape of the bug: keys from a projection, the loss from the keys,
    and the cache (a slice longer than the sequence, as a sliding window) returned too."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8)

    def forward(self, x):
        k = self.proj(x).unsqueeze(1)                   # (batch, heads=1, tokens, dim)
        return k.square().mean(), k[:, :, -4095:]


def test_training_through_a_window_longer_than_the_sequence():
    torch.manual_seed(0)
    eager_model = _WindowCache()
    model = _WindowCache()
    model.load_state_dict(eager_model.state_dict())
    x = torch.randn(2, 16, 8)
    loss, cache = eager_model(x)
    (loss + cache.sum()).backward()
    tempa.reset()
    fast = tempa.compile(model)
    got_loss, got_cache = fast(x)
    (got_loss + got_cache.sum()).backward()
    assert tempa.stats().captures == 1 and tempa.stats().eager_fallbacks == 0
    assert close(got_loss, loss) and close(got_cache, cache)
    for p, q in zip(model.parameters(), eager_model.parameters()):
        assert close(p.grad, q.grad), (p.grad, q.grad)
