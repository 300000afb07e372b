"""Gradients of the piecewise activations at their kinks, in compiled training graphs.

The joint trace decomposed hardtanh (ReLU6), hardsigmoid and hardswish into clamp before
autograd saw them, so autograd differentiated clamp: its gradient passes at the bounds,
where eager's own backward (hardtanh_backward, ...) passes none. ReLU6 at exactly 0 or 6
got a gradient of 1 instead of 0 (hidden while clamp's backward, which writes in place,
sent the graph to ATen calls); hardsigmoid at +-3 and hardswish at -3 got wrong values in
compiled code. They are now kept whole for autograd, so the backward is eager's formula.
"""
import pytest
import torch
import torch.nn.functional as F

import tempa

# (name, activation, inputs: the kinks, NaN, and points on each side)
CASES = [
    ("relu6", F.relu6, [-1.0, 0.0, 3.0, 6.0, 7.0, float("nan")]),
    ("relu6_module_inplace", torch.nn.ReLU6(inplace=True), [-1.0, 0.0, 3.0, 6.0, 7.0]),
    ("hardtanh", lambda x: F.hardtanh(x, -1.0, 1.0), [-2.0, -1.0, 0.0, 1.0, 2.0, float("nan")]),
    ("hardsigmoid", F.hardsigmoid, [-4.0, -3.0, 0.0, 1.3, 3.0, 4.0]),
    ("hardswish", F.hardswish, [-4.0, -3.0, 0.0, 1.3, 3.0, 4.0]),
    ("leaky_relu", lambda x: F.leaky_relu(x, 0.1), [-1.0, 0.0, 1.0]),
    ("threshold", lambda x: F.threshold(x, 1.0, -2.0), [0.0, 1.0, 2.0]),
    ("relu", F.relu, [-1.0, 0.0, 1.0]),
    ("elu", F.elu, [-1.0, 0.0, 1.0]),
    ("hardshrink", F.hardshrink, [-1.0, -0.5, 0.0, 0.5, 1.0]),
    ("softshrink", F.softshrink, [-1.0, -0.5, 0.0, 0.5, 1.0]),
    ("clamp_min", lambda x: x.clamp(min=1.0), [0.0, 1.0, 2.0]),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("name,act,points", CASES, ids=[c[0] for c in CASES])
def test_gradient_at_the_kinks_is_eagers(name, act, points, dtype):
    def f(x, w):
        # x * 1 first: an in-place activation (ReLU6(inplace=True)) writes a fresh tensor,
        # not a leaf; w makes each element's incoming gradient different
        return (act(x * 1) * w).sum()

    x = torch.tensor(points, dtype=dtype, requires_grad=True)
    w = torch.linspace(0.5, 2.0, len(points), dtype=dtype)
    tempa.reset()
    f(x, w).backward()
    want, x.grad = x.grad, None
    tempa.compile(f)(x, w).backward()
    assert torch.equal(x.grad.isnan(), want.isnan()), (x.grad, want)
    assert torch.equal(x.grad.nan_to_num(), want.nan_to_num()), (x.grad, want)
    s = tempa.stats()
    # the training graph ran as generated code: no graph (or op) sent to ATen calls
    assert s.captures == 1 and s.graph_breaks == 0 and s.eager_fallbacks == 0, s
    assert s.aten_fallbacks == 0 and s.kernels_compiled > 0, s
