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


def _training_plans(fn, inputs):
    """The GPU plans of ``fn``'s forward and backward graphs (joint trace, default partition)."""
    from tempa.backend.lower.joint import trace_training
    joint = trace_training(fx.symbolic_trace(fn), inputs, table())
    plans = []
    for name, g in (("forward", joint.fw), ("backward", joint.bw)):
        nin = len([n for n in g.graph.nodes if n.op == "placeholder"])
        nout = len(next(n for n in g.graph.nodes if n.op == "output").args[0])
        plans.append(gc.plan_graph(g, nout, [], nin, name))
    return joint, plans


def _conv_bn_relu(x, w, g, b, running_mean, running_var):
    y = torch.nn.functional.conv2d(x, w)
    return torch.relu(torch.nn.functional.batch_norm(y, running_mean, running_var, g, b, training=True))


def _conv_bn_inputs():
    return [torch.randn(16, 4, 64, 64), torch.randn(16, 4, 1, 1).requires_grad_(),
            torch.randn(16).requires_grad_(), torch.randn(16).requires_grad_(), torch.zeros(16),
            torch.ones(16)]


def test_sums_over_the_same_values_share_one_loop():
    """A BatchNorm backward's two sums over (grad, input), and a variance's sums of deviations
    and of their squares, run in one r loop of their kernel (codegen/triton.py
    _shared_loops): the activation they both read is loaded once per element."""
    _, (fw, bw) = _training_plans(_conv_bn_relu, _conv_bn_inputs())
    looped = [kc for p in (fw, bw) for it in p.items if isinstance(it, tuple)
              for kc in [it[1]] if kc.rblock and not kc.persistent]
    two_sums = [kc for kc in looped if kc.body.count("acc_m1 = acc_m1 +") and kc.body.count("acc_m0 = acc_m0 +")]
    assert two_sums, [kc.summary for kc in looped]
    for kc in two_sums:
        assert kc.body.count("for r0 in range(") == 1, kc.body


def test_a_float32_batchnorm_saves_the_convolution_output_itself():
    """The derivative of BatchNorm saves ``input.to(float32)``; of a float32 input that is the
    input itself in eager, and the joint saves the convolution's output rather than a copy
    the forward would write (joint.py _free_view)."""
    aten = torch.ops.aten
    joint, (fw, _) = _training_plans(_conv_bn_relu, _conv_bn_inputs())
    outs = next(n for n in joint.fw.graph.nodes if n.op == "output").args[0]
    saved = outs[len(outs) - joint.num_saved:]
    assert aten.convolution.default in {n.target for n in saved}
    assert not [n for n in saved if n.target in (aten.to.dtype, aten._to_copy.default)]
