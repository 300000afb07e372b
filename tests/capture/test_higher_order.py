"""Higher-order constructs in captured code (issue 16 item 4): torch.compiler.disable,
user autograd Functions, torch.utils.checkpoint, torch.library custom ops."""
import copy
import warnings

import pytest
import torch

import tempa


def _counts():
    s = tempa.stats()
    return s.captures, s.graph_breaks, s.eager_fallbacks


@torch.compiler.disable
def _disabled_item(x):
    # .item() would be a break of its own if tempa traced into the disabled function
    return x.sum().item() + 1


def test_compiler_disable_is_one_clean_break():
    def f(x):
        y = x * 2
        return y + _disabled_item(y)

    x = torch.randn(4)
    fast = tempa.compile(f)
    for _ in range(2):
        torch.testing.assert_close(fast(x), f(x))
    assert _counts() == (2, 1, 0)   # the part before and the resume after, as torch.compile
    report = tempa.explain(f)(x)
    assert [r.type for r in report.break_reasons] == ["disabled by torch.compiler.disable"]


def test_dynamo_disable_decorator_and_disabled_method():
    import torch._dynamo

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        @torch._dynamo.disable
        def helper(self, x):
            return x * float(x.detach().sum())

        def forward(self, x):
            return torch.relu(self.helper(self.lin(x))) + 1

    m, x = M(), torch.randn(2, 4)
    torch.testing.assert_close(tempa.compile(m)(x), m(x))
    assert _counts() == (2, 1, 0)


def test_compiler_disable_under_fullgraph_names_the_function():
    def f(x):
        return x + _disabled_item(x)

    with pytest.raises(tempa.GraphBreakError, match="_disabled_item is marked @torch.compiler.disable"):
        tempa.compile(f, fullgraph=True)(torch.randn(3))


def test_compiled_disabled_function_runs_eagerly():
    x = torch.randn(3)
    fast = tempa.compile(_disabled_item)
    assert fast(x) == _disabled_item(x)
    assert _counts() == (0, 0, 0)
    assert tempa.eager_reasons(fast) == ["_disabled_item: disabled by torch.compiler.disable"]


class _StraightThroughRound(torch.autograd.Function):
    """round() forward, identity-times-scale backward: not the derivative of the forward
    (0 almost everywhere), so autograd differentiating the forward gives other gradients."""

    @staticmethod
    def forward(ctx, x, scale):
        ctx.save_for_backward(x)
        ctx.scale = scale
        return torch.round(x * scale)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * ctx.scale + x * 0, None


def _uses_ste(x):
    return _StraightThroughRound.apply(x.sin(), 3.0).cos().sum()


def _value_and_grad(fn, x):
    x = x.detach().clone().requires_grad_()
    out = fn(x)
    out.backward()
    return out, x.grad


def test_autograd_function_uses_the_users_backward():
    x, fast = torch.randn(5), tempa.compile(_uses_ste, fullgraph=True)
    for _ in range(2):
        out, grad = _value_and_grad(fast, x)
        want_out, want_grad = _value_and_grad(_uses_ste, x)
        torch.testing.assert_close(out, want_out)
        torch.testing.assert_close(grad, want_grad)
    # one graph: Fn.apply is one operation whose gradient is the captured backward
    assert _counts() == (1, 0, 0)
    (op,) = [n.target for n in tempa.entries(fast)[0].graph.graph.nodes
             if isinstance(n.target, torch._ops.OpOverload)]
    assert op.namespace == "tempa_fn" and "_StraightThroughRound" in op.name()


class _ScaledExp(torch.autograd.Function):
    """Saves its output, keeps a non-tensor and a flag on ctx, returns a second output
    marked non-differentiable, and skips the gradient of inputs that need none."""

    @staticmethod
    def forward(ctx, x, w, power):
        y = torch.exp(x * w) ** power
        ctx.save_for_backward(y, x, w)
        ctx.power, ctx.first_is_x = power, True
        sign = torch.sign(x)
        ctx.mark_non_differentiable(sign)
        return y, sign

    @staticmethod
    def backward(ctx, grad_y, grad_sign):
        y, x, w = ctx.saved_tensors
        gx = grad_y * y * ctx.power * w if ctx.needs_input_grad[0] else None
        gw = (grad_y * y * ctx.power * x).sum(0) if ctx.needs_input_grad[1] else None
        return gx, gw, None


class _OnceCube(torch.autograd.Function):
    """The new-style Function: forward without ctx, setup_context, once_differentiable."""

    @staticmethod
    def forward(x):
        return x ** 3

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 3 * x * x


def _uses_functions(x, w):
    y, sign = _ScaledExp.apply(x.sin(), w, 2)
    return (_OnceCube.apply(y) * sign).sum() + sign.sum()


def _values_and_grads(fn, *inputs):
    inputs = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    out = fn(*inputs)
    out.backward()
    return out, [t.grad for t in inputs]


@pytest.mark.parametrize("backend", ["eager", "tempa"])
@pytest.mark.parametrize("w_grad", [True, False])
def test_autograd_functions_match_eager_values_and_gradients(backend, w_grad):
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(4, dtype=torch.float64, requires_grad=w_grad) * 0.3
    fast = tempa.compile(_uses_functions, backend=backend, fullgraph=True)
    for _ in range(2):
        out, grads = _values_and_grads(fast, x, w)
        want_out, want_grads = _values_and_grads(_uses_functions, x, w)
        torch.testing.assert_close(out, want_out)
        for got, want in zip(grads, want_grads):
            torch.testing.assert_close(got, want)
    assert _counts() == (1, 0, 0)


def test_autograd_function_outputs_keep_eager_flags():
    def f(x, w):
        return _ScaledExp.apply(x, w, 3)

    x, w = torch.randn(2, 3, requires_grad=True), torch.randn(3)
    y, sign = tempa.compile(f, fullgraph=True)(x, w)
    want_y, want_sign = f(x, w)
    torch.testing.assert_close((y, sign), (want_y, want_sign))
    assert (y.requires_grad, sign.requires_grad) == (want_y.requires_grad, want_sign.requires_grad)
    with torch.no_grad():
        assert not tempa.compile(f)(x, w)[0].requires_grad
    assert tempa.stats().captures == 2 and tempa.stats().graph_breaks == 0


class _TimesTwoAndAnInt(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2, 3

    @staticmethod
    def backward(ctx, grad, grad_of_int):
        assert grad_of_int is None   # eager passes None for the output that is no tensor
        return grad * 5


def test_autograd_function_with_an_output_that_is_no_tensor():
    def f(x):
        y, k = _TimesTwoAndAnInt.apply(x)
        return (y * k).sum()

    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    out, (grad,) = _values_and_grads(tempa.compile(f, fullgraph=True), x)
    want_out, (want_grad,) = _values_and_grads(f, x)
    torch.testing.assert_close((out, grad), (want_out, want_grad))
    assert _counts() == (1, 0, 0)


class _WritesItsInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.mul_(2)

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


_CALLS = []


class _RecordsCalls(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        _CALLS.append(1)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


@pytest.mark.parametrize("fn, reason", [(_WritesItsInput, "writes a tensor it was given"),
                                        (_RecordsCalls, "changes state outside the call")])
def test_autograd_function_that_one_operation_cannot_show_breaks_by_name(fn, reason):
    def f(x):
        return fn.apply(x * 1) + 1

    with pytest.raises(tempa.GraphBreakError, match=reason):
        tempa.compile(f, fullgraph=True)(torch.randn(3))
    tempa.reset()
    x = torch.randn(3, requires_grad=True)
    _CALLS.clear()
    out, (grad,) = _values_and_grads(lambda t: tempa.compile(f)(t).sum(), x)
    want_out, (want_grad,) = _values_and_grads(lambda t: f(t).sum(), x)
    torch.testing.assert_close((out, grad), (want_out, want_grad))
    assert tempa.stats().graph_breaks == 1
    if fn is _RecordsCalls:
        assert len(_CALLS) == 2   # once compiled (run eagerly), once eager


def test_checkpoint_is_captured_as_the_call():
    from torch.utils.checkpoint import checkpoint

    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)

    def block(x, scale=1.0):
        return torch.relu(lin(x)) * scale

    def f(x):
        return checkpoint(block, x.sin(), use_reentrant=False, scale=2.0).cos().sum()

    x, fast = torch.randn(3, 4), tempa.compile(f, fullgraph=True)
    for _ in range(2):
        out, grad = _value_and_grad(fast, x)
        want_out, want_grad = _value_and_grad(f, x)
        torch.testing.assert_close(out, want_out)
        torch.testing.assert_close(grad, want_grad)
    assert _counts() == (1, 0, 0)


def test_reentrant_checkpoint_runs_eagerly_by_name():
    from torch.utils.checkpoint import checkpoint

    def f(x):
        return checkpoint(torch.sin, x, use_reentrant=True) + 1

    with pytest.raises(tempa.GraphBreakError, match="use_reentrant=False"):
        tempa.compile(f, fullgraph=True)(torch.randn(3, requires_grad=True))


@torch.library.custom_op("tempa_test::scaled_sin", mutates_args=())
def _scaled_sin(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x.sin() * scale


@_scaled_sin.register_fake
def _(x, scale):
    return torch.empty_like(x)


def _scaled_sin_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.scale = inputs[1]


def _scaled_sin_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * x.cos() * ctx.scale * 10, None   # not the true derivative: the user's


_scaled_sin.register_autograd(_scaled_sin_backward, setup_context=_scaled_sin_setup)


def _uses_custom_op(x):
    return _scaled_sin(x * 2, 0.5).cos().sum()


@pytest.mark.parametrize("backend", ["eager", "tempa"])
def test_custom_op_is_one_node_with_its_registered_autograd(backend):
    x = torch.randn(6, dtype=torch.float64, requires_grad=True)
    fast = tempa.compile(_uses_custom_op, backend=backend, fullgraph=True)
    for _ in range(2):
        out, (grad,) = _values_and_grads(fast, x)
        want_out, (want_grad,) = _values_and_grads(_uses_custom_op, x)
        torch.testing.assert_close((out, grad), (want_out, want_grad))
    assert _counts() == (1, 0, 0)
    targets = [n.target for n in tempa.entries(fast)[0].graph.graph.nodes]
    assert torch.ops.tempa_test.scaled_sin.default in targets


_W = torch.randn(3, dtype=torch.float64)


def _uses_cond(x, flag):
    (y,) = torch.cond(flag, lambda t: (t.sin() * _W,), lambda t: (t.cos() + _W,), (x,))
    return y.sum() + 1


def _cond_in_eager(x, flag):
    # eager's reference, without eager's torch.cond: that runs torch.compile, which imports
    # Dynamo for the rest of the session (the optimizers' disable marks then resolve)
    y = x.sin() * _W if bool(flag) else x.cos() + _W
    return y.sum() + 1


@pytest.mark.parametrize("flag", [True, False])
def test_cond_on_a_python_bool_inlines_the_taken_branch(flag):
    x = torch.randn(3, dtype=torch.float64)
    fast = tempa.compile(_uses_cond, fullgraph=True)
    torch.testing.assert_close(fast(x, flag), _cond_in_eager(x, flag))
    assert _counts() == (1, 0, 0)
    code = tempa.entries(fast)[0].graph_code
    assert ("sin" in code) is flag and ("cos" in code) is not flag
    torch.testing.assert_close(fast(x, not flag), _cond_in_eager(x, not flag))
    assert _counts() == (2, 0, 0)   # the other value is another graph (guarded)


@pytest.mark.parametrize("backend", ["eager", "tempa"])
def test_cond_on_a_tensor_decides_when_the_graph_runs(backend):
    x = torch.randn(3, dtype=torch.float64, requires_grad=True)
    fast = tempa.compile(_uses_cond, backend=backend, fullgraph=True)
    for flag in (True, False, True):
        pred = torch.tensor(flag)
        out, (grad,) = _values_and_grads(lambda t: fast(t, pred), x)
        want_out, (want_grad,) = _values_and_grads(lambda t: _cond_in_eager(t, pred), x)
        torch.testing.assert_close((out, grad), (want_out, want_grad))
    assert _counts() == (1, 0, 0)


def test_cond_on_a_tensor_compiled_by_tempa():
    x = torch.randn(3, dtype=torch.float64)
    fast = tempa.compile(_uses_cond, fullgraph=True)
    for flag in (True, False):
        torch.testing.assert_close(fast(x, torch.tensor(flag)), _cond_in_eager(x, flag))
    assert _counts() == (1, 0, 0)


def test_cond_branches_of_other_shapes_break_by_name():
    def f(x):
        return torch.cond(x.sum() > 0, lambda t: t * 2, lambda t: t[:1], (x,))

    with pytest.raises(tempa.GraphBreakError, match="branches return tensors of other shapes"):
        tempa.compile(f, fullgraph=True)(torch.randn(3))


_V = torch.randn(4, dtype=torch.float64)


def _loss(p, x):
    return ((x * p).sin() * _V).sum()


def _uses_transforms(x, p):
    per_row = torch.vmap(lambda r: (r * _V).cos() + r.sum())(x)
    grad = torch.func.grad(_loss)(p, x[0])
    per_row_grads = torch.vmap(torch.func.grad(_loss), in_dims=(None, 0))(p, x)
    jacobian = torch.func.jacrev(lambda t: t.sin() * _V)(p)
    return per_row, grad, per_row_grads, jacobian


@pytest.mark.parametrize("backend", ["eager", "tempa"])
def test_func_transforms_of_python_functions_are_one_graph(backend):
    x, p = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    fast = tempa.compile(_uses_transforms, backend=backend, fullgraph=True)
    for _ in range(2):
        torch.testing.assert_close(fast(x, p), _uses_transforms(x, p))
    assert _counts() == (1, 0, 0)


def test_vmap_of_a_python_function_gets_eager_gradients():
    def f(x):
        return torch.vmap(lambda r: (r * _V).cos() * r.sum())(x.sin()).sum()

    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    fast = tempa.compile(f, fullgraph=True)
    out, (grad,) = _values_and_grads(fast, x)
    want_out, (want_grad,) = _values_and_grads(f, x)
    torch.testing.assert_close((out, grad), (want_out, want_grad))
    assert _counts() == (1, 0, 0)


def test_vmap_of_a_function_writing_its_argument_breaks_by_name():
    def f(x):
        return torch.vmap(lambda r: r.mul_(2))(x.clone())

    with pytest.raises(tempa.GraphBreakError, match="torch.func.vmap writes a tensor it was given"):
        tempa.compile(f, fullgraph=True)(torch.randn(2, 3))
    tempa.reset()
    x = torch.randn(2, 3)
    torch.testing.assert_close(tempa.compile(f)(x), f(x))


@pytest.mark.parametrize("backend", ["eager", "tempa"])
def test_functional_call_is_one_graph_with_the_given_parameters(backend):
    """functional_call writes the given tensors into the module's ``_parameters`` and
    ``_buffers``, calls it, and puts the module's own back: traced, the writes are side
    effects its forward reads, so the call is one graph (it had been a break, run eagerly);
    new tensors each call reuse it. torch.compile: 1 graph, 0 breaks. BatchNorm in training
    mode updates the running statistics it is given, or the module's own."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))
    twin = copy.deepcopy(net)
    own = [*net.parameters(), *net.buffers()]

    def f(module, x, params):
        return torch.func.functional_call(module, params, (x,)).sin().sum()

    fast = tempa.compile(f, fullgraph=True, backend=backend)
    for _ in range(3):
        params = {k: torch.randn_like(v, requires_grad=True) for k, v in net.named_parameters()}
        params_twin = {k: v.detach().clone().requires_grad_() for k, v in params.items()}
        x = torch.randn(5, 3)
        out, want = fast(net, x, params), f(twin, x, params_twin)
        torch.testing.assert_close(out, want)
        out.backward()
        want.backward()
        for k in params:
            torch.testing.assert_close(params[k].grad, params_twin[k].grad)
        assert all(a is b for a, b in zip([*net.parameters(), *net.buffers()], own))
        torch.testing.assert_close(net.state_dict(), twin.state_dict())
    stats = tempa.stats()
    # the NamedMemberAccessor it makes is made anew each call (traced): its memo of
    # submodules, filled by each call, is no outside state to guard
    assert (stats.captures, stats.graph_breaks, stats.recompiles, stats.eager_fallbacks) == \
        (1, 0, 0, 0)
    running = torch.zeros(4)
    fast(net, torch.randn(5, 3), {**params, "1.running_mean": running})
    assert running.abs().sum() > 0 and net[1].running_mean is own[-3]


@torch.library.custom_op("tempa_test::add_into", mutates_args=("x",))
def _add_into(x: torch.Tensor, y: torch.Tensor, alpha: float = 1.0) -> None:
    x.add_(y * alpha)


@_add_into.register_fake
def _(x, y, alpha=1.0):
    return None


@torch.library.custom_op("tempa_test::double_and_dot", mutates_args=("buf",))
def _double_and_dot(x: torch.Tensor, buf: torch.Tensor) -> torch.Tensor:
    buf.mul_(2)
    return (x * buf).sum(0)


@_double_and_dot.register_fake
def _(x, buf):
    return x.new_empty(x.shape[1:])


def _uses_mutating_ops(x, y, buf):
    z = x * 1
    _add_into(z, y, alpha=3.0)
    return z + 1, _double_and_dot(z, buf)


@pytest.mark.parametrize("backend", ["eager", "tempa"])
def test_custom_ops_writing_their_arguments_are_one_graph(backend):
    fast = tempa.compile(_uses_mutating_ops, backend=backend, fullgraph=True)
    for _ in range(2):
        x, y, buf = torch.randn(2, 4), torch.randn(2, 4), torch.randn(2, 4)
        eager_buf = buf.clone()
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)   # no eager fallback of the graph
            got = fast(x, y, buf)
        torch.testing.assert_close(got, _uses_mutating_ops(x, y, eager_buf))
        torch.testing.assert_close(buf, eager_buf)   # the caller's buffer written as in eager
    assert _counts() == (1, 0, 0)
