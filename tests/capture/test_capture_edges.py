"""Capture edge cases: fullgraph refusals raised outside any frame (the output plan, which
once crashed the error path) and inputs whose names clash with the graph module's own."""
import contextlib

import pytest
import torch

import tempa
from tests.capture.paths import counts


@contextlib.contextmanager
def _context():
    yield


def test_refusal_outside_a_frame_names_the_function():
    def f(x):
        cm = _context()      # returned: its generator cannot be handed to Python
        return x + 1, cm

    with pytest.raises(tempa.GraphBreakError) as err:
        tempa.compile(f, backend="eager", fullgraph=True)(torch.ones(1))
    msg = str(err.value)
    assert "@contextmanager" in msg
    assert f"{__file__}:" in msg and "in test_refusal_outside_a_frame_names_the_function" in msg


def test_same_refusal_without_fullgraph_runs_eagerly_with_eager_result():
    def f(x):
        cm = _context()
        return x + 1, cm

    tempa.reset()
    out = tempa.compile(f, backend="eager")(torch.ones(1))
    assert out[0] == 2 and isinstance(out[1], contextlib._GeneratorContextManager)
    assert tempa.stats().eager_fallbacks == 1


def test_a_function_whose_first_parameter_is_named_self():
    def f(self, x):
        return self + x

    x = torch.ones(1)
    for backend in ("eager", "tempa"):
        tempa.reset()
        assert tempa.compile(f, backend=backend, fullgraph=True)(x, 2 * x).tolist() == [3.0]
        assert tempa.stats().captures == 1


def test_backward_called_after_a_graph_break():
    # After the break, Tensor.backward(self, ...) is reached from an entry's Python part.
    def g(x):
        a = torch.sin(x)
        print("", end="")
        a.sum().backward()
        return x.grad

    x = torch.ones(2, requires_grad=True)
    out = tempa.compile(g, backend="eager")(x)
    assert torch.allclose(out, torch.cos(torch.ones(2)))
    assert counts() == (3, 2, 0, 0)


# -- an error capture raised that eager does not ------------------------------------------

def test_an_error_only_capture_raises_is_a_said_eager_run(monkeypatch, caplog):
    # Capture reports an exception of the user's code as theirs and runs the call eagerly,
    # which raises it again from their code. When eager does NOT raise it, the error was
    # tempa's own (a broken model of a library call): that must be counted and said, and
    # later calls run eagerly without capturing again.
    from tempa.capture import calls

    def broken_model(tracer, frame, args, kwargs):
        raise TypeError("a model of torch.is_grad_enabled that is wrong")

    monkeypatch.setitem(calls._SPECIAL, torch.is_grad_enabled, broken_model)

    def f(x):
        return x + 1 if torch.is_grad_enabled() else x - 1

    tempa.reset()
    fast = tempa.compile(f, backend="eager")
    x = torch.ones(2)
    with caplog.at_level("WARNING", logger="tempa"):
        assert torch.equal(fast(x), f(x))
    assert torch.equal(fast(x), f(x))
    s = tempa.stats()
    assert (s.captures, s.eager_fallbacks) == (0, 1)
    reasons = tempa.eager_reasons(fast)
    assert len(reasons) == 1 and "a tempa bug" in reasons[0] and "TypeError" in reasons[0]


@pytest.mark.passes_without_capture("eager's own error is the outcome expected of capture")
def test_the_users_own_error_is_still_eagers_error():
    def f(x):
        raise ValueError("the user's own")

    tempa.reset()
    fast = tempa.compile(f, backend="eager")
    with pytest.raises(ValueError, match="the user's own"):
        fast(torch.ones(2))
    assert tempa.stats().eager_fallbacks == 0 and not tempa.eager_reasons(fast)
