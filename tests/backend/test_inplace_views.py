"""In-place view ops (``as_strided_``, ``unsqueeze_``, ...) that ATen's composite kernels
call on values they computed: ``adaptive_avg_pool2d`` to 1x1 of a channels-last input is
``mean(...).as_strided_(channels-last strides)``, which functionalization leaves in place.
Such a graph (every Swin's pooler: AdaptiveAvgPool1d over a transposed sequence) ran as
ATen calls; it now compiles, in inference and with its backward, with eager's values,
gradients and output strides. The same op on an input changes the caller's tensor, so
that graph still runs as ATen calls, with eager's result."""
import torch
import torch.nn as nn

import tempa


def setup_function():
    tempa.reset()


def teardown_function():
    tempa.reset()


class SwinPooler(nn.Module):
    """The tail of HF's Swin: layer norm over tokens, mean over them, a classifier."""
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(8)
        self.pool = nn.AdaptiveAvgPool1d(1)
        self.head = nn.Linear(8, 3)

    def forward(self, tokens):
        x = self.norm(tokens)
        pooled = self.pool(x.transpose(1, 2))     # (batch, 8, 1) of a (batch, 8, tokens) view
        return self.head(torch.flatten(pooled, 1)), pooled


def _channels_last_pool(x):
    return nn.functional.adaptive_avg_pool2d(x * 2, 1)


def _reasons(fast):
    return [e.compiled.tempa_info.fallback_reason for e in tempa.entries(fast)]


def test_channels_last_pool_to_1x1_compiles_with_eagers_strides():
    x = torch.randn(2, 6, 4, 5).to(memory_format=torch.channels_last)
    want = _channels_last_pool(x)
    fast = tempa.compile(_channels_last_pool)
    got = fast(x)
    torch.testing.assert_close(got, want)
    assert got.stride() == want.stride() == (6, 1, 6, 6)
    assert _reasons(fast) == [None]
    assert tempa.stats().kernels_compiled > 0


def test_swin_pooler_inference_compiles():
    torch.manual_seed(0)
    model = SwinPooler().eval()
    tokens = torch.randn(2, 7, 8)
    fast = tempa.compile(model)
    with torch.no_grad():
        want = model(tokens)
        got = fast(tokens)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
        assert g.stride() == w.stride()
    assert _reasons(fast) == [None]
    s = tempa.stats()
    assert s.captures == 1 and s.aten_fallbacks == 0 and s.kernels_compiled > 0


def test_swin_pooler_training_compiles_with_eagers_gradients():
    torch.manual_seed(0)
    model = SwinPooler()
    reference = SwinPooler()
    reference.load_state_dict(model.state_dict())
    tokens = torch.randn(2, 7, 8, requires_grad=True)
    ref_tokens = tokens.detach().clone().requires_grad_(True)
    want, want_pooled = reference(ref_tokens)
    (want.square().sum() + want_pooled.sum()).backward()
    fast = tempa.compile(model)
    got, got_pooled = fast(tokens)
    (got.square().sum() + got_pooled.sum()).backward()
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_pooled, want_pooled)
    assert got_pooled.stride() == want_pooled.stride()
    torch.testing.assert_close(tokens.grad, ref_tokens.grad)
    for p, q in zip(model.parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    assert _reasons(fast) == [None]
    s = tempa.stats()
    assert s.captures == 1 and s.aten_fallbacks == 0 and s.kernels_compiled > 0


def test_an_in_place_view_of_an_input_changes_the_callers_tensor():
    def fn(x):
        x.unsqueeze_(0)
        return x + 1
    a, b = torch.randn(3), torch.randn(3)
    b.copy_(a)
    want = fn(a)
    got = tempa.compile(fn)(b)
    torch.testing.assert_close(got, want)
    assert b.shape == a.shape == (1, 3)
