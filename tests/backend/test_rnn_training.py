"""An LSTM's training step on the CPU: oneDNN's RNN layer returns the workspace its backward
reads only while grad mode is on, and a training graph's forward runs with it off; the
wrapper calls that op under enable_grad on detached arguments (codegen/wrapper.py
_GRAD_MODE_OUTPUTS). It raised "a saved value is no tensor" where eager runs. Outputs and
gradients against eager's float64."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

import tempa


@pytest.mark.parametrize("layers,bidirectional", [(1, False), (2, True)])
def test_lstm_training_step_equals_eager(layers, bidirectional):
    tempa.reset()
    torch.manual_seed(6)
    lstm = nn.LSTM(6, 8, num_layers=layers, bidirectional=bidirectional, batch_first=True).train()
    ref = copy.deepcopy(lstm).double()
    x = torch.randn(3, 5, 6, requires_grad=True)
    xr = x.detach().double().requires_grad_()
    compiled = tempa.compile(lstm)
    out, (h, c) = compiled(x)
    outr, (hr, cr) = ref(xr)
    g = torch.randn_like(out)
    (out * g).sum().add(h.sum() * 0.5).add(c.pow(2).sum()).backward()
    (outr * g.double()).sum().add(hr.sum() * 0.5).add(cr.pow(2).sum()).backward()
    close = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.double(), outr, **close)
    torch.testing.assert_close(x.grad.double(), xr.grad, **close)
    for (name, p), (_, q) in zip(lstm.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-5, atol=1e-4, msg=name)
    calls = [x for e in tempa.entries(compiled)
             for info in [getattr(e.compiled, "tempa_info", None)] if info is not None and info.forward
             for x in info.forward.aten_fallbacks]     # the compiled forward calls the layer
    assert any("mkldnn_rnn_layer" in str(x) for x in calls), calls
