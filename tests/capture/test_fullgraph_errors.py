"""fullgraph=True: every refusal is a GraphBreakError naming the user's code, including
refusals raised outside any frame (the output plan), which once crashed the error path."""
import collections

import pytest
import torch

import tempa


def test_refusal_outside_a_frame_names_the_function():
    def f(x):
        dd = collections.defaultdict(dict)
        dd["a"] = x + 1
        return dd["b"], dd

    with pytest.raises(tempa.GraphBreakError) as err:
        tempa.compile(f, backend="eager", fullgraph=True)(torch.ones(1))
    msg = str(err.value)
    assert "defaultdict" in msg
    assert f"{__file__}:" in msg and "in test_refusal_outside_a_frame_names_the_function" in msg


def test_same_refusal_without_fullgraph_runs_eagerly_with_eager_result():
    def f(x):
        dd = collections.defaultdict(dict)
        dd["a"] = x + 1
        return dd["b"], dd

    tempa.reset()
    out = tempa.compile(f, backend="eager")(torch.ones(1))
    assert out[0] == {} and isinstance(out[1], collections.defaultdict)
    assert tempa.stats().eager_fallbacks == 1
