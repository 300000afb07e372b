"""A bug in tempa's own capture code is never the user's exception.

The opcode handlers evaluate the program's operations natively, so what they raise is
mostly the program's own exception, which its ``except`` may catch. An exception that
tempa's code raised by mistake (a NameError in a handler, an attribute typo on one of its
objects, a failed assert of its own) must not reach that ``except``, where the captured
program would take another path than eager's: the call runs eagerly, counted as an eager
fallback, named in explain and logged with the internal traceback, or the error is raised
under ``config.raise_on_failure``. Each bug is planted with monkeypatch."""
import logging
import textwrap

import pytest
import torch

import tempa
from tempa.capture import interpreter
from tempa.capture.interpreter import Frame
from tempa.capture.tracer import Tracer
from tests.capture.paths import counts


def _handler_with_a_name_error(self, ins):
    return helper_that_does_not_exist(self, ins)   # noqa: F821 - the planted bug


def _as_tempas(src: str, name: str):
    """A function written as if in tempa's own code (its file is tempa's interpreter.py):
    a stand-in for a bug in a helper the handlers call."""
    namespace = {}
    exec(compile(textwrap.dedent(src), interpreter.__file__, "exec"), namespace)  # noqa: S102
    return namespace[name]


def _catches_name_error(x):
    try:
        y = x * 2
    except NameError:
        y = x.neg()
    return y



def _loop_catching(exc):
    """A loop over the caller's items whose ``except exc`` must never see tempa's own error."""
    def f(x, items):
        try:
            for i in items:
                x = x + i
        except exc:
            return x - 1
        return x
    return f


def _runs_eagerly_as_eager(f):
    """Eager's result on every call, the capture given up as one counted eager fallback."""
    x = torch.ones(3)
    fast = tempa.compile(f, backend="eager")
    for _ in range(2):
        torch.testing.assert_close(fast(x, [1, 2]), f(x, [1, 2]))
    assert counts() == (0, 0, 0, 1)

def test_a_handlers_name_error_is_not_caught_by_the_users_except(monkeypatch, caplog):
    monkeypatch.setattr(Frame, "BINARY_OP", _handler_with_a_name_error)
    x = torch.ones(3)
    fast = tempa.compile(_catches_name_error, backend="eager")
    with caplog.at_level(logging.WARNING, logger="tempa.fallbacks"):
        results = [fast(x) for _ in range(3)]
    for r in results:
        torch.testing.assert_close(r, _catches_name_error(x))   # x * 2, not x.neg()
    assert counts() == (0, 0, 0, 1)
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "NameError" in logged and "helper_that_does_not_exist" in logged
    assert "Traceback" in logged and "_handler_with_a_name_error" in logged   # tempa's, shown


def test_a_handlers_name_error_is_named_in_explain(monkeypatch):
    monkeypatch.setattr(Frame, "BINARY_OP", _handler_with_a_name_error)
    out = tempa.explain(_catches_name_error)(torch.ones(3))
    assert len(out.eager_fallbacks) == 1
    assert "NameError" in out.eager_fallbacks[0] and "tempa bug" in out.eager_fallbacks[0]


def test_raise_on_failure_raises_the_internal_error(monkeypatch):
    monkeypatch.setattr(Frame, "BINARY_OP", _handler_with_a_name_error)
    monkeypatch.setattr(tempa.config, "raise_on_failure", True)
    with pytest.raises(NameError, match="helper_that_does_not_exist"):
        tempa.compile(_catches_name_error, backend="eager")(torch.ones(3))


def test_an_attribute_typo_on_tempas_object_is_not_the_users_attribute_error(monkeypatch):
    monkeypatch.setattr(Frame, "get_iter", _as_tempas("""
        def get_iter(self, v):
            return self.tracer.no_such_attribute_of_the_tracer
        """, "get_iter"))

    _runs_eagerly_as_eager(_loop_catching(AttributeError))


def test_an_assert_of_tempas_is_not_the_users_assertion_error(monkeypatch):
    monkeypatch.setattr(Tracer, "guard_module_contents", _as_tempas("""
        def guard_module_contents(self, module):
            assert False, "an invariant of tempa's"
        """, "guard_module_contents"))
    seq = torch.nn.Sequential(torch.nn.ReLU())

    def f(x):
        try:
            for layer in seq:
                x = layer(x)
        except AssertionError:
            return x * 0
        return x

    x = torch.randn(4)
    fast = tempa.compile(f, backend="eager")
    torch.testing.assert_close(fast(x), f(x))
    assert counts() == (0, 0, 0, 1)


def test_an_error_of_tempas_outside_any_handler_is_an_eager_fallback(monkeypatch):
    def fails(self):
        raise KeyError("an internal table")
    monkeypatch.setattr(Tracer, "guard_distinct_objects", fails)   # runs after the frame

    def f(x):
        return x * 2

    x = torch.ones(3)
    fast = tempa.compile(f, backend="eager")
    for _ in range(2):
        torch.testing.assert_close(fast(x), f(x))
    assert counts() == (0, 0, 0, 1)


# -- the program's own exceptions stay the program's --------------------------------------

def test_the_programs_own_name_attribute_and_assertion_errors_are_still_caught():
    class Config:
        pass

    def f(x):
        try:
            y = name_nobody_defined   # noqa: F821 - the program's NameError
        except NameError:
            y = 2
        try:
            y = y + Config().scale
        except AttributeError:
            y = y + 1
        try:
            if x.shape[0] != 5:   # (not `assert`, which pytest rewrites in this file)
                raise AssertionError("the program's assertion")
        except AssertionError:
            y = y * 10
        return x * y

    x = torch.ones(3)
    fast = tempa.compile(f, backend="eager")
    for _ in range(2):
        torch.testing.assert_close(fast(x), f(x))
    assert counts() == (1, 0, 0, 0)


def test_a_call_of_tempas_function_with_wrong_arguments_is_not_the_users_type_error(monkeypatch):
    """A caller left behind by a changed signature of tempa's: its TypeError names tempa's
    function, and the program's ``except TypeError`` must not take it."""
    monkeypatch.setattr(Frame, "get_iter", _as_tempas("""
        def get_iter(self, v):
            return self.tracer.external(v)   # (external takes an expression too)
        """, "get_iter"))

    _runs_eagerly_as_eager(_loop_catching(TypeError))


def test_the_programs_own_type_errors_are_still_caught():
    def takes_one(a):
        return a

    def f(x):
        try:
            y = takes_one(1, 2)
        except TypeError:
            y = 3
        try:
            y = y + "a"
        except TypeError:
            y = y * 2
        return x * y

    x = torch.ones(3)
    fast = tempa.compile(f, backend="eager")
    for _ in range(2):
        torch.testing.assert_close(fast(x), f(x))
    assert counts() == (1, 0, 0, 0)
