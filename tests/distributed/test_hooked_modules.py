"""In one process: a submodule with hooks runs its hooks eagerly around a compiled forward
(what FSDP2's fully_shard relies on), also when reached from code after a graph break in a
loop, and a compiled module first called inside activation checkpointing compiles there."""
import torch
import torch.nn as nn

import tempa


class Loop(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def test_hooked_submodules_run_hooks_and_compile():
    torch.manual_seed(0)
    model = Loop()
    calls = []
    for i, layer in enumerate(model.layers):
        layer.register_forward_pre_hook(lambda m, a, i=i: calls.append(("pre", i)))
        layer.register_forward_hook(lambda m, a, out, i=i: out * 2)
    x = torch.randn(4, 8)
    expected = model(x)
    calls.clear()
    tempa.reset()
    fast = tempa.compile(model)
    for _ in range(2):
        torch.testing.assert_close(fast(x), expected)
    assert calls == [("pre", i) for i in range(3)] * 2
    stats = tempa.stats()
    # the root's graph (broken at the first hooked layer) and one graph per layer, although
    # layers 2 and 3 are called from the eagerly run rest of the loop
    assert stats.captures == 4 and stats.kernels_compiled > 0 and stats.eager_fallbacks == 0, stats
    assert sum(e.function == "Linear.forward" for e in tempa.entries(fast)) == 3


def test_root_module_hooks_run():
    model = nn.Linear(8, 8)
    model.register_forward_hook(lambda m, a, out: out + 1)
    x = torch.randn(2, 8)
    tempa.reset()
    torch.testing.assert_close(tempa.compile(model)(x), model(x))


def test_first_call_inside_checkpoint():
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 8))
    x = torch.randn(4, 8, requires_grad=True)
    tempa.reset()
    fast = tempa.compile(block)
    out = torch.utils.checkpoint.checkpoint(fast, x, use_reentrant=False)
    out.sum().backward()
    got = [p.grad.clone() for p in block.parameters()]
    block.zero_grad()
    block(x).sum().backward()
    for g, p in zip(got, block.parameters()):
        torch.testing.assert_close(g, p.grad)
    assert tempa.stats().kernels_compiled > 0 and tempa.stats().eager_fallbacks == 0
