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


def _emulated_capture(self, call_args):
    with torch.no_grad():
        out = self.fn(*call_args)
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

    class Target(entry.CpuTarget):
        @staticmethod
        def build_training(joint, n_in, single):
            return autograd.build_training(joint, n_in, single,
                                           graph_calls=cudagraphs.training_graphs(info, {}, joint))
    compiled = entry.build(gm, example_inputs, Target, info)
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
    assert (len(fw.recs), len(bw.recs)) == (1, 1)
    assert fw.replays == 5 and bw.replays == 5          # every step, the first one included
    assert not any("still held" in n for n in info.notes), info.notes
    # the backward read the forward's saved buffers in place: it copied only the tangent
    # and the inputs it saves (x), never an activation
    rec = next(iter(bw.recs.values()))
    fw_bufs = {cudagraphs._storage_ptr(o) for o in next(iter(fw.recs.values())).outs}
    assert len(rec.static_in) < len(bw.dyn_idx)
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


def test_a_training_graph_that_mutates_its_inputs_runs_without_graphs_and_says_why():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)).train()
    ref = copy.deepcopy(m)
    compiled = _compiled(m)
    x = torch.randn(6, 8)
    with pytest.warns(RuntimeWarning, match="training runs without CUDA graphs: the training graph mutates"):
        compiled(x).square().sum().backward()
    ref(x).square().sum().backward()
    _assert_grads(m, ref)
    torch.testing.assert_close(m[1].running_mean, ref[1].running_mean)
    assert _info_of(compiled).training_cudagraphs == ()
