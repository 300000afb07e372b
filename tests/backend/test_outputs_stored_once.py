"""A value the graph returns and also reads is computed once, on the CPU (lower/lowerings.py
_outputs_read_inside, _reshaped_source_reads_it): stored where it is computed, and read
from there by the graph's other users, rather than computed again in each of them and once
more for the output. Checked on the generated C++ with the option off and on (the values
are eager's either way)."""
import pytest
import torch
import torch.nn.functional as F

import tempa
from tempa.backend import compile_graph

from .helpers import compile_fn


@pytest.fixture(params=[True, False], ids=["stored_once", "off"])
def stored_once(request, monkeypatch):
    monkeypatch.setattr(compile_graph.CppTarget, "outputs_stored_once", request.param)
    return request.param


def test_a_returned_value_a_softmax_reads_is_computed_once(stored_once):
    def f(x):
        s = torch.sin(x) * 2
        return s, torch.softmax(s, -1)
    x = torch.randn(64, 256)
    with torch.no_grad():
        c = compile_fn(f, x)
        for got, ref in zip(c(x), f(x)):
            torch.testing.assert_close(got, ref)
    sins = c.tempa_info.cpp_source.count("m::sin(")
    assert sins == 1 if stored_once else sins > 1, c.tempa_info.cpp_source


def test_a_saved_gelu_output_is_the_memory_its_linear_reads(stored_once):
    """A GELU between two Linears of a 3-D input, trained: the second Linear reads the GELU
    output's 2-D view, made memory for the GEMM; the saved 3-D value is that memory, not a
    second buffer computed again (in DistilBERT's forward, by a kernel at its end: an erf
    per element more)."""
    tempa.reset()
    torch.manual_seed(0)
    l1, l2 = torch.nn.Linear(256, 1024), torch.nn.Linear(1024, 256)

    def f(x):
        return l2(F.gelu(l1(x))).square().mean()
    x = torch.randn(2, 64, 256)
    c = tempa.compile(f)
    c(x).backward()
    got = [p.grad.clone() for p in (*l1.parameters(), *l2.parameters())]
    for p in (*l1.parameters(), *l2.parameters()):
        p.grad = None
    f(x).backward()
    for g, p in zip(got, (*l1.parameters(), *l2.parameters())):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)
    fw = tempa.entries(c)[0].compiled.tempa_info.forward.cpp_source
    stored = fw.count("=saved")
    assert stored == 0 if stored_once else stored == 1, fw


def test_rope_tables_read_by_every_head_are_computed_once(stored_once):
    """cos and sin of (tokens, head_dim) positions, read broadcast by every head of q and k in
    every layer (RoPE): stored once (lowerings.BROADCAST_READS), not recomputed per element
    of each reader."""
    def f(q, k, inv_freq):
        pos = torch.arange(q.shape[2], dtype=torch.float32)
        angles = torch.outer(pos, inv_freq)
        emb = torch.cat([angles, angles], -1)
        cos, sin = emb.cos(), emb.sin()
        outs = []
        for _ in range(3):                                 # layers sharing the tables
            q = q * cos + q.flip(-1) * sin
            k = k * cos + k.flip(-1) * sin
            outs.append(q + k)
        return outs
    q, k = torch.randn(2, 8, 64, 32), torch.randn(2, 8, 64, 32)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 16, dtype=torch.float32) / 16))
    with torch.no_grad():
        c = compile_fn(f, q, k, inv_freq)
        for got, ref in zip(c(q, k, inv_freq), f(q, k, inv_freq)):
            torch.testing.assert_close(got, ref)
    cosines = c.tempa_info.cpp_source.count("m::cos(")
    assert cosines == 1 if stored_once else cosines > 1, c.tempa_info.cpp_source
