"""scaled_dot_product_attention in a graph with a backward, on the CPU: a call without an
attention mask or dropout (ViT, Whisper's encoder, a causal decoder without padding) keeps
the fused flash kernel and its backward, as eager runs it; one with a mask still goes
through the math decomposition, whose gradient reaches a mask that requires one (the
fused kernel's backward gives none). An inference graph (grad off) keeps the fused kernel
with or without a mask, as eager runs it."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tempa


def setup_function():
    tempa.reset()


def teardown_function():
    tempa.reset()


class Attention(nn.Module):
    def __init__(self, causal):
        super().__init__()
        self.qkv = nn.Linear(32, 96)
        self.out = nn.Linear(32, 32)
        self.causal = causal

    def forward(self, x, mask=None):
        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, 4, 8).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=self.causal)
        return self.out(a.transpose(1, 2).reshape(B, T, C))


def _train_both(model, *inputs):
    """Loss and gradients (parameters, then inputs requiring grad) of eager and compiled."""
    reference = Attention(model.causal)
    reference.load_state_dict(model.state_dict())
    ref_inputs = [t.detach().clone().requires_grad_(t.requires_grad) if t is not None else None
                  for t in inputs]
    fast = tempa.compile(model)
    results = []
    for m, xs in ((reference, ref_inputs), (fast, list(inputs))):
        out = m(*xs)
        (out * torch.linspace(-1, 1, out.numel()).view(out.shape)).sum().backward()
        grads = [p.grad for p in m.parameters()] + [t.grad for t in xs if t is not None and t.requires_grad]
        results.append((out, grads))
    return fast, results


def _backward_source(fast):
    (entry,) = tempa.entries(fast)
    info = entry.compiled.tempa_info
    assert info.fallback_reason is None
    return info.trace()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_unmasked_attention_keeps_the_fused_kernel_in_training(causal):
    torch.manual_seed(0)
    fast, ((want, want_grads), (got, got_grads)) = _train_both(
        Attention(causal), torch.randn(2, 7, 32, requires_grad=True))
    torch.testing.assert_close(got, want)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    trace = _backward_source(fast)
    assert "_scaled_dot_product_flash_attention_for_cpu_backward" in trace
    assert tempa.stats().aten_fallbacks == 0


def test_a_mask_requiring_grad_gets_its_gradient_through_the_math_decomposition():
    torch.manual_seed(0)
    mask = torch.randn(1, 4, 7, 7, requires_grad=True)     # T5's learned position bias
    fast, ((want, want_grads), (got, got_grads)) = _train_both(
        Attention(False), torch.randn(2, 7, 32), mask)
    torch.testing.assert_close(got, want)
    assert want_grads[-1] is not None and want_grads[-1].abs().sum() > 0
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    assert "flash_attention" not in _backward_source(fast)


@pytest.mark.parametrize("tokens", [7, 64], ids=["small", "large"])
def test_masked_attention_under_no_grad_fused_from_its_size(tokens):
    # an inference graph is never differentiated: from FUSED_MASKED_ATTENTION_MIN_SCORES
    # scores up it runs the fused kernel eager runs (Swin's masked window attention ran as
    # two bmm and a softmax per layer, twice eager's time); a small one the decomposition,
    # which tempa fuses (the zoo's HF models: 8-19% faster a call). Rows whose keys are all
    # masked out come out as eager's either way.
    from tempa.backend.lower.trace import FUSED_MASKED_ATTENTION_MIN_SCORES
    torch.manual_seed(0)
    model = Attention(False)                      # parameters requiring grad, called under no_grad
    x = torch.randn(2, tokens, 32)
    mask = torch.randn(2, 1, tokens, tokens)
    mask[:, :, 3] = float("-inf")                 # query 3 sees no key
    fast = tempa.compile(model)
    with torch.no_grad():
        got, want = fast(x, mask), model(x, mask)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=1e-5, atol=1e-5)
    (entry,) = tempa.entries(fast)
    aten_graph = entry.kernels.inference.passes["aten"].code
    fused = 2 * 4 * tokens * tokens >= FUSED_MASKED_ATTENTION_MIN_SCORES
    assert ("_scaled_dot_product_flash_attention_for_cpu" in aten_graph) == fused, aten_graph
    assert ("bmm" in aten_graph) == (not fused)
