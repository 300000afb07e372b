"""pow(tensor, scalar) at the exponents ATen's CPU kernel computes without pow (3, -2, -1, -0.5,
0.5; 2 and 1 as before): the generated C++ uses the same multiplications, divisions and
square roots instead of libm's pow, whose vector version takes a slow path for a negative base
(GPT-2's tanh GELU, ``x + 0.044715 * x ** 3``, ran ~30x slower). Values are compared with eager
bit for bit (the same operations in the same order), gradients with float64, and the C++ is
checked not to call pow, so reverting the lowering fails the route check."""
import pytest
import torch

import tempa

from .helpers import compile_fn

EXPONENTS = [3, 3.0, -2, -1.0, -0.5, 0.5]


def _cpp(fn):
    return fn.tempa_info.cpp_source


def _base(e):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4099, generator=g) * 3
    if e in (-0.5, 0.5):
        x = x.abs()                  # a real root: eager's NaN below 0 is checked separately
    return torch.cat([x, torch.tensor([0.0, -0.0, 1.0, -1.0, float("inf"), float("-inf"),
                                       float("nan"), 1e-30, -1e-30, 3e12, -3e12])])


@pytest.mark.parametrize("e", EXPONENTS, ids=[repr(e) for e in EXPONENTS])
def test_pow_scalar_matches_eager_without_calling_pow(e):
    x = _base(e)
    c = compile_fn(lambda t: torch.pow(t, e) + 0.0, x)
    out, ref = c(x), torch.pow(x, e)
    exact = float(e).is_integer()          # the square roots: within an ulp of ATen's
    torch.testing.assert_close(out, ref, rtol=0 if exact else None, atol=0 if exact else None,
                               equal_nan=True)
    assert "t_pow(" not in _cpp(c).split("extern \"C\"", 1)[1], "pow(x, %r) still calls pow" % e


def test_square_root_exponents_of_negative_bases_are_nan_like_eager():
    x = torch.tensor([-4.0, -1.0, -0.0, 0.0, 4.0])
    for e in (0.5, -0.5):
        c = compile_fn(lambda t: torch.pow(t, e) * 1.0, x)
        torch.testing.assert_close(c(x), torch.pow(x, e), rtol=0, atol=0, equal_nan=True)


def test_other_exponents_and_integer_tensors_keep_pow():
    x = torch.randn(257).abs() + 0.1
    c = compile_fn(lambda t: torch.pow(t, 2.5) * 1.0, x)
    torch.testing.assert_close(c(x), torch.pow(x, 2.5))
    assert "t_pow(" in _cpp(c)
    n = torch.arange(-20, 21)
    ci = compile_fn(lambda t: torch.pow(t, 3) + 0, n)
    assert torch.equal(ci(n), torch.pow(n, 3))


def test_tanh_gelu_training_step_matches_float64():
    """GPT-2's GELU (``x ** 3``) in a compiled training step: the forward's cube and the
    backward's ``3 * x ** 2`` without pow, values and gradients against float64; and no ATen
    fallback (tanh's backward calls conj_physical on its real gradient, which ran as one)."""
    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(32, 128)
            self.proj = torch.nn.Linear(128, 32)

        def forward(self, x):
            h = self.fc(x)
            h = 0.5 * h * (1.0 + torch.tanh(0.7978845608028654 * (h + 0.044715 * torch.pow(h, 3.0))))
            return self.proj(h)

    torch.manual_seed(0)
    m = Mlp()
    m64 = Mlp().double()
    m64.load_state_dict(m.state_dict())
    x = torch.randn(16, 32) * 2
    tempa.reset()
    fast = tempa.compile(m)
    loss = fast(x).square().mean()
    loss.backward()
    ref = m64(x.double()).square().mean()
    ref.backward()
    s = tempa.stats()
    assert s.graphs_compiled == 1 and s.eager_fallbacks == 0 and s.aten_fallbacks == 0, s
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-6)
    for (name, p), p64 in zip(m.named_parameters(), m64.parameters()):
        scale = p64.grad.abs().max().item()
        assert (p.grad.double() - p64.grad).abs().max().item() <= 1e-5 * scale, name
    (entry,) = tempa.entries(fast)
    info = entry.compiled.tempa_info
    assert info.fallback_reason is None
    assert "tanh" in info.cpp_source and "t_pow(" not in info.cpp_source.split('extern "C"', 1)[1]

