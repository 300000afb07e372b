"""A plain function with a chain of elementwise ops on a 512x512 tensor, built by make().

Eagerly every op reads and writes the whole tensor; fused into one generated kernel the
chain reads x and y once. This is where a compiler wins even on a CPU.
"""
import torch


def gated(x, y):
    return torch.tanh(x) * torch.sigmoid(y) + 0.5 * x - y * y


def make():
    torch.manual_seed(0)
    return gated, (torch.randn(512, 512), torch.randn(512, 512))
