"""``as_strided`` of a value the graph computed (lower/views.py _as_strided): its sizes,
strides and offset address eager's storage. A slice of a flattened activation starts at a
storage offset; it was handed to ATen as a copy (a fresh storage), so as_strided read other
elements (a wrong answer) or raised a storage-bounds error where eager runs. It is now an
index remap relative to the value's first element where it addresses only the value's own
elements, and the graph runs as eager ATen calls where it addresses more."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

import tempa


def _conv():
    torch.manual_seed(0)
    return nn.Conv2d(4, 8, 3, padding=1).eval()


CASES = {
    # inside the sliced value: compiled
    "slice_of_flat_conv_output": (lambda conv, x: conv(x).view(-1)[8:].as_strided((2, 8, 4, 3), (512, 64, 16, 2), 8), True),
    "slice_of_flat_activation": (lambda conv, x: torch.relu(conv(x)).flatten()[16:].as_strided((3, 5), (7, 2), 20) * 2, True),
    "whole_activation": (lambda conv, x: torch.relu(conv(x)).as_strided((4, 8), (16, 1), 3) + 1, True),
    # before the slice's first element: storage the value does not hold
    "before_the_slice": (lambda conv, x: torch.relu(conv(x)).flatten()[16:].as_strided((3, 5), (7, 2), 4) * 2, False),
}


@pytest.mark.parametrize("layout", ["eager", "channels_last"])
@pytest.mark.parametrize("name", list(CASES))
def test_as_strided_of_a_computed_value_reads_eagers_elements(name, layout, monkeypatch):
    fn, compiled_kernels = CASES[name]
    monkeypatch.setattr(tempa.config, "cpu_conv_layout", layout)
    tempa.reset()
    conv = _conv()
    x = torch.randn(2, 4, 8, 8)
    compiled = tempa.compile(lambda x: fn(conv, x))
    with torch.no_grad():
        got, want = compiled(x), fn(conv, x)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    reasons = [e.kernels.fallback_reason for e in tempa.entries(compiled) if e.kernels is not None]
    if compiled_kernels:
        assert reasons == [None], reasons
    else:
        assert reasons and "storage it does not hold" in reasons[0], reasons
