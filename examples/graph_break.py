"""The first seed's graph-break network (JaringanPutus): a branch on a tensor's value.

`if y.sum() > 0` needs the value of a tensor, which capture does not compute, so the
forward splits into two graphs with one graph break between them (2 graphs, 1 break, 5 ops
in the seed's torch._dynamo.explain; `tempa explain examples/graph_break.py` shows the same
with the line below and a hint).
"""
import torch
import torch.nn as nn


class JaringanPutus(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        y = torch.relu(self.fc1(x))
        if y.sum() > 0:  # cabang bergantung pada nilai tensor
            y = y * 1.0
        return self.fc2(y)


torch.manual_seed(0)
model = JaringanPutus()
example_inputs = (torch.randn(4, 32),)
