"""The CPU backend against eager: values, gradients, fusion, caches, faults, threads."""
import os
import subprocess
import sys
import threading
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from tempa import config, counters
from tempa.backend import tempa_backend

from .helpers import close, compile_fn, graph_of


def check(fn, *inputs, kernels=None, max_kernels=None, fallbacks_ok=True):
    c = compile_fn(fn, *inputs)
    ref = fn(*[t.clone() for t in inputs])
    out = c(*inputs)
    assert close(out, ref), (out, ref)
    info = c.tempa_info
    assert info.fallback_reason is None, info.fallback_reason
    if kernels is not None:
        assert info.kernel_count == kernels, info.fusion_report
    if max_kernels is not None:
        assert info.kernel_count <= max_kernels, info.fusion_report
    if not fallbacks_ok:
        assert not info.aten_fallbacks, info.aten_fallbacks
    return c


# --- fusion is real ---------------------------------------------------------------------

def test_pointwise_chain_is_one_kernel():
    c = check(lambda x: torch.relu(x * 2 + 1), torch.randn(37, 19), kernels=1, fallbacks_ok=False)
    assert "omp simd" in c.tempa_info.cpp_source


def test_layer_norm_is_one_kernel():
    w, b = torch.randn(64), torch.randn(64)
    check(lambda x: F.layer_norm(x, (64,), w, b), torch.randn(16, 64), kernels=1, fallbacks_ok=False)


def test_softmax_at_most_two_kernels():
    check(lambda x: torch.softmax(x, -1), torch.randn(12, 50), max_kernels=2, fallbacks_ok=False)
    check(lambda x: F.log_softmax(x, 1), torch.randn(4, 7, 5), max_kernels=2, fallbacks_ok=False)


@pytest.mark.parametrize("hits", [1, 2, 3])
def test_short_scatter_add_is_pointwise(hits):
    """A scatter_add whose index is short along dim is a pointwise (no ATen fallback), with
    repeated targets in a row summed as eager does."""
    torch.manual_seed(0)
    idx = torch.randint(0, 50, (37, hits))
    idx[0, :] = 3                                   # every hit of row 0 lands on column 3
    check(lambda b, i, s: torch.scatter_add(b, 1, i, s) * 2, torch.randn(37, 50), idx,
          torch.randn(37, hits + 1), kernels=1, fallbacks_ok=False)


def test_cross_entropy_backward_has_no_scatter_fallback():
    import tempa
    torch.manual_seed(0)
    x = torch.randn(16, 300, requires_grad=True)
    t = torch.randint(0, 300, (16,))
    t[3] = -1                                       # an ignored row
    loss_fn = lambda x, t: F.cross_entropy(x, t, ignore_index=-1)   # noqa: E731
    tempa.reset()
    c = tempa.compile(loss_fn)
    loss = c(x, t)
    loss.backward()
    gx, x.grad = x.grad, None
    loss_fn(x, t).backward()
    torch.testing.assert_close(gx, x.grad)
    info = tempa.entries(c)[0].compiled.tempa_info
    assert info.backward is not None and not info.backward.aten_fallbacks, info.backward.aten_fallbacks


def test_saved_piece_of_a_computed_value_keeps_its_traced_layout():
    """A split piece (storage offset, row stride of the whole) of an inlined pointwise value,
    saved for backward: the backward reads it with the traced strides, so the forward must
    hand it out in them. It was handed out contiguous: gradients off by ~10."""
    import tempa

    def f(x):
        a, b, c = (x * 2 + 1).split(8, dim=1)
        return a * torch.sin(b) + c
    torch.manual_seed(0)
    x = torch.randn(5, 24, requires_grad=True)
    tempa.reset()
    out = tempa.compile(f)(x)
    out.backward(torch.ones_like(out))
    got, x.grad = x.grad, None
    f(x).backward(torch.ones_like(out))
    torch.testing.assert_close(got, x.grad)


def test_softmax_computes_each_exp_once():
    # the sum's loop keeps exp(x - max) in the output row and the output loop reads it back
    # (codegen/reuse.py); masked rows (exp(-inf) = 0) and a non-multiple of 8 row length
    mask = torch.tril(torch.ones(13, 13, dtype=torch.bool))
    for fn in (lambda x: torch.softmax(x, -1),
               lambda x: torch.softmax(x.masked_fill(~mask, float("-inf")), -1),
               lambda x: torch.softmax(x, -1) * x):          # the output is read again
        c = check(fn, torch.randn(3, 13, 13), fallbacks_ok=False)
        assert c.tempa_info.cpp_source.count("m::exp(") == 1, c.tempa_info.cpp_source
    # log_softmax's output loop has no exp(x - max) to reuse: nothing stored, nothing read
    c = check(lambda x: F.log_softmax(x, -1), torch.randn(5, 21), fallbacks_ok=False)
    assert "kept" not in c.tempa_info.cpp_source, c.tempa_info.cpp_source


def test_mlp_is_one_cpp_call():
    m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    x = torch.randn(8, 32)
    with torch.no_grad():
        c = tempa_backend(graph_of(m), [x])
        assert close(c(x), m(x))
    info = c.tempa_info.inference
    assert info.segment_count == 1 and not info.extern_calls and not info.aten_fallbacks
    assert "not fused" in c.tempa_info.fusion_report


# --- correctness on many graphs -----------------------------------------------------------

def test_views_permutes_cat_slicing():
    def f(x, y):
        a = x.permute(1, 0, 2).reshape(6, -1)
        b = torch.cat([a, y.t()], dim=1)
        c = b[:, 1:7:2] * b[:, -3:]
        return c.transpose(0, 1).contiguous(), b[None, ..., 2:].sum(-1), x.flatten()[::3]
    check(f, torch.randn(2, 6, 5), torch.randn(4, 6))


def test_reductions_and_compares():
    def f(x):
        return (x.amax(1), x.amin(0, keepdim=True), x.mean(), x.var(1), x.sum(0) > 0,
                x.argmax(1), torch.where(x > 0, x, -x), x.masked_fill(x < 0, 0.5), x.std(0))
    check(f, torch.randn(9, 13))


def test_embedding_and_gather():
    w = torch.randn(20, 8)
    idx = torch.tensor([[1, 5, 19], [0, 3, 3]])

    def f(i, t):
        return F.embedding(i, w) * 2, torch.gather(t, 1, i.clamp(max=3)), t[:, i[0].clamp(max=3)]
    check(f, idx, torch.randn(2, 4))


def test_index_out_of_range_raises():
    w = torch.randn(5, 3)
    c = compile_fn(lambda i: F.embedding(i, w), torch.tensor([1, 2]))
    with pytest.raises(IndexError):
        c(torch.tensor([1, 7]))


def test_int_and_mixed_dtypes():
    def f(x, i):
        return x * i, i // 3, i % 4, (i * 2).to(torch.float32) / 3, x.to(torch.float64) + 1
    check(f, torch.randn(4, 5), torch.randint(-9, 9, (4, 5)))


def test_attention_block_forward_backward():
    torch.manual_seed(0)
    attn = nn.MultiheadAttention(32, 4, batch_first=True)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln = nn.LayerNorm(32)
            self.q, self.k, self.v = nn.Linear(32, 32), nn.Linear(32, 32), nn.Linear(32, 32)
            self.o = nn.Linear(32, 32)

        def forward(self, x):
            h = self.ln(x)
            B, T, C = h.shape
            q = self.q(h).view(B, T, 4, 8).transpose(1, 2)
            k = self.k(h).view(B, T, 4, 8).transpose(1, 2)
            v = self.v(h).view(B, T, 4, 8).transpose(1, 2)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return x + self.o(a.transpose(1, 2).reshape(B, T, C))
    _check_train(Block(), torch.randn(2, 6, 32))


def _check_train(m, *xs, atol=1e-5):
    gm = graph_of(m)
    c = tempa_backend(gm, list(xs))
    out = c(*xs)
    ref = m(*xs)
    assert close(out, ref, atol=atol), (out - ref).abs().max()
    assert out.grad_fn is not None
    (out * torch.arange(out.numel()).view(out.shape).float().sin()).sum().backward()
    g = [p.grad.clone() for p in m.parameters()]
    for p in m.parameters():
        p.grad = None
    (ref * torch.arange(ref.numel()).view(ref.shape).float().sin()).sum().backward()
    for a, p in zip(g, m.parameters()):
        assert close(a, p.grad, atol=1e-4, rtol=1e-4), (a - p.grad).abs().max()
    return c


def test_mlp_grads_and_no_grad():
    m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    c = _check_train(m, torch.randn(8, 32))
    with torch.no_grad():
        assert c(torch.randn(8, 32)).grad_fn is None
    assert c.tempa_info.backward is not None and c.tempa_info.backward.kernel_count >= 1


def test_gpt_style_block():
    torch.manual_seed(0)

    class GPTBlock(nn.Module):
        def __init__(self, C=32, H=4):
            super().__init__()
            self.H = H
            self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
            self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
            self.fc, self.out = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
            self.emb = nn.Embedding(50, C)
            self.register_buffer("mask", torch.ones(8, 8).tril() == 0)

        def forward(self, idx):
            x = self.emb(idx)
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q = q.view(B, T, self.H, C // self.H).transpose(1, 2)
            k = k.view(B, T, self.H, C // self.H).transpose(1, 2)
            v = v.view(B, T, self.H, C // self.H).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / (C // self.H) ** 0.5)
            att = att.masked_fill(self.mask, float("-inf")).softmax(-1)
            y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
            x = x + self.proj(y)
            return x + self.out(F.gelu(self.fc(self.ln2(x))))
    m = GPTBlock()
    _check_train(m, torch.randint(0, 50, (2, 8)))


def test_conv_bn_relu_eval_and_train():
    torch.manual_seed(0)

    class CBR(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(3, 8, 3, padding=1)
            self.bn = nn.BatchNorm2d(8)

        def forward(self, x):
            bn = self.bn
            y = F.batch_norm(self.conv(x), bn.running_mean, bn.running_var, bn.weight, bn.bias,
                             self.training, 0.1, 1e-5)
            return torch.relu(y)
    m = CBR()
    x = torch.randn(2, 3, 8, 8)
    m_ref = CBR()
    m_ref.load_state_dict(m.state_dict())
    c = tempa_backend(graph_of(m), [x])
    out = c(x)   # training mode: running stats are updated in place, as eager does
    ref = m_ref(x)
    assert close(out, ref, atol=1e-5)
    assert close(m.bn.running_mean, m_ref.bn.running_mean)
    assert close(m.bn.running_var, m_ref.bn.running_var)
    _check_train(m, x)   # gradients (this also runs eager once more on m)
    m.eval()
    m_ref.eval()
    with torch.no_grad():
        c2 = tempa_backend(graph_of(m), [x])
        assert close(c2(x), m(x))


def test_batchnorm_training_updates_running_stats_no_grad():
    rm, rv = torch.zeros(6), torch.ones(6)
    rm2, rv2 = rm.clone(), rv.clone()

    def f(x, rm, rv):
        return F.batch_norm(x, rm, rv, None, None, True, 0.1, 1e-5)
    x = torch.randn(4, 6, 3)
    with torch.no_grad():
        c = compile_fn(f, x, rm, rv)
        out = c(x, rm, rv)
        ref = f(x, rm2, rv2)
    assert close(out, ref) and close(rm, rm2) and close(rv, rv2)


def test_inplace_input_mutation_visible():
    def f(x, y):
        x.add_(1)
        y.narrow(0, 1, 2).fill_(7.0)
        return x * 2
    x, y = torch.randn(5), torch.randn(5)
    xr, yr = x.clone(), y.clone()
    c = compile_fn(f, x.clone(), y.clone())
    out = c(x, y)
    ref = f(xr, yr)
    assert close(out, ref) and close(x, xr) and close(y, yr)


def test_no_grad_block_inside_graph():
    """set_grad_enabled nodes (what capture emits for ``with torch.no_grad():``) are honoured."""
    import torch.fx as fx
    root = nn.Module()
    root.w = nn.Parameter(torch.randn(4, 4))
    g = fx.Graph()
    x = g.placeholder("x")
    w = g.get_attr("w")
    g.call_function(torch._C._set_grad_enabled, (False,))
    s = g.call_function(torch.sum, (g.call_function(torch.matmul, (x, w)),))
    g.call_function(torch._C._set_grad_enabled, (True,))
    out = g.call_function(torch.mul, (g.call_function(torch.matmul, (x, w)), s))
    g.output(out)
    gm = fx.GraphModule(root, g)
    xv = torch.randn(3, 4)
    c = tempa_backend(gm, [xv])
    c(xv).sum().backward()
    got = root.w.grad.clone()
    root.w.grad = None
    with torch.no_grad():
        sv = (xv @ root.w).sum()
    ((xv @ root.w) * sv).sum().backward()
    assert close(got, root.w.grad, atol=1e-4)


# --- caches and faults --------------------------------------------------------------------

_CHILD = r"""
import torch, torch.nn.functional as F
import torch.fx as fx
from tempa import counters
from tempa.backend import tempa_backend
def f(x): return torch.tanh(x * 3 + 0.25).sum(1)
c = tempa_backend(fx.symbolic_trace(f), [torch.randn(7, 9)])
x = torch.randn(7, 9)
assert torch.allclose(c(x), f(x), atol=1e-5)
print(counters.snapshot().gcc_runs, counters.snapshot().disk_cache_hits)
"""


def _child(cache_dir):
    env = dict(os.environ, TEMPA_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    gcc, hits = map(int, out.stdout.split())
    return gcc, hits


def test_disk_cache_second_process_skips_gcc(tmp_path):
    assert _child(str(tmp_path)) == (1, 0)
    assert _child(str(tmp_path)) == (0, 1)
    # corrupt every artifact: it must be rebuilt, never loaded
    for root, _, files in os.walk(tmp_path):
        for fn in files:
            if fn.endswith(".so"):
                with open(os.path.join(root, fn), "r+b") as fh:
                    fh.truncate(100)
    assert _child(str(tmp_path)) == (1, 0)
    assert _child(str(tmp_path)) == (0, 1)


def test_missing_gcc_warns_once_and_stays_correct():
    old = config.cxx
    config.cxx = "/nonexistent/g++"
    try:
        from tempa.backend import entry
        entry._warned.clear()
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            fs = [lambda x: torch.sigmoid(x) * 5.5, lambda x: torch.cos(x) - 0.125]
            for f in fs:
                x = torch.randn(6, 3)
                c = compile_fn(f, x)
                assert close(c(x), f(x))
                assert c.tempa_info.fallback_reason and "nonexistent" in c.tempa_info.fallback_reason
        msgs = [str(w.message) for w in rec if "tempa" in str(w.message)]
        assert len(msgs) == 1 and "/nonexistent/g++" in msgs[0], msgs
    finally:
        config.cxx = old


def test_two_threads_one_callable():
    m = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    xs = [torch.randn(5, 16) for _ in range(2)]
    with torch.no_grad():
        c = tempa_backend(graph_of(m), [xs[0]])
        refs = [m(x) for x in xs]
    errors = []

    def worker(i):
        with torch.no_grad():
            for _ in range(300):
                if not close(c(xs[i]), refs[i]):
                    errors.append(i)
                    return
    ts = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors


def test_code_is_logged_and_counted(caplog):
    import logging
    before = counters.snapshot()
    with caplog.at_level(logging.INFO, logger="tempa.code"):
        c = compile_fn(lambda x: (x * x).exp() + 3.25, torch.randn(3, 3))
    assert any("extern \"C\"" in r.getMessage() for r in caplog.records)
    after = counters.snapshot()
    # graphs are counted by the frontend (tempa/context.py), once per graph it hands a backend
    assert after.graphs_compiled == before.graphs_compiled
    assert after.kernels_compiled == before.kernels_compiled + c.tempa_info.kernel_count >= 1


def test_kernel_counters_agree_with_tempa_info():
    # training: forward and backward kernels are both counted, in stats and in tempa_info
    import tempa
    from tests.models import zoo
    tempa.reset()
    model = zoo.make("mlp_seed").model
    before = counters.snapshot()
    fast = tempa.compile(model)
    fast(torch.randn(8, 32)).sum().backward()
    with torch.no_grad():
        fast(torch.randn(8, 32))
    infos = [e.compiled.tempa_info for e in tempa.entries(fast)]
    after = counters.snapshot()
    assert after.graphs_compiled - before.graphs_compiled == len(infos) == 2   # grad mode is guarded
    assert after.kernels_compiled - before.kernels_compiled == sum(i.kernel_count for i in infos)
    train = [i for i in infos if i.backward is not None][0]
    assert train.kernel_count == train.forward.kernel_count + train.backward.kernel_count
    tempa.reset()


def test_cast_naming_the_same_device_is_a_kernel_not_a_fallback():
    """autocast's casts name the device (``_to_copy(x, dtype=..., device=cuda:0)``); on the
    tensor's own device that is a cast, lowered like any other (on CUDA these were 150 ATen
    copy kernels in GPT training's backward)."""
    def f(x):
        return x.to(device="cpu", dtype=torch.float64) * 2
    x = torch.randn(8)
    fn = compile_fn(f, x)
    assert close(fn(x)[0] if isinstance(fn(x), tuple) else fn(x), f(x))
    info = fn.tempa_info
    assert not info.aten_fallbacks and info.kernel_count == 1, info
