"""How the GPU backend groups a graph into Triton kernels, checked without a GPU or Triton:
``plan_graph`` lowers, schedules and renders kernel text only."""
import torch
import torch.fx as fx

from tempa.backend import schedule
from tempa.backend.gpu import compile as gc
from tempa.backend.lower.decomps import table
from tempa.backend.lower.trace import trace_forward


def _kernel_sizes(fn, *inputs):
    tr = trace_forward(fx.symbolic_trace(fn), list(inputs), table())
    plan = gc.plan_graph(tr.gm, tr.num_outputs, tr.mutated, len(inputs), "inference")
    return [len(it[1].params) for it in plan.items if isinstance(it, tuple)]


def test_kernels_that_share_an_input_stop_growing_at_the_buffer_cap():
    """60 same-shape outputs that all read x would be one kernel of 62 pointers; Triton's
    compile time grows faster than a kernel's size and the slowest kernel is the critical path
    of the parallel compile, so kernels are capped (a GPT-124M backward had one of 175)."""
    def f(x, w):
        return tuple(x * w[i] + i for i in range(60))
    sizes = _kernel_sizes(f, torch.randn(8, 32), torch.randn(60, 8, 32))
    assert len(sizes) >= 2 and max(sizes) <= schedule.MAX_KERNEL_BUFFERS, sizes


def test_small_related_ops_still_share_one_kernel():
    def f(x, w):
        return tuple(x * w[i] + i for i in range(8))
    assert _kernel_sizes(f, torch.randn(8, 32), torch.randn(8, 8, 32)) == [10]
