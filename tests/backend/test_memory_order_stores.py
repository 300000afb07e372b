"""Values stored in a permuted layout are computed in memory order (lower/core.py
LowerCtx.store): a matmul's transposed operand ``h.t()``, an output or a value saved for the
backward in eager's transposed layout. The buffer is computed over its dims from the largest
stride to the smallest, so the innermost C++ loop stores consecutive elements, and it is read
(and allocated by the wrapper) as the strided view. Checked: values, output strides, that
outputs are plain tensors (not views), gradients against float64, and that the kernel's
innermost store is unit-stride (it jumped by the row length before)."""
import re

import torch

import tempa
from tempa.backend.lower.core import memory_order

from .helpers import compile_fn


def _stores(cpp: str, buf: str):
    """The index expressions of every store to ``buf`` in the C++ source."""
    return re.findall(rf"\b{buf}\[([^\]]+)\] =", cpp)


def _assert_unit_stride_stores(cpp: str):
    """Every store's innermost loop variable steps it by one element (no ``300*x1`` on it):
    a member's own inner loops (``i_buf3_2``) are inside the group's outer ones (``x1``),
    the highest-numbered innermost."""
    stores = [ix for b in re.findall(r"float\* __restrict__ (buf\d+)", cpp) for ix in _stores(cpp, b)]
    assert stores, cpp
    for ix in stores:
        loop_vars = re.findall(r"\b(?:i_buf\d+_\d+|x\d+)\b", ix)
        if loop_vars:
            inner = max(loop_vars, key=lambda v: (v.startswith("i_"), int(v.rsplit("_", 1)[-1].lstrip("x"))))
            assert not re.search(rf"\d+\*{inner}\b", ix), (ix, cpp)


def test_memory_order_of_layouts():
    assert memory_order((3072, 64), (1, 3072)) == [1, 0]
    assert memory_order((1, 250, 512), (128000, 1, 250)) == [0, 2, 1]
    assert memory_order((4, 5), (5, 1)) is None              # contiguous already
    assert memory_order((4, 5), (1, 8)) is None              # not dense
    assert memory_order((4, 0), (1, 4)) is None              # no elements
    assert memory_order((2, 1, 3), (1, 7, 2)) == [1, 2, 0]  # a size-1 dim's stride is unused


def test_transposed_matmul_operand_and_output_are_stored_in_memory_order():
    torch.manual_seed(0)
    x, w = torch.randn(64, 300), torch.randn(64, 16)

    def f(x, w):
        h = torch.tanh(x) * 2
        return h.t() @ w, torch.relu(x).t()

    c = compile_fn(f, x, w)
    got, want = c(x, w), f(x, w)
    torch.testing.assert_close(got[0], want[0])
    assert torch.equal(got[1], want[1])
    assert got[1].stride() == want[1].stride() == (1, 300)
    assert got[1]._base is None                # allocated in that layout, not a view of a copy
    _assert_unit_stride_stores(c.tempa_info.cpp_source)
    assert "_as_strided(buf" not in c.tempa_info.wrapper_source


def test_training_with_transposed_saved_values_matches_float64():
    """A channels-first activation transposed into the token-major residual stream (Whisper's
    convolution front end), LayerNorm, and a linear: its saved values come in eager's
    transposed layout, and are saved in the forward's own; loss and every gradient against
    float64."""
    class Front(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv1d(8, 32, 3, padding=1)
            self.norm = torch.nn.LayerNorm(32)
            self.fc = torch.nn.Linear(32, 48)
            self.pos = torch.nn.Parameter(torch.randn(20, 32) * 0.1)

        def forward(self, x):
            h = torch.nn.functional.gelu(self.conv(x)).permute(0, 2, 1)
            h = h + self.pos
            return self.fc(self.norm(h)) + h.sum(-1, keepdim=True)

    torch.manual_seed(0)
    m = Front()
    m64 = Front().double()
    m64.load_state_dict(m.state_dict())
    x = torch.randn(1, 8, 20)
    tempa.reset()
    fast = tempa.compile(m)
    loss = fast(x).square().mean()
    loss.backward()
    ref = m64(x.double()).square().mean()
    ref.backward()
    assert tempa.stats().graphs_compiled == 1 and tempa.stats().eager_fallbacks == 0
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-7)
    for (name, p), p64 in zip(m.named_parameters(), m64.parameters()):
        scale = p64.grad.abs().max().item()
        assert (p.grad.double() - p64.grad).abs().max().item() <= 1e-5 * scale, name
    (entry,) = tempa.entries(fast)
    info = entry.compiled.tempa_info
    assert info.fallback_reason is None
    # the saved values are handed out in the forward's own layout (autograd.py
    # _own_layout_outputs), not copied into eager's transposed one
    assert not re.search(r"\(640, 1, 20\)", info.forward.wrapper_source), info.forward.wrapper_source
    _assert_unit_stride_stores(info.forward.cpp_source)
