"""A compiled function called by a trace rather than by the program: from a custom op's
kernel that tempa's capture runs on fake tensors, that the backend's trace runs on clones,
or that another fake-tensor trace runs. It runs eagerly there; its calls on real tensors
compile. Before, the nested capture made fakes of fakes (AssertionError "you set
no_dispatch()"), so the outer function ran eagerly as "a tempa bug", and a capture nested
in the backend's trace crashed the process."""
import pytest
import torch

import tempa


def _inner(x):
    return x.sin().cos()


def _with_op(body):
    with torch.library._scoped_library("tempa_test_trace", "FRAGMENT") as lib:
        lib.define("foo(Tensor x) -> Tensor")
        compiled_inner = tempa.compile(_inner, fullgraph=True)
        lib.impl("foo", lambda x: compiled_inner(x), "CompositeExplicitAutograd")
        body(torch.ops.tempa_test_trace.foo.default, compiled_inner)


def test_custom_op_calling_compiled_code_inside_a_compiled_function():
    def body(foo, compiled_inner):
        f = tempa.compile(lambda x: foo(x) * 2, fullgraph=True)
        x = torch.randn(3)
        for _ in range(3):
            torch.testing.assert_close(f(x), x.sin().cos() * 2)
        s = tempa.stats()
        assert s.eager_fallbacks == 0 and s.graph_breaks == 0
        assert len(tempa.entries(f)) == 1                 # the outer function was captured
        assert len(tempa.entries(compiled_inner)) == 1    # and the inner on a real call
    _with_op(body)


@pytest.mark.passes_without_capture("checks that nothing is captured from fake tensors, "
                                     "which holds trivially with capture off")
def test_compiled_function_called_on_fake_tensors_runs_on_them():
    from torch._subclasses.fake_tensor import FakeTensorMode

    def body(foo, compiled_inner):
        with FakeTensorMode() as mode:
            out = foo(mode.from_tensor(torch.randn(3)))
        assert out.shape == (3,) and tempa.stats().eager_fallbacks == 0
        assert tempa.entries(compiled_inner) == []        # nothing captured from fakes
    _with_op(body)
