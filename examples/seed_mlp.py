"""The first seed's small network (JaringanKecil): two Linear layers with a ReLU between.

    tempa bench examples/seed_mlp.py
    tempa explain examples/seed_mlp.py
    tempa report examples/seed_mlp.py -o report.html

The file follows the convention of the tempa CLI (examples/README.md): it defines `model`
and `example_inputs`; `extra_inputs` are further inputs (batch 9 after batch 8) that
`tempa explain` and `tempa report` run to show a recompile.
"""
import torch
import torch.nn as nn


class JaringanKecil(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


torch.manual_seed(42)
model = JaringanKecil()
example_inputs = (torch.randn(8, 32),)
extra_inputs = [(torch.randn(9, 32),)]
