"""The model behind docs/report-screenshot.png (`tempa report docs/report_example.py
--stance auto`): a small CNN whose head branches on a tensor's value (one graph break), in
eval mode, with a second batch size in `extra_inputs` (one recompile, then dynamic)."""
import torch
import torch.nn as nn


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.drop = nn.Dropout(0.25)
        self.head = nn.Linear(32 * 8 * 8, 10)

    def forward(self, x):
        h = self.drop(self.features(x).flatten(1))
        if h.mean() > 0:          # a branch on a tensor's value: a graph break
            h = h * 2
        return self.head(h)


torch.manual_seed(0)
model = SmallCNN().eval()
example_inputs = (torch.randn(16, 3, 32, 32),)
extra_inputs = [(torch.randn(4, 3, 32, 32),)]
