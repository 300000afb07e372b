"""Generated C++ segments are called through tempa's small CPython extension (runtime/fastcall.py)
where it builds, through ctypes otherwise; both give the same results."""
import platform

import pytest
import torch
import torch.nn as nn

import tempa
from tempa.backend.runtime import fastcall

SUPPORTED = platform.machine() in fastcall._ABI_CHECKED


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)), torch.randn(8, 32)


def _segment_calls(compiled):
    return tempa.entries(compiled)[0].compiled.tempa_info.inference.segment_calls


@pytest.mark.skipif(not SUPPORTED, reason="fast calls are only used on x86-64 and AArch64")
def test_segments_use_the_extension_and_match_eager():
    tempa.reset()
    model, x = _mlp()
    fast = tempa.compile(model)
    with torch.no_grad():
        out = fast(x)
        torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-6)
    assert fastcall.module() is not None, "the extension did not build"
    assert _segment_calls(fast) == "extension"


def test_ctypes_when_switched_off_gives_the_same_result():
    tempa.reset()
    model, x = _mlp()
    old = tempa.config.fast_calls
    tempa.config.fast_calls = False
    try:
        fast = tempa.compile(model)
        with torch.no_grad():
            out = fast(x)
        assert _segment_calls(fast) == "ctypes"
    finally:
        tempa.config.fast_calls = old
        tempa.reset()
    torch.testing.assert_close(out, model(x).detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not SUPPORTED, reason="fast calls are only used on x86-64 and AArch64")
def test_kernel_checks_its_argument_count():
    mod = fastcall.module()
    assert mod is not None
    import ctypes
    libc = ctypes.CDLL(None)
    k = fastcall.kernel(libc.abs, 1)     # int abs(int): one integer argument
    assert k(-5) == 5
    with pytest.raises(TypeError):
        k(1, 2)
    with pytest.raises(TypeError):
        k("not a pointer")
