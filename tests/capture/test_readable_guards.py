"""Guard descriptions read as the user's code (issue 20, point 3): explain, the report, the
guards log and recompile reasons say ``self.drop.p == 0.1``, never ``___O13.p == 0.1``."""
import numpy as np
import torch
import torch.nn as nn

import tempa


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.drop = nn.Dropout(0.1)
        self.fc = nn.Linear(4, 2)
        self.scale = 2.0

    def forward(self, x):
        h = self.drop(self.conv(x)).mean((2, 3)) * self.scale
        return self.fc(h) + _spread(h)   # a graph break with self.fc(h) on the stack


@torch.compiler.disable
def _spread(h):
    return float(np.std(h.detach().numpy()))


def _descriptions(fast):
    return [d for e in tempa.entries(fast) for d in e.guards]


def test_guards_name_the_users_objects():
    tempa.reset()
    fast = tempa.compile(Net().eval(), backend="eager")
    fast(torch.randn(2, 3, 8, 8))
    described = _descriptions(fast)
    assert not [d for d in described if "___" in d], described
    for expected in ("self.drop.p == 0.1", "self.conv.stride == (1, 1)", "self.scale == 2.0",
                     "self.drop.training is False", "self is a Net", "self.fc is the same module"):
        assert expected in described
    # values a resume function receives on the stack are named by type and line
    assert any(" on the stack at line " in d for d in described), described


def test_recompile_reason_names_the_attribute():
    tempa.reset()
    model = Net().eval()
    fast = tempa.compile(model, backend="eager")
    x = torch.randn(2, 3, 8, 8)
    fast(x)
    model.drop.p = 0.2
    fast(x)
    reasons = [why for _, why in tempa.recompile_reasons(fast)]
    assert "self.drop.p == 0.1" in reasons, reasons


def test_explain_shows_readable_guards():
    tempa.reset()
    text = str(tempa.explain(Net().eval())(torch.randn(2, 3, 8, 8)))
    assert "self.drop.p == 0.1" in text and "___O" not in text and "___stack" not in text


SCALE = 3.0


def test_closure_and_global_guards_use_the_variable_names():
    tempa.reset()
    offset = 0.5

    def f(x):
        return x * SCALE + offset
    fast = tempa.compile(f, backend="eager")
    fast(torch.ones(2))
    described = _descriptions(fast)
    assert "SCALE == 3.0" in described and "offset == 0.5" in described, described
