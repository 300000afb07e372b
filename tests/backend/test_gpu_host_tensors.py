"""A CUDA graph whose kernels would read or write a CPU tensor runs as ATen calls
(gpu/compile.py _refuse_host_reads): a Triton kernel cannot touch host memory. The case users hit: a
non-capturable Adam on CUDA keeps its step counters as CPU 0-d tensors; its compiled step
raised "Pointer argument cannot be accessed from Triton" once its fp64 bias correction
compiled."""
import pytest
import torch
import torch.fx as fx

import tempa
from tempa.backend.codegen.triton_emit import EXTRA_DTYPES
from tempa.backend.gpu.compile import _refuse_host_reads
from tempa.backend.lower.core import LowerOptions
from tempa.backend.lower.lowerings import lower_graph
from tempa.backend.lower.trace import TracedMeta, UntraceableGraph

try:
    import triton  # noqa: F401
    HAVE_TRITON = True
except ImportError:
    HAVE_TRITON = False


def _lowered(*devices, use_last=True):
    """x0 * x1 * ... over 0-d float inputs on ``devices`` (the last one left unused unless
    ``use_last``), lowered with the Triton target's options."""
    g = fx.Graph()
    phs = []
    for i, d in enumerate(devices):
        p = g.placeholder(f"x{i}")
        p.meta["traced_meta"] = TracedMeta((4,), (1,), 0, torch.float32, device=torch.device(d))
        phs.append(p)
    out = phs[0]
    for p in phs[1:] if use_last else phs[1:-1]:
        out = g.call_function(torch.ops.aten.mul.Tensor, (out, p))
        out.meta["traced_meta"] = phs[0].meta["traced_meta"]
    g.output((out,))
    gm = fx.GraphModule(torch.nn.Module(), g)
    return gm, lower_graph(gm, 1, [], 3, LowerOptions(extra_dtypes=EXTRA_DTYPES))


def test_a_kernel_reading_a_cpu_tensor_in_a_cuda_graph_is_refused():
    with pytest.raises(UntraceableGraph, match="CPU tensor x1: Triton kernels cannot touch host memory"):
        _refuse_host_reads(*_lowered("cuda", "cpu"))


def test_cpu_tensors_no_kernel_touches_and_one_device_graphs_are_kept():
    _refuse_host_reads(*_lowered("cuda", "cuda", "cpu", use_last=False))
    _refuse_host_reads(*_lowered("cuda", "cuda"))
    _refuse_host_reads(*_lowered("cpu", "cpu"))        # Triton's interpreter runs on CPU tensors


@pytest.mark.skipif(not (torch.cuda.is_available() and HAVE_TRITON), reason="needs CUDA and Triton")
def test_non_capturable_adam_on_cuda_steps_as_eager():
    torch.manual_seed(0)
    params = [torch.randn(64, 32, device="cuda", requires_grad=True) for _ in range(3)]
    ref = [p.detach().clone().requires_grad_() for p in params]
    for p, r in zip(params, ref):
        p.grad = torch.randn_like(p)
        r.grad = p.grad.clone()
    opt, ref_opt = torch.optim.Adam(params, lr=1e-2), torch.optim.Adam(ref, lr=1e-2)
    assert opt.state_dict()["param_groups"][0]["capturable"] is False
    tempa.reset()
    step = tempa.compile(ref_opt.step)
    for _ in range(3):
        opt.step()
        step()
    for p, r in zip(params, ref):
        torch.testing.assert_close(r, p, rtol=1e-5, atol=1e-6)
    # the step counters are CPU tensors: the graph ran as ATen calls, and says so
    assert tempa.stats().captures >= 1 and tempa.stats().aten_fallbacks >= 1
    reasons = [getattr(getattr(e.compiled, "tempa_info", None), "fallback_reason", None)
               for e in tempa.entries(step)]
    assert any("CPU tensor" in r for r in reasons if r), reasons
