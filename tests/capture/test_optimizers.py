"""Compiled optimizer steps and training steps (issue 16, item 3).

Each test compares parameters with an eager twin after 10 steps and checks the path with
tempa.stats(). What torch.compile does on the same code (torch 2.13, CompileCounter):
`torch.compile(opt.step)` is 1-2 frames and 1 break (the graph_break() calls of
_use_grad_for_differentiable), and fails under fullgraph=True; a train-step function
(forward, backward(), step(), zero_grad()) is 3 frames and 4 breaks over 10 steps. tempa:
the first step creates the optimizer state inside its graph (the writes are replayed after
it), the second recompiles once for the state it reads, every later step reuses that
graph: 0 breaks, also under fullgraph=True; the train step is 4 captures and 3 breaks,
then nothing new.
"""
import pytest
import torch
import torch.nn as nn

import tempa
from tests.capture.optimizer_steps import step_twins
from tests.capture.paths import counts

OPTIMIZERS = {
    "sgd": lambda p, fe: torch.optim.SGD(p, lr=0.1, foreach=fe),
    "sgd-momentum": lambda p, fe: torch.optim.SGD(p, lr=0.1, momentum=0.9, foreach=fe),
    "sgd-nesterov": lambda p, fe: torch.optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True,
                                                  weight_decay=0.01, foreach=fe),
    "adam": lambda p, fe: torch.optim.Adam(p, lr=0.01, foreach=fe),
    "adamw": lambda p, fe: torch.optim.AdamW(p, lr=0.01, foreach=fe),
    "rmsprop": lambda p, fe: torch.optim.RMSprop(p, lr=0.01, foreach=fe),
}
# Adam's bias corrections are computed on the step tensor while compiling (one graph for
# every step), in float32, where eager computes them in Python floats.
ATOL = {"adam": 1e-6, "adamw": 1e-6}


def _model_and_optimizer(kind, foreach):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    return model, OPTIMIZERS[kind](model.parameters(), foreach)


def _path():
    s = tempa.stats()
    return s.captures, s.graph_breaks, s.recompiles


def _assert_same_parameters(a, b, kind, kernels=False):
    # kernels (the tempa backend) round as compiled code does: a multiply-add fused or not
    # differs from ATen's in the last bit
    rtol, atol = (1e-6, 1e-6) if kernels else (0, ATOL.get(kind, 0))
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(q, p, rtol=rtol, atol=atol)


@pytest.mark.parametrize("foreach", [False, True], ids=["for-loop", "foreach"])
@pytest.mark.parametrize("kind", list(OPTIMIZERS))
def test_compiled_step_matches_eager_in_one_graph_per_step(kind, foreach):
    eager_model, eager_opt = _model_and_optimizer(kind, foreach)
    model, opt = _model_and_optimizer(kind, foreach)
    step = tempa.compile(opt.step, backend="eager")
    x = torch.randn(16, 4)
    new_captures = []
    for _ in range(10):
        eager_model(x).pow(2).mean().backward()
        eager_opt.step()
        eager_opt.zero_grad()
        model(x).pow(2).mean().backward()
        before = tempa.stats().captures
        step()
        new_captures.append(tempa.stats().captures - before)
        opt.zero_grad()
    _assert_same_parameters(eager_model, model, kind)
    # step 1 creates the state (writes into opt.state, replayed after the graph); step 2
    # reads the state it made: one recompile, then every step reuses that graph. Plain SGD
    # keeps no state.
    stateless = kind == "sgd"
    assert new_captures == ([1] if stateless else [1, 1]) + [0] * (9 if stateless else 8)
    assert tempa.stats().recompiles == (0 if stateless else 1)
    assert (tempa.stats().graph_breaks, tempa.stats().eager_fallbacks) == (0, 0)
    # the state the steps left is eager's
    for p, q in zip(eager_model.parameters(), model.parameters()):
        for key, value in eager_opt.state[p].items():
            torch.testing.assert_close(opt.state[q][key], value, rtol=0,
                                       atol=ATOL.get(kind, 0), check_dtype=False)


@pytest.mark.parametrize("kind", ["sgd-momentum", "adam", "rmsprop"])
def test_fullgraph_step_once_the_state_exists(kind):
    eager_model, eager_opt = _model_and_optimizer(kind, True)
    model, opt = _model_and_optimizer(kind, True)
    x = torch.randn(16, 4)
    step_twins(((eager_model, eager_opt, eager_opt.step), (model, opt, opt.step)), x, 1,
               loss=torch.sum)                                # the warm-up creates the state
    step = tempa.compile(opt.step, fullgraph=True)           # the tempa backend
    step_twins(((eager_model, eager_opt, eager_opt.step), (model, opt, step)), x, 10,
               loss=torch.sum)
    _assert_same_parameters(eager_model, model, kind, kernels=True)
    assert _path() == (1, 0, 0)
    # the parameters' in-place updates (under the step's no_grad) are kernels, not ATen calls
    assert tempa.stats().aten_fallbacks == 0 and tempa.stats().kernels_compiled > 0


def test_fullgraph_from_the_first_step():
    # the first step creates the optimizer state: its writes are recorded and replayed
    # after the graph, so even that step is one graph under fullgraph=True
    eager_model, eager_opt = _model_and_optimizer("adam", False)
    model, opt = _model_and_optimizer("adam", False)
    step = tempa.compile(opt.step, fullgraph=True)
    x = torch.randn(16, 4)
    step_twins(((eager_model, eager_opt, eager_opt.step), (model, opt, step)), x, 5,
               loss=torch.sum)
    _assert_same_parameters(eager_model, model, "adam")
    assert _path() == (2, 0, 1)   # step 1 (state made), step 2 on (state read)


def test_a_gradient_that_becomes_none_or_is_kept_is_seen():
    # p.grad is an input read on every call: its absence is guarded, and zero_grad's
    # set_to_none=False keeps the same tensor, updated in place by backward
    eager_model, eager_opt = _model_and_optimizer("sgd-momentum", False)
    model, opt = _model_and_optimizer("sgd-momentum", False)
    step = tempa.compile(opt.step, backend="eager")
    x = torch.randn(16, 4)
    for i in range(6):
        for m, o, run in ((eager_model, eager_opt, eager_opt.step), (model, opt, step)):
            m[2].weight.requires_grad_(i < 3)   # frozen from step 4: its grad is None
            m(x).sum().backward()
            run()
            o.zero_grad(set_to_none=i >= 3)
    _assert_same_parameters(eager_model, model, "sgd-momentum")
    assert tempa.stats().recompiles >= 1


@pytest.mark.parametrize("kind", ["sgd-momentum", "adam"])
def test_training_step_function(kind):
    def train_step(model, opt, x, y):
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    eager_model, eager_opt = _model_and_optimizer(kind, None)
    model, opt = _model_and_optimizer(kind, None)
    fast = tempa.compile(train_step)
    x, y = torch.randn(16, 4), torch.randn(16, 2)
    for i in range(10):
        expected = train_step(eager_model, eager_opt, x, y)
        torch.testing.assert_close(fast(model, opt, x, y), expected)
        if i == 2:
            settled = _path()
    # 3 breaks (backward, zero_grad's never-compile, ...) at the first call; the piece
    # holding step() captures the state's creation on step 1 and recaptures once on step 2,
    # when it reads the state it made; nothing new after that
    assert _path() == settled == (4, 3, 1)
    for p, q in zip(eager_model.parameters(), model.parameters()):   # fused kernels round
        torch.testing.assert_close(q, p, rtol=0, atol=1e-6)                # differently


def test_tensor_keys_of_a_callers_dict():
    # eager hashes tensors by identity: `p in state`, state[p] and state.get(p) find the
    # parameter, a tensor computed inside is in no caller's dict
    p, q = nn.Parameter(torch.randn(3)), nn.Parameter(torch.randn(3))

    class Holder:
        pass
    h = Holder()
    h.p, h.q, h.state = p, q, {p: torch.ones(3)}

    def f(x):
        found = (h.p in h.state, h.q in h.state, (x * 2) in h.state)
        return found, x + h.state[h.p], h.state.get(h.q), h.state.get(h.p) * 2

    x = torch.zeros(3)
    out = tempa.compile(f, fullgraph=True, backend="eager")(x)
    assert out[0] == (True, False, False) and out[2] is None
    torch.testing.assert_close(out[1], torch.ones(3))
    torch.testing.assert_close(out[3], torch.full((3,), 2.0))
    assert _path() == (1, 0, 0)


def test_addcdiv_and_addcmul_with_a_tensor_value():
    def f(p, a, b, value, ps):
        p = p.clone()
        p.addcdiv_(a, b, value=-value)
        q = torch.addcmul(p, a, b, value=value)
        copies = [t.clone() for t in ps]
        torch._foreach_addcdiv_(copies, [a, a], [b, b], torch.stack([value, -value]))
        return p, q, copies

    args = (torch.randn(5), torch.randn(5), torch.rand(5) + 1, torch.tensor(0.3),
            [torch.randn(5), torch.randn(5)])
    torch.testing.assert_close(tempa.compile(f, fullgraph=True)(*args), f(*args))
    assert _path() == (1, 0, 0)


def test_profiler_label_inside_compiled_code():
    def f(x):
        with torch.autograd.profiler.record_function("my-region"):
            return x.sin() + 1

    x = torch.randn(4)
    torch.testing.assert_close(tempa.compile(f, fullgraph=True)(x), f(x))
    assert _path() == (1, 0, 0)


@pytest.mark.parametrize("kind", ["adam", "adamw"])
@pytest.mark.parametrize("foreach", [False, True], ids=["for-loop", "foreach"])
def test_bias_corrections_in_double_as_eager(kind, foreach):
    # eager's _get_value(step) is a Python float, so 1 - beta2 ** step is double; in
    # float32 1 - 0.999 ** 1 is off by 1.3e-5 relative, and the first update with it
    # missed torch.allclose against eager (bug compiled_optimizer_step_raises)
    eager_model, eager_opt = _model_and_optimizer(kind, foreach)
    model, opt = _model_and_optimizer(kind, foreach)
    step = tempa.compile(opt.step, backend="eager")
    x = torch.randn(16, 4)
    for _ in range(3):
        step_twins(((eager_model, eager_opt, eager_opt.step), (model, opt, step)), x, 1)
        for p, q in zip(eager_model.parameters(), model.parameters()):
            torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-8)
    assert counts() == (2, 0, 1, 0)


@pytest.mark.parametrize("kind", ["sgd-momentum", "adam"])
def test_step_after_torch_compile_patched_the_optimizers(kind, monkeypatch):
    # torch.compile's first call in a process wraps every optimizer class's _init_group in
    # its own disable (Dynamo's TorchPatcher, for its tracer); a tempa step compiled after
    # that must trace it as it would otherwise, not break around it
    import torch._dynamo
    cls = type(OPTIMIZERS[kind]([nn.Parameter(torch.zeros(1))], False))
    monkeypatch.setattr(cls, "_init_group", torch._dynamo.disable(cls._init_group))
    eager_model, eager_opt = _model_and_optimizer(kind, False)
    model, opt = _model_and_optimizer(kind, False)
    step = tempa.compile(opt.step, backend="eager")
    x = torch.randn(16, 4)
    for _ in range(4):
        for m, s in ((eager_model, eager_opt.step), (model, step)):
            m(x).pow(2).mean().backward()
            s()
        eager_opt.zero_grad()
        opt.zero_grad()
    _assert_same_parameters(eager_model, model, kind)
    assert _path() == (2, 0, 1), tempa.stats()


def test_explain_of_a_compiled_optimizer_step():
    # explain() of a compiled bound method calls its function with the object first
    model, opt = _model_and_optimizer("sgd-momentum", False)
    model(torch.randn(16, 4)).pow(2).mean().backward()
    out = tempa.explain(tempa.compile(opt.step))()
    assert (out.graph_count, out.graph_break_count, out.eager_fallbacks) == (1, 0, []), str(out)
    out = tempa.explain(opt.step)()
    assert (out.graph_count, out.graph_break_count, out.eager_fallbacks) == (1, 0, []), str(out)
