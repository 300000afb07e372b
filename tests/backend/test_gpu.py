"""The GPU backend on CUDA: Triton kernels, extern matmul/attention, CUDA graphs, autotuning.

Every test needs CUDA and Triton and skips cleanly without them (CPU CI). The kernels'
logic is also checked on the CPU through Triton's interpreter (``test_interpreter_*``,
which needs only the triton package).
"""
from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tempa
from tests.models import zoo
from tests.models.compare import assert_same, scalar_loss

if not torch.cuda.is_available():
    # CPU-only: the interpreter tests below run the generated kernels through Triton's
    # interpreter, which Triton reads from the environment when it is first imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")
try:
    import triton  # noqa: F401
    HAVE_TRITON = True
except Exception:  # noqa: BLE001
    HAVE_TRITON = False

cuda = pytest.mark.skipif(not (torch.cuda.is_available() and HAVE_TRITON), reason="needs CUDA and Triton")
MODES = [None, "reduce-overhead", "max-autotune"]


def _to(x, dev):
    if isinstance(x, torch.Tensor):
        return x.to(dev)
    if isinstance(x, (list, tuple)):
        return type(x)(_to(v, dev) for v in x)
    if isinstance(x, dict):
        return {k: _to(v, dev) for k, v in x.items()}
    return x


def _info(compiled):
    return [e.compiled.tempa_info for e in tempa.entries(compiled) if hasattr(e.compiled, "tempa_info")]


def _assert_grads_match(m, ref, rtol, atol, where="", clear=False):
    """Every parameter's gradient equals the eager copy's (then cleared, for the next call)."""
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=rtol, atol=atol, msg=f"{n}{where}")
        if clear:
            p.grad = q.grad = None


def _tol(case):
    rtol, atol = case.tolerance
    return max(rtol, 2e-4), max(atol, 2e-4)


# --- the zoo on the GPU, every mode ---------------------------------------------------------

@cuda
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m or "default")
@pytest.mark.parametrize("name", zoo.ALL)
def test_zoo_forward_and_backward(name, mode):
    """Every suite model on the GPU, in every mode: outputs, gradients (where parameters
    require grad) and buffers (BatchNorm's running statistics) equal eager's. Each is called
    twice, so the second call replays the CUDA graphs (forward and backward) recorded by the
    first, and no variant fell back to eager."""
    case = zoo.make(name)
    model = case.model.cuda()
    args, kwargs = _to(case.args, "cuda"), _to(case.kwargs, "cuda")
    ref_model = copy.deepcopy(model)
    compiled = tempa.compile(model, mode=mode)
    needs_grad = any(p.requires_grad for p in model.parameters())
    rtol, atol = _tol(case)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(2):
            for m, fn in ((model, compiled), (ref_model, ref_model)):
                m.zero_grad(set_to_none=True)
                with torch.random.fork_rng(devices=[0]):
                    torch.manual_seed(case.seed)
                    out = fn(*args, **kwargs)
                if needs_grad:
                    scalar_loss(out).backward()
                if fn is compiled:
                    got = out
            assert_same(got, out, rtol, atol)
            if needs_grad:
                _assert_grads_match(model, ref_model, rtol, atol)
    for (n, b), (_, rb) in zip(model.named_buffers(), ref_model.named_buffers()):
        torch.testing.assert_close(b, rb, rtol=rtol, atol=atol, msg=n)
    infos = _info(compiled)
    assert infos and not [i.fallback_reason for i in infos if i.fallback_reason and name not in zoo.EAGER_IN_TRAINING]
    if mode and needs_grad and name not in zoo.EAGER_IN_TRAINING:
        # the training graphs replayed (batchnorm2d_train's write its running statistics in place)
        assert all(i.training_cudagraphs and i.training_cudagraphs[0].replays >= 2 for i in infos), \
            [i.notes for i in infos]


@cuda
@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_training_replays_cuda_graphs(mode):
    """A GPT training loop under CUDA graphs: the same losses as eager, step after step; the
    forward and backward replay every step; two forwards before one backward still give
    eager's gradients."""
    from tests.models.gpt import GPT, small_config
    torch.manual_seed(0)
    m = GPT(small_config(dropout=0.0)).cuda().train()
    ref = copy.deepcopy(m)
    compiled = tempa.compile(m, mode=mode)
    opt, opt_r = torch.optim.SGD(m.parameters(), lr=0.05), torch.optim.SGD(ref.parameters(), lr=0.05)
    g = torch.Generator(device="cuda").manual_seed(1)
    for _ in range(4):
        idx = torch.randint(0, 128, (4, 32), device="cuda", generator=g)
        tgt = torch.randint(0, 128, (4, 32), device="cuda", generator=g)
        losses = []
        for model, o in ((compiled, opt), (ref, opt_r)):
            o.zero_grad()
            _, loss = model(idx, tgt)
            loss.backward()
            o.step()
            losses.append(loss.item())
        assert abs(losses[0] - losses[1]) < 1e-4 * abs(losses[1]), losses
    info = _info(compiled)[0]
    fw, bw = info.training_cudagraphs
    assert fw.replays == 4 and bw.replays == 4, info.notes
    assert not any("still held" in n for n in info.notes), info.notes
    m.zero_grad(set_to_none=True)
    ref.zero_grad(set_to_none=True)
    a = torch.randint(0, 128, (4, 32), device="cuda", generator=g)
    b = torch.randint(0, 128, (4, 32), device="cuda", generator=g)
    (compiled(a, a)[1] + compiled(b, b)[1]).backward()
    (ref(a, a)[1] + ref(b, b)[1]).backward()
    _assert_grads_match(m, ref, 1e-3, 1e-4)


# --- bf16 autocast against an fp64 reference ---------------------------------------------------

class _Autocast(nn.Module):
    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, *a):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return self.m(*a)


@cuda
@pytest.mark.parametrize("mode", MODES, ids=lambda m: m or "default")
def test_gpt_bf16_autocast_vs_fp64(mode):
    from tests.models.gpt import GPT, small_config
    torch.manual_seed(0)
    m = GPT(small_config()).cuda().eval()
    idx = torch.randint(0, 128, (4, 64), device="cuda")
    ref64 = copy.deepcopy(m).double()(idx).float()
    eager = _Autocast(m)(idx).float()
    compiled = tempa.compile(_Autocast(m), mode=mode)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.no_grad():
            compiled(idx)
            out = compiled(idx).float()
    err_c = ((out - ref64).norm() / ref64.norm()).item()
    err_e = ((eager - ref64).norm() / ref64.norm()).item()
    assert err_c < 1e-2 and err_c < 3 * err_e + 1e-3, (err_c, err_e)
    info = _info(compiled)[0]
    assert any("scaled_dot_product" in e for e in info.extern_calls), info.extern_calls


@cuda
def test_gpt_training_step_bf16():
    from tests.models.gpt import GPT, small_config
    torch.manual_seed(0)
    m = GPT(small_config()).cuda().train()
    ref = copy.deepcopy(m)
    idx = torch.randint(0, 128, (4, 32), device="cuda")
    tgt = torch.randint(0, 128, (4, 32), device="cuda")
    compiled = tempa.compile(_Autocast(m))
    loss = compiled(idx, tgt)[1]
    loss.backward()
    loss_r = _Autocast(ref)(idx, tgt)[1]
    loss_r.backward()
    torch.testing.assert_close(loss.float(), loss_r.float(), rtol=2e-2, atol=2e-2)
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        rel = ((p.grad - q.grad).norm() / (q.grad.norm() + 1e-12)).item()
        assert rel < 5e-2, (n, rel)


# --- kernels: fused pointwise + reductions ------------------------------------------------------

@cuda
@pytest.mark.parametrize("shape", [(64, 100), (8, 5000), (3, 70000), (4096, 768)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_layernorm_kernels(shape, dtype):
    x = torch.randn(*shape, device="cuda", dtype=dtype)
    ln = nn.LayerNorm(shape[-1]).cuda().to(dtype)

    def f(x):
        return F.softmax(x.float(), -1).to(dtype) + ln(x) * 2, x.sum(0), x.amax(-1), x.argmax(-1)
    compiled = tempa.compile(f)
    out = compiled(x)
    ref = f(x)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    for a, b in zip(out, ref):
        if a.dtype == torch.int64:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol * (10 if a.dim() == 1 else 1))
    info = _info(compiled)[0]
    assert info.kernel_count >= 1 and not info.aten_fallbacks, info


@cuda
def test_kernel_counts_and_report():
    def f(x, w):
        y = torch.relu(x @ w)
        return (y * 2 + 1).sum(-1)
    x = torch.randn(256, 512, device="cuda")
    w = torch.randn(512, 512, device="cuda")
    compiled = tempa.compile(f)
    torch.testing.assert_close(compiled(x, w), f(x, w), rtol=1e-4, atol=1e-3)
    info = _info(compiled)[0]
    assert info.extern_calls == ["aten.mm.default"], info.extern_calls
    assert info.kernel_count == 1, info.fusion_report      # relu, *2+1 and the sum: one kernel
    assert "triton" in info.fusion_report
    assert "@triton.jit" in info.inference.triton_source


@cuda
def test_noncontiguous_and_offset_inputs():
    base = torch.randn(10, 33, device="cuda")
    x = base[1:, 1:]                     # storage offset, odd strides: realigned or indexed right
    compiled = tempa.compile(lambda x: (x.t() * 3).softmax(-1))
    torch.testing.assert_close(compiled(x), (x.t() * 3).softmax(-1))


# --- reduce-overhead ------------------------------------------------------------------------

@cuda
def test_reduce_overhead_outputs_of_earlier_calls_keep_their_values():
    m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).cuda()
    compiled = tempa.compile(m, mode="reduce-overhead")
    a, b = torch.randn(8, 32, device="cuda"), torch.randn(8, 32, device="cuda")
    with torch.no_grad():
        ya = compiled(a)
        ya_ref = ya.clone()
        yb = compiled(b)                 # replays the graph into the same static buffers
        yc = compiled(b)
    torch.testing.assert_close(ya, ya_ref)          # protected: the first result kept its values
    with torch.no_grad():
        torch.testing.assert_close(yb, m(b))
        torch.testing.assert_close(yc, m(b))
    runner = tempa.entries(compiled)[0].compiled.tempa_cudagraphs
    assert runner.disabled is None and len(runner.recs) == 1


@cuda
def test_reduce_overhead_view_of_earlier_output_warns():
    m = nn.Linear(16, 16).cuda()
    compiled = tempa.compile(m, mode="reduce-overhead")
    with torch.no_grad():
        v = compiled(torch.randn(4, 16, device="cuda"))[0]      # a view of the output
        with pytest.warns(RuntimeWarning, match="view of an earlier call"):
            compiled(torch.randn(4, 16, device="cuda"))
    del v


@cuda
def test_reduce_overhead_clone_policy_and_new_shape_records_again():
    m = nn.Linear(16, 8).cuda()
    compiled = tempa.compile(m, mode="reduce-overhead", options={"cudagraph_outputs": "clone"})
    with torch.no_grad():
        for n in (4, 4, 6, 6):
            x = torch.randn(n, 16, device="cuda")
            torch.testing.assert_close(compiled(x), m(x))


@cuda
def test_reduce_overhead_cpu_inputs_run_without_graphs():
    m = nn.Linear(8, 8)
    compiled = tempa.compile(m, mode="reduce-overhead")
    x = torch.randn(2, 8)
    torch.testing.assert_close(compiled(x), m(x))     # CPU graph: the CPU backend, no graphs


@cuda
def test_reduce_overhead_writes_inputs_in_place_once_per_call():
    """A graph writing its input replays on the input itself: the recording call writes it
    once (its warm-up ran on a copy); another tensor in that slot runs without the graph."""
    def mut(x, y):
        x.add_(1)
        return x * y
    c2 = tempa.compile(mut, mode="reduce-overhead")
    x, y = torch.randn(4, device="cuda"), torch.randn(4, device="cuda")
    x0 = x.clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        for k in range(1, 4):
            v = x._version
            torch.testing.assert_close(c2(x, y), (x0 + k) * y)
            torch.testing.assert_close(x, x0 + k)
            assert x._version == v + 1
    runner = tempa.entries(c2)[0].compiled.tempa_cudagraphs
    assert runner.disabled is None and runner.replays >= 2
    x2 = torch.randn(4, device="cuda")
    x20 = x2.clone()
    with pytest.warns(RuntimeWarning, match="writes to is another tensor"):
        torch.testing.assert_close(c2(x2, y), (x20 + 1) * y)
    torch.testing.assert_close(x2, x20 + 1)


@cuda
def test_reduce_overhead_batchnorm_eval_copies_nothing():
    m = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU()).cuda().eval()
    compiled = tempa.compile(m, mode="reduce-overhead")
    x = torch.randn(2, 3, 16, 16, device="cuda")
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(compiled(x), m(x), rtol=1e-3, atol=1e-3)
    runner = tempa.entries(compiled)[0].compiled.tempa_cudagraphs
    (rec,) = runner.recs.values()
    assert runner.disabled is None and rec.static_in == {} and runner.replays >= 2


@cuda
def test_causal_guard_switches_when_mask_changes():
    from tests.models.gpt import GPT, small_config
    torch.manual_seed(0)
    m = GPT(small_config()).cuda().eval()
    idx = torch.randint(0, 128, (2, 16), device="cuda")
    compiled = tempa.compile(m)
    with torch.no_grad():
        torch.testing.assert_close(compiled(idx), m(idx), rtol=1e-4, atol=1e-4)
        m.transformer.h[0].attn.bias.fill_(1.0)           # no longer causal: attends to all
        torch.testing.assert_close(compiled(idx), m(idx), rtol=1e-4, atol=1e-4)


# --- max-autotune -----------------------------------------------------------------------------

@cuda
def test_max_autotune_gemm_epilogue_and_cache(tmp_path, monkeypatch):
    from tempa import config
    monkeypatch.setattr(config, "cache_dir", str(tmp_path))

    def f(x, w, b):
        return F.gelu(torch.addmm(b, x, w)) * 2
    x = torch.randn(512, 768, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(768, 1024, device="cuda", dtype=torch.bfloat16) / 30
    b = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    compiled = tempa.compile(f, mode="max-autotune")
    torch.testing.assert_close(compiled(x, w, b).float(), f(x, w, b).float(), rtol=3e-2, atol=3e-2)
    info = _info(compiled)[0]
    assert info.inference.autotune, info.inference.autotune
    assert any(os.scandir(os.path.join(str(tmp_path), "autotune")))


def _mm_and_tanh(x, w):
    y = x @ w
    return y, torch.tanh(y)


def _forced_template(**kw):
    # one small configuration and no cuBLAS: the template itself is what gets checked
    return dict(max_autotune_gemm_backends="triton", max_autotune_gemm_configs=[[32, 64, 32, 4, 4, 2]], **kw)


@cuda
@pytest.mark.parametrize("case", ["mm_ragged", "addmm_gelu", "bmm", "transposed", "residual_bf16", "fp16_cast",
                                  "output_reused", "reduction_after"])
def test_max_autotune_gemm_template_matches_eager(case):
    torch.manual_seed(0)
    r = lambda *s, dt=torch.float32: torch.randn(*s, device="cuda", dtype=dt)  # noqa: E731
    bf, hf = torch.bfloat16, torch.float16
    cases = {
        "mm_ragged": (lambda x, w: x @ w, (r(37, 53), r(53, 29))),
        "addmm_gelu": (lambda x, w, b: F.gelu(torch.addmm(b, x, w)) * 2, (r(300, 200), r(200, 130) / 8, r(130))),
        "bmm": (lambda a, b: torch.relu(torch.bmm(a, b)), (r(6, 70, 40), r(6, 40, 90))),
        "transposed": (lambda x, w: torch.sigmoid(x.t() @ w.t()), (r(96, 130), r(72, 96))),
        "residual_bf16": (lambda x, w, b, res: F.linear(x, w, b).relu() + res,
                          (r(256, 384, dt=bf), r(320, 384, dt=bf) / 16, r(320, dt=bf), r(256, 320, dt=bf))),
        "fp16_cast": (lambda x, w: (x @ w).float() * 0.5, (r(200, 136, dt=hf), r(136, 264, dt=hf) / 8)),
        "output_reused": (_mm_and_tanh, (r(128, 64), r(64, 96))),
        "reduction_after": (lambda x, w: (x @ w).relu().sum(-1), (r(128, 64), r(64, 96))),
    }
    fn, args = cases[case]
    compiled = tempa.compile(fn, mode="max-autotune-no-cudagraphs", options=_forced_template())
    with torch.no_grad():
        out, ref = compiled(*args), fn(*args)
    half = any(a.dtype in (bf, hf) for a in args)
    tol = 3e-2 if half else 1e-4
    if not half:
        # eager's fp32 matmul is exact unless TF32 is allowed; so is the template
        assert not torch.backends.cuda.matmul.allow_tf32
    for a, b in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
        torch.testing.assert_close(a.float(), b.float(), rtol=tol, atol=tol)
    info = _info(compiled)[0].inference
    assert "triton gemm" in info.fusion_report, info.fusion_report


@cuda
def test_max_autotune_second_process_does_not_tune(tmp_path):
    import subprocess
    import sys
    child = (
        "import sys, torch, torch.nn.functional as F, tempa\n"
        f"sys.path.insert(0, {os.getcwd()!r})\n"
        "x = torch.randn(256, 512, device='cuda', dtype=torch.bfloat16)\n"
        "w = torch.randn(512, 384, device='cuda', dtype=torch.bfloat16) / 20\n"
        "b = torch.randn(384, device='cuda', dtype=torch.bfloat16)\n"
        "f = lambda x, w, b: F.gelu(torch.addmm(b, x, w))\n"
        "c = tempa.compile(f, mode='max-autotune')\n"
        "torch.testing.assert_close(c(x, w, b).float(), f(x, w, b).float(), rtol=3e-2, atol=3e-2)\n"
        "print('AUTOTUNE', tempa.entries(c)[0].compiled.tempa_info.inference.autotune[0])\n")
    env = dict(os.environ, TEMPA_CACHE_DIR=str(tmp_path))
    outs = []
    for _ in range(2):
        p = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=600)
        assert p.returncode == 0, p.stderr[-3000:]
        outs.append(next(line for line in p.stdout.splitlines() if line.startswith("AUTOTUNE")))
    assert "benchmarked" in outs[0], outs
    assert "[disk cache]" in outs[1], outs


@cuda
def test_max_autotune_training_matches_eager():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 64)).cuda()
    ref = copy.deepcopy(m)
    x = torch.randn(96, 128, device="cuda")
    compiled = tempa.compile(m, mode="max-autotune")
    compiled(x).square().mean().backward()
    ref(x).square().mean().backward()
    _assert_grads_match(m, ref, 1e-3, 1e-4)


# --- the same kernels through Triton's CPU interpreter (no GPU needed) --------------------------

interp = pytest.mark.skipif(not HAVE_TRITON or torch.cuda.is_available()
                            or os.environ.get("TRITON_INTERPRET") != "1",
                            reason="CPU-only check through Triton's interpreter")


@interp
@pytest.mark.parametrize("which", ["mlp", "softmax", "softmax_long", "layernorm", "colsum", "argmax", "cat_pad", "gpt"])
def test_interpreter_kernels(which):
    from tempa.backend.gpu import gpu_backend
    torch.manual_seed(0)
    cases = {
        "mlp": (nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)), (torch.randn(8, 32),)),
        "softmax": (lambda x: F.softmax(x, -1), (torch.randn(16, 100),)),
        "softmax_long": (lambda x: F.softmax(x, -1), (torch.randn(4, 5000),)),
        "layernorm": (nn.LayerNorm(64), (torch.randn(2, 8, 64),)),
        "colsum": (lambda x: x.sum(0), (torch.randn(3000, 70),)),
        "argmax": (lambda x: x.argmax(-1), (torch.randn(10, 50),)),
        "cat_pad": (lambda x, y: F.pad(torch.cat([x, y], 1), (1, 2)) * 2, (torch.randn(4, 5), torch.randn(4, 3))),
    }
    if which == "gpt":
        from tests.models.gpt import GPT, small_config
        cases["gpt"] = (GPT(small_config()).eval(), (torch.randint(0, 128, (2, 16)),))
    fn, args = cases[which]
    compiled = tempa.compile(fn, backend=lambda gm, ex: gpu_backend(gm, ex))
    with torch.no_grad():
        out, ref = compiled(*args), fn(*args)
    if out.dtype == torch.int64:
        assert torch.equal(out, ref)
    else:
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@interp
def test_interpreter_gpt_training_kernels_stay_small_and_alike():
    """GPU fusion joins only kernels that share data: a training forward's saved values no
    longer pile into the last kernel with their row count (a GPT-124M got one kernel of 350
    pointers), and the residual stream is stored once instead of re-read by every later
    layer, so no kernel grows with depth. Gradients equal eager's."""
    import re
    from tests.models import gpt as G
    torch.manual_seed(0)
    cfg = G.small_config()
    cfg.n_layer = 4
    m = G.GPT(cfg).train()
    ref = copy.deepcopy(m)
    idx = torch.randint(0, cfg.vocab_size, (2, 16))
    tgt = torch.randint(0, cfg.vocab_size, (2, 16))
    tempa.reset()
    compiled = tempa.compile(m, backend=_interp_backend())
    compiled(idx, tgt)[1].backward()
    ref(idx, tgt)[1].backward()
    _assert_grads_match(m, ref, 1e-4, 1e-5)
    info = _info(compiled)[0]
    heads = [line for line in info.forward.triton_source.split("\n") if line.startswith("def k")]
    widest = max(len(re.findall(r"\bp\d+\b", h)) for h in heads)
    assert widest <= 24, widest          # 87 pointers at 4 layers before


@interp
def test_interpreter_wrapper_recycles_dead_buffers():
    from tests.models import gpt as G
    torch.manual_seed(0)
    cfg = G.small_config()
    cfg.n_layer = 4
    m = G.GPT(cfg).eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 16))
    tempa.reset()
    compiled = tempa.compile(m, backend=_interp_backend())
    with torch.no_grad():
        torch.testing.assert_close(compiled(idx)[0], m(idx)[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(compiled(idx)[0], m(idx)[0], rtol=1e-5, atol=1e-5)
    src = _info(compiled)[0].inference.wrapper_source
    import re
    recycled = re.findall(r"^ +buf\d+ = buf\d+$", src, re.M)
    assert len(recycled) > src.count("_empty_strided("), src


@interp
def test_interpreter_cat_pieces_load_only_their_own_range():
    """Triton evaluates every branch of a piecewise value on every lane: the second piece of
    a cat reads ``x - 3``, which is before its tensor where the first piece holds. Each
    piece's loads must be masked by "my range and no earlier one" (an unmasked read there
    was an illegal address in GPT training on the H200)."""
    import re as _re
    from tempa.backend.gpu import gpu_backend

    def f(a, b, c):
        return torch.cat([a, b, c], 1) * 2
    args = (torch.randn(4, 3), torch.randn(4, 5), torch.randn(4, 2))
    compiled = tempa.compile(f, backend=lambda gm, ex: gpu_backend(gm, ex))
    torch.testing.assert_close(compiled(*args), f(*args))
    src = tempa.entries(compiled)[0].compiled.tempa_info.inference.triton_source
    body = src[src.index("def k"):]
    masks = _re.findall(r"tl\.load\(p(\d) \+ \([^)]*\), mask=xmask & (c\d+)", body)
    assert [p for p, _ in masks] == ["0", "1", "2"], body
    for _, m in masks[1:]:
        definition = _re.search(rf"{m} = (.*)", body).group(1)
        assert "~" in definition, body       # excludes the earlier pieces' range


# --- symbolic sizes: one shape-generic compile serves every size (issue 7) -----------------------

class _SoftmaxLayerNorm(nn.Module):
    """A module (not a lambda over one) so that ``.cuda()`` moves the LayerNorm's weights."""

    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(100)

    def forward(self, x):
        return F.softmax(x, -1) + self.ln(x) * 2


def _dynamic_cases():
    """name -> (callable, [args per call]); the first two calls differ in size, so the
    frontend captures a graph with symbolic sizes on the second call."""
    from tests.models.gpt import GPT, small_config
    torch.manual_seed(0)
    return {
        "mlp_seed": (zoo.make("mlp_seed").model, [(torch.randn(b, 32),) for b in (8, 9, 10, 17, 33, 64)]),
        "softmax_layernorm_rows": (_SoftmaxLayerNorm(), [(torch.randn(r, 100),) for r in (16, 17, 18, 40, 5)]),
        # the reduced extent itself is symbolic: looped reductions, rows and columns
        "reduced_dim_symbolic": (lambda x: (F.softmax(x, -1), x.sum(0), x.amax(-1)),
                                 [(torch.randn(6, n),) for n in (100, 101, 150, 3000, 7)]),
        "gpt": (GPT(small_config()).eval(),
                [(torch.randint(0, 128, (b, t)),) for b, t in [(2, 16), (3, 17), (4, 9), (2, 30), (5, 12)]]),
    }


def _count_finishes(monkeypatch):
    """Every compile of GPU kernels (static or generic) goes through compile.finish once."""
    from tempa.backend.gpu import compile as gc
    n = [0]
    real = gc.finish

    def counted(plans):
        n[0] += 1
        return real(plans)
    monkeypatch.setattr(gc, "finish", counted)
    return n


def _run_dynamic(fn, calls, dev, backend, monkeypatch):
    tempa.reset()
    finishes = _count_finishes(monkeypatch)
    compiled = tempa.compile(fn, backend=backend) if backend else tempa.compile(fn)
    with torch.no_grad():
        for args in calls:
            args = _to(args, dev)
            out, ref = compiled(*args), fn(*args)
            for a, b in zip(out if isinstance(out, tuple) else (out,), ref if isinstance(ref, tuple) else (ref,)):
                torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    infos = _info(compiled)
    generic = [i for i in infos if i.dynamic]
    assert generic and all(i.dynamic.startswith("generic") for i in generic), [i.dynamic for i in infos]
    # the first size's static compile, then ONE generic compile for every later size
    assert tempa.stats().captures <= 2 and finishes[0] <= 2, (tempa.stats(), finishes[0])
    return generic[0]


def _interp_backend():
    from tempa.backend.gpu import gpu_backend

    def backend(gm, ex):
        return gpu_backend(gm, ex)
    backend.supports_dynamic = True        # the frontend hands it graphs with symbolic sizes
    return backend


@interp
@pytest.mark.parametrize("which", ["mlp_seed", "softmax_layernorm_rows", "reduced_dim_symbolic", "gpt"])
def test_interpreter_dynamic_one_compile_for_all_sizes(which, monkeypatch):
    fn, calls = _dynamic_cases()[which]
    info = _run_dynamic(fn, calls, "cpu", _interp_backend(), monkeypatch)
    src = info.inference.triton_source
    assert "ds0" in src and "do_not_specialize" in src, src[-2000:]
    assert "ds0 = a" in info.inference.wrapper_source
    if which == "gpt":
        # the causal mask buffer sliced to the symbolic length: still is_causal attention
        assert any("is_causal=True" in n for n in info.notes), info.notes


@interp
def test_interpreter_dynamic_training_is_shape_generic():
    """Training with symbolic sizes on the GPU backend: one shape-generic forward/backward
    serves every batch; gradients equal eager's at every size, including a batch of 1 (its
    own static graph) and batches after it."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10))
    ref = copy.deepcopy(m)
    tempa.reset()
    compiled = tempa.compile(m, backend=_interp_backend())
    for b in (8, 9, 12, 1, 33):
        x = torch.randn(b, 32)
        compiled(x).square().mean().backward()
        ref(x).square().mean().backward()
        _assert_grads_match(m, ref, 1e-4, 1e-5, f" at batch {b}", clear=True)
    assert any(i.dynamic.startswith("generic") for i in _info(compiled)), [i.dynamic for i in _info(compiled)]
    assert tempa.stats().captures == 3          # 8 (static), then >= 2 (generic), then 1


@interp
def test_interpreter_dynamic_falls_back_per_shape_and_says_why(monkeypatch):
    from tempa.backend import dynamic
    monkeypatch.setattr(dynamic, "MAX_SYMBOLS", 0)
    finishes = _count_finishes(monkeypatch)
    tempa.reset()
    f = lambda x: F.softmax(x, -1) * 2       # noqa: E731
    compiled = tempa.compile(f, backend=_interp_backend())
    for r in (4, 5, 6, 7):
        x = torch.randn(r, 30)
        torch.testing.assert_close(compiled(x), f(x))
    info = [i for i in _info(compiled) if i.dynamic][0]
    assert info.dynamic.startswith("per-shape") and "dynamic sizes" in info.dynamic
    assert finishes[0] == 4                  # one compile per size


def test_generic_blocks_loop_over_a_symbolic_reduced_extent():
    from tempa.backend.codegen import triton as tr
    two_d, persistent, xb, rb, _ = tr.generic_blocks(64, 100, True, True)
    assert two_d and not persistent and rb == 128
    assert tr.generic_blocks(64, 100, False, True) == tr.blocks_for(64, 100, True)


@cuda
@pytest.mark.parametrize("which", ["mlp_seed", "softmax_layernorm_rows", "reduced_dim_symbolic", "gpt"])
def test_dynamic_one_compile_for_all_sizes(which, monkeypatch):
    from tempa.backend.gpu import kernels as K
    fn, calls = _dynamic_cases()[which]
    if isinstance(fn, nn.Module):
        fn = fn.cuda()
    jobs = []
    real = K.compile_jobs

    def counted(path, js, *a, **k):
        jobs.extend(js)
        return real(path, js, *a, **k)
    monkeypatch.setattr(K, "compile_jobs", counted)
    info = _run_dynamic(fn, calls, "cuda", None, monkeypatch)
    # size arguments: int64, never claimed aligned or value-specialised
    for j in jobs:
        for i, (name, ty) in enumerate(j.signature.items()):
            if name.startswith("ds"):
                assert ty == "i64" and i not in j.aligned, (j.name, j.signature, j.aligned)
    assert any(name.startswith("ds") for j in jobs for name in j.signature)
    assert info.inference.launch == "direct"


@cuda
def test_dynamic_training_and_sizes_with_one_and_multiples_of_16():
    """Sizes 1 and multiples of 16 are where Triton's value specialisation would differ."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).cuda()
    ref = copy.deepcopy(m)
    tempa.reset()
    compiled = tempa.compile(m)
    for b in (8, 9, 16, 12, 32, 1, 33, 2):
        x = torch.randn(b, 32, device="cuda")
        compiled(x).square().mean().backward()
        ref(x).square().mean().backward()
        _assert_grads_match(m, ref, 1e-3, 1e-4, f" at batch {b}", clear=True)
    assert any(i.dynamic.startswith("generic") for i in _info(compiled)), [i.dynamic for i in _info(compiled)]


@cuda
def test_dynamic_reduce_overhead_shares_kernels(monkeypatch):
    finishes = _count_finishes(monkeypatch)
    tempa.reset()
    ln = nn.LayerNorm(100).cuda()
    f = lambda x: F.softmax(x, -1) + ln(x)   # noqa: E731
    compiled = tempa.compile(f, mode="reduce-overhead")
    for r in (16, 17, 18, 40, 5, 17):
        x = torch.randn(r, 100, device="cuda")
        torch.testing.assert_close(compiled(x).clone(), f(x), rtol=1e-4, atol=1e-4)
    assert finishes[0] <= 2                   # CUDA graphs are recorded per shape, kernels are not
