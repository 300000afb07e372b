"""How the GPU backend groups a graph into Triton kernels, checked without a GPU or Triton:
``plan_graph`` lowers, schedules and renders kernel text only."""
import torch
import torch.fx as fx

from tempa.backend import schedule
from tempa.backend.gpu import compile as gc
from tempa.backend.lower.decomps import table
from tempa.backend.lower.trace import trace_forward


def _kernel_sizes(fn, *inputs):
    tr = trace_forward(fx.symbolic_trace(fn), list(inputs), table(), differentiable=False)
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


def test_eval_batchnorm_after_a_convolution_calls_nothing_but_the_convolution():
    """torch's eval batch-norm decomposition flattens weight and bias: lowered as views, not
    ATen calls (two per BatchNorm: 106 host calls a ResNet-50 inference made)."""
    from tempa.backend.ir import ExternCall
    aten = torch.ops.aten

    def f(x, w, mean, var, g, b):
        y = torch.nn.functional.conv2d(x, w)
        return torch.relu(torch.nn.functional.batch_norm(y, mean, var, g, b, training=False))
    inputs = [torch.randn(2, 3, 8, 8), torch.randn(4, 3, 3, 3), torch.randn(4), torch.rand(4) + 0.5,
              torch.randn(4), torch.randn(4)]
    tr = trace_forward(fx.symbolic_trace(f), inputs, table(), differentiable=False)
    assert aten.flatten.using_ints in {n.target for n in tr.gm.graph.nodes}   # what is lowered
    plan = gc.plan_graph(tr.gm, tr.num_outputs, tr.mutated, len(inputs), "inference")
    assert [it.op for it in plan.items if isinstance(it, ExternCall)] == [aten.convolution.default]
