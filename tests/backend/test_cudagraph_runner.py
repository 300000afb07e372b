"""The bookkeeping of mode="reduce-overhead" training graphs (runtime/cudagraphs.py), on the CPU.

A CUDA graph replays the kernels it recorded: same input addresses, same output buffers.
Here the recording is emulated: "replay" runs the compiled code again on the recorded
arguments and copies its results into the recorded output buffers, which is what a real
replay leaves in memory. Everything else is the real runner around tempa's compiled C++
forward and backward: static buffers, protection of earlier outputs, the checks that no
buffer autograd still holds is overwritten, the backward reading the forward's buffers in
place. The same paths on real CUDA graphs: tests/backend/test_gpu.py (H200).
"""
from __future__ import annotations

import copy
import ctypes
import warnings

import pytest
import torch
import torch.nn as nn

import tempa
from tempa.backend import autograd, entry
from tempa.backend.runtime import cudagraphs
from tempa.backend.variant_target import CpuTarget

pytestmark = pytest.mark.skipif(cudagraphs._use_count is None, reason="needs torch._C._storage_Use_Count")


def _at_address(t):
    """How a recorded graph sees an argument: an address, a layout, no reference."""
    if not isinstance(t, torch.Tensor):
        return lambda: t
    ptr, shape, stride, dtype = t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype
    span = 1 + sum((n - 1) * s for n, s in zip(shape, stride)) if t.numel() else 0
    nbytes = max(span, 1) * t.element_size()

    def view():
        raw = (ctypes.c_char * nbytes).from_address(ptr)
        return torch.frombuffer(raw, dtype=dtype, count=max(span, 1)).as_strided(shape, stride)
    return view


class _EmulatedGraph:
    def __init__(self, fn, call_args, outs):
        self.fn, self.outs = fn, outs
        self.args = [_at_address(a) for a in call_args]

    def replay(self):
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")           # frombuffer: a non-writable buffer
            new, _ = cudagraphs._flat(self.fn(*[a() for a in self.args]))
        for o, n in zip(self.outs, new):
            if isinstance(o, torch.Tensor):
                version = o._version               # a replay is no ATen op: no version bump
                o.copy_(n)
                cudagraphs._set_versions((o,), (version,))


def _emulated_capture(self, call_args, warm_args):
    """A real capture executes nothing: the inputs the graph writes to (those ``warm_args``
    has copies of) are put back after the run that makes the outputs."""
    written = [(a, a.clone()) for a, w in zip(call_args, warm_args) if a is not w]
    with torch.no_grad():
        out = self.fn(*call_args)
        for a, before in written:      # what a capture leaves: nothing written
            a.copy_(before)
    return _EmulatedGraph(self.fn, call_args, cudagraphs._flat(out)[0]), out


@pytest.fixture(autouse=True)
def emulated_cuda(monkeypatch):
    monkeypatch.setattr(cudagraphs, "_on_gpu", lambda t: True)
    monkeypatch.setattr(cudagraphs, "_cuda_available", lambda: True)
    monkeypatch.setattr(cudagraphs.CudaGraphRunner, "_capture", _emulated_capture)
    tempa.reset()
    yield
    tempa.reset()


def _graphed_backend(gm, example_inputs):
    """tempa's C++ backend with mode="reduce-overhead"'s runners around it."""
    info = entry.BackendInfo()

    class Target(CpuTarget):
        def build_training(self, joint, n_in, single):
            return autograd.build_training(joint, n_in, single,
                                           graph_calls=cudagraphs.training_graphs(info, {}, joint))
    compiled = entry.build(gm, example_inputs, Target(), info)
    return cudagraphs.wrap(compiled, example_inputs, info, {})


def _mlp():
    torch.manual_seed(0)
    # sigmoid's backward reads its output: a saved tensor that is also a user output
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 8), nn.Sigmoid())


def _compiled(model):
    return tempa.compile(model, backend=_graphed_backend)


def _info_of(compiled):
    infos = [e.compiled.tempa_info for e in tempa.entries(compiled)]
    assert len(infos) == 1
    return infos[0]


def _assert_grads(m, ref):
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=lambda m, n=n: f"{n}: {m}")


def test_a_training_loop_replays_forward_and_backward():
    m = _mlp()
    ref = copy.deepcopy(m)
    compiled = _compiled(m)
    opt, opt_r = torch.optim.SGD(m.parameters(), lr=0.1), torch.optim.SGD(ref.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    for _ in range(5):
        x = torch.randn(4, 16, generator=g)
        for model, o in ((compiled, opt), (ref, opt_r)):
            o.zero_grad()
            loss = model(x).square().mean()
            loss.backward()
            o.step()
        torch.testing.assert_close(m(x), ref(x), rtol=1e-5, atol=1e-6)
    info = _info_of(compiled)
    fw, bw = info.training_cudagraphs
    # x was a new tensor at step 2: the forward recorded again, and lends only the buffers
    # of its live recording (memory of the dropped one can hold any tensor, a tangent say)
    assert fw.lent == {cudagraphs._storage_ptr(o) for r in fw.recs.values() for o in r.outs}
    assert (len(fw.recs), len(bw.recs)) == (1, 1)      # the backward reading the old one: dropped
    assert fw.replays == 5 and bw.replays == 5          # every step, the first one included
    assert not any("still held" in n for n in info.notes), info.notes
    # the backward read the forward's saved buffers in place: it copied only the tangent
    # and the inputs it saves (x), never an activation
    rec = next(iter(bw.recs.values()))
    fw_bufs = {cudagraphs._storage_ptr(o) for o in next(iter(fw.recs.values())).outs}
    assert len(rec.static_in) < len(bw.slots)
    assert not fw_bufs & {cudagraphs._storage_ptr(b) for b in rec.static_in.values()}


def _recorded():
    """A model, its eager copy, its compiled wrapper with both graphs recorded, two inputs."""
    m = _mlp()
    ref = copy.deepcopy(m)
    compiled = _compiled(m)
    x1, x2 = torch.randn(4, 16), torch.randn(4, 16)
    compiled(x1).sum().backward()
    m.zero_grad(set_to_none=True)
    return m, ref, compiled, x1, x2


def test_two_forwards_before_one_backward():
    """The second forward would overwrite what the first one saved for its backward: the
    saved tensors are given their own copy first (their version counters kept, or autograd
    would refuse them)."""
    m, ref, compiled, x1, x2 = _recorded()
    (compiled(x1).sum() + compiled(x2).square().sum()).backward()
    (ref(x1).sum() + ref(x2).square().sum()).backward()
    _assert_grads(m, ref)
    fw, bw = _info_of(compiled).training_cudagraphs
    assert fw.replays == 3 and bw.replays >= 2


def test_a_view_of_an_earlier_output_is_never_overwritten():
    """A view cannot be given its own copy: the call that would overwrite it runs without
    its graph, and says so."""
    m, ref, compiled, x1, x2 = _recorded()
    first_rows = compiled(x1)[:2]                 # only a view of the output is kept
    kept = first_rows.detach().clone()
    with pytest.warns(RuntimeWarning, match="forward graph is still held"):
        y2 = compiled(x2)
    torch.testing.assert_close(first_rows.detach(), kept)
    (first_rows.sum() + y2.sum()).backward()
    (ref(x1)[:2].sum() + ref(x2).sum()).backward()
    _assert_grads(m, ref)
    fw, _ = _info_of(compiled).training_cudagraphs
    assert fw.replays == 2                        # the call with the view held ran as is


def test_gradients_accumulate_across_steps():
    """Autograd keeps the first backward's gradient buffers in .grad: later backward calls
    must not replay into them."""
    m = _mlp()
    ref = copy.deepcopy(m)
    compiled = _compiled(m)
    g = torch.Generator().manual_seed(2)
    for _ in range(3):
        x = torch.randn(4, 16, generator=g)
        compiled(x).sum().backward()
        ref(x).sum().backward()
    _assert_grads(m, ref)
    m.zero_grad(set_to_none=True)
    ref.zero_grad(set_to_none=True)
    x = torch.randn(4, 16, generator=g)
    compiled(x).sum().backward()
    ref(x).sum().backward()
    _assert_grads(m, ref)


def test_outputs_of_earlier_calls_keep_their_values():
    m = _mlp()
    compiled = _compiled(m)
    x1, x2 = torch.randn(4, 16), torch.randn(4, 16)
    y1 = compiled(x1)
    kept = y1.detach().clone()
    y2 = compiled(x2)
    torch.testing.assert_close(y1.detach(), kept)
    torch.testing.assert_close(y2, m(x2))
    (y1.sum() + y2.sum()).backward()              # both backward graphs still right
    ref = copy.deepcopy(m)
    ref.zero_grad(set_to_none=True)
    (ref(x1).sum() + ref(x2).sum()).backward()
    _assert_grads(m, ref)


def test_backward_twice_with_retain_graph():
    m = _mlp()
    ref = copy.deepcopy(m)
    compiled = _compiled(m)
    x = torch.randn(4, 16)
    compiled(x).sum().backward()                  # records
    m.zero_grad(set_to_none=True)
    loss = compiled(x).square().sum()
    loss.backward(retain_graph=True)
    loss.backward()
    loss_r = ref(x).square().sum()
    loss_r.backward(retain_graph=True)
    loss_r.backward()
    _assert_grads(m, ref)


def test_batchnorm_training_replays_with_its_running_statistics_written_in_place():
    """The forward writes BatchNorm's running statistics: it reads them in place, so the
    writes reach the module's buffers, once per step (the recording step too)."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)).train()
    ref = copy.deepcopy(m)
    compiled = _compiled(m)
    g = torch.Generator().manual_seed(3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)    # no "without CUDA graphs"
        for _ in range(3):
            x = torch.randn(6, 8, generator=g)
            compiled(x).square().sum().backward()
            ref(x).square().sum().backward()
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                torch.testing.assert_close(getattr(m[1], name), getattr(ref[1], name), msg=name)
    for p, q in zip(m.parameters(), ref.parameters()):      # three steps' sums: rounding
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
    fw, bw = _info_of(compiled).training_cudagraphs
    assert fw.replays == 3 and bw.replays == 3
    rec = next(iter(fw.recs.values()))
    in_place = {id(t) for _, t in rec.in_place}
    assert {id(m[1].running_mean), id(m[1].running_var), id(m[1].num_batches_tracked)} <= in_place
    assert len(rec.static_in) == 1                 # x alone: a new tensor every step


class _Scaled(nn.Module):
    """A parameter, a buffer, and optionally a buffer the forward writes to."""

    def __init__(self, counts):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("scale", torch.full((8,), 2.0))
        self.register_buffer("calls", torch.zeros(()))
        self.counts = counts

    def forward(self, x):
        if self.counts:
            self.calls.add_(1)
        return self.lin(x) * self.scale + self.calls


def _inference_runner(compiled):
    runner = tempa.entries(compiled)[0].compiled.tempa_cudagraphs
    assert runner.disabled is None, runner.disabled
    return runner


def test_buffers_and_an_input_passed_again_are_read_in_place_not_copied():
    """Nothing is copied while every call passes the recorded tensors; a slot that then holds
    another tensor is copied from that call on (recorded once more, not per call)."""
    m = _Scaled(counts=False)
    compiled = _compiled(m)
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), m(x))
        runner = _inference_runner(compiled)
        (rec,) = runner.recs.values()
        assert rec.static_in == {} and runner.replays == 3
        m.scale.mul_(3)                               # read in place: the replay sees it
        x.add_(1)
        torch.testing.assert_close(compiled(x), m(x))
        records = []
        for _ in range(3):
            x2 = torch.randn(4, 8)
            torch.testing.assert_close(compiled(x2), m(x2))
            records.append(next(iter(runner.recs.values())))
    assert records[0] is records[1] is records[2]
    assert len(runner.recs) == 1 and list(records[0].static_in) == [runner.slots[0]]
    assert runner.copied == (runner.slots[0],) and runner.replays == 7


def test_an_inference_graph_writing_a_buffer_replays_and_writes_once_per_call():
    m = _Scaled(counts=True)
    ref = copy.deepcopy(m)
    compiled = _compiled(m)
    x = torch.randn(4, 8)
    with torch.no_grad():
        for _ in range(4):
            v0, r0 = m.calls._version, ref.calls._version
            torch.testing.assert_close(compiled(x), ref(x))
            assert m.calls.item() == ref.calls.item()
            assert m.calls._version - v0 == ref.calls._version - r0    # bumped as eager does
    runner = _inference_runner(compiled)
    assert runner.replays == 4 and runner.written


def test_a_written_input_that_is_another_tensor_runs_without_its_graph_and_says_why():
    def bump(x, y):
        x.add_(1)
        return x * y
    compiled = tempa.compile(bump, backend=_graphed_backend)
    y = torch.randn(4)
    with torch.no_grad():
        x = torch.randn(4)
        x0 = x.clone()
        torch.testing.assert_close(compiled(x, y), (x0 + 1) * y)
        torch.testing.assert_close(compiled(x, y), (x0 + 2) * y)
        x2 = torch.randn(4)
        x20 = x2.clone()
        with pytest.warns(RuntimeWarning, match="an input the graph writes to is another tensor"):
            out = compiled(x2, y)
    torch.testing.assert_close(out, (x20 + 1) * y)
    torch.testing.assert_close(x2, x20 + 1)
    torch.testing.assert_close(x, x0 + 2)


def test_a_tensor_resized_in_place_is_not_taken_for_the_recorded_one_under_symbolic_sizes():
    """With symbolic sizes the guards let another size through: the same object at the same
    address, resized in place, is then a changed slot (with static sizes the guards refuse
    it before the runner sees it)."""
    t = torch.randn(8)
    rec = cudagraphs._Recording()
    rec.read_in_place([(0, t)], check_layout=True)
    assert rec.same_in_place([t])
    t.resize_(4)                                  # shrinks in place: same address
    assert not rec.same_in_place([t]) and rec.changed_slots([t]) == [0]
    other = torch.randn(8)
    plain = cudagraphs._Recording()
    plain.read_in_place([(0, other)])
    assert plain.same_in_place([other]) and not plain.same_in_place([torch.randn(8)])
    assert plain.same_in_place([other]) and plain.changed_slots([other[:]]) == []   # a view: kept


def test_an_input_returned_by_a_replay_is_that_input():
    """Eager returns the argument itself; a replay too, when the argument is read in place
    (a view of it is a view of the caller's tensor, never of a static copy)."""
    def f(x, y):
        return x, x * y, x[1:]
    compiled = tempa.compile(f, backend=_graphed_backend)
    x, y = torch.randn(4), torch.randn(4)
    with torch.no_grad():
        for _ in range(3):
            same, prod, tail = compiled(x, y)
            assert same is x
            torch.testing.assert_close(prod, x * y)
            assert tail.data_ptr() == x[1:].data_ptr()
            x.add_(1)                             # read in place: the next replay sees it
            torch.testing.assert_close(tail, x[1:])
    runner = _inference_runner(compiled)
    assert runner.replays == 3


def test_a_forward_recorded_again_drops_the_backward_recordings_that_read_its_old_buffers():
    m = _mlp()
    ref = copy.deepcopy(m)
    compiled = _compiled(m)
    x = torch.randn(4, 16)
    for step in range(4):
        if step == 2:
            x = torch.randn(4, 16)                # the forward copies x from now on
        m.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        compiled(x).square().mean().backward()
        ref(x).square().mean().backward()
    _assert_grads(m, ref)
    fw, bw = _info_of(compiled).training_cudagraphs
    assert fw.replays == 4 and bw.replays == 4
    assert (len(fw.recs), len(bw.recs)) == (1, 1)
