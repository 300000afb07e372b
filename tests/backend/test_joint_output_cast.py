"""Training graphs whose output is also cast by the backward (layer_norm's decomposition
casts its input to float32, a no-op on float32 that returns the same tensor): the output
must still come from the forward graph (the backend raised KeyError and ran eagerly)."""
import torch
import torch.nn.functional as F

import tempa


def test_output_read_by_layer_norm_backward_compiles():
    def residual_then_norm(x, w, b, nw, nb):
        h = x @ w.t() + b
        return h, F.layer_norm(h, (32,), nw, nb, 1e-5)

    torch.manual_seed(0)
    args = [torch.randn(8, 16)] + [torch.randn(*s, requires_grad=True)
                                   for s in [(32, 16), (32,), (32,), (32,)]]
    tempa.reset()
    old = tempa.config.raise_on_failure
    tempa.config.raise_on_failure = True
    try:
        out = tempa.compile(residual_then_norm)(*args)
        (out[0].sum() + (out[1] ** 2).sum()).backward()
    finally:
        tempa.config.raise_on_failure = old
    got = [a.grad.clone() for a in args[1:]]
    for a in args[1:]:
        a.grad = None
    ref = residual_then_norm(*args)
    (ref[0].sum() + (ref[1] ** 2).sum()).backward()
    for g, a in zip(got, args[1:]):
        torch.testing.assert_close(g, a.grad)
    assert tempa.stats().kernels_compiled > 0
