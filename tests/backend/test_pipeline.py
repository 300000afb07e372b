"""The backend as one list of passes (backend/pipeline.py): every pass's output is kept on
the compiled graph and printable, the C++ and the Triton targets run the same list, and
generated Python is in linecache so tracebacks show its lines."""
import linecache
import traceback

import pytest
import torch
import torch.fx as fx

import tempa
from tempa.backend import pipeline
from tempa.backend.gpu import compile as gc
from tempa.backend.gpu.backend import gpu_decomps
from tempa.backend.lower.trace import trace_forward

from .helpers import compile_fn


def _mlp(x, w, b):
    return torch.relu(x @ w + b).sum(-1)


def test_every_graph_pass_is_a_pass_of_the_list():
    names = [name for name, _ in pipeline.PASSES]
    assert len(names) == len(set(names))
    assert set(pipeline.GRAPH_PASSES) <= set(names)
    assert all(doc for _, doc in pipeline.PASSES)


def test_inference_keeps_each_pass_output():
    c = compile_fn(_mlp, torch.randn(4, 8), torch.randn(8, 3), torch.randn(3))
    info = c.tempa_info
    passes = info.inference.passes
    assert list(passes) == ["aten", "lower", "eliminate_dead", "schedule", "write_in_place", "plan_memory", "render",
                            "build", "wrap"]
    text = info.trace()
    for name in ("captured", "prepare", "aten", "lower", "schedule", "render", "wrap"):
        assert f"=== {name} ===" in text, name
    assert "torch.ops.aten.mm.default" in text          # the ATen graph
    assert "= sum over [8] of (in0, in1)  [matmul]" in text    # the loop IR
    assert ": float32 = relu(t" in text and "= mul(t" in text    # ... its bodies as named ops
    assert "kernel over" in text and "not fused" in text  # the schedule and its decisions
    assert 'extern "C" int seg0' in text                 # the kernels
    assert "def make(" in text                           # the wrapper
    assert str(passes["render"]) == info.cpp_source


def test_training_keeps_the_joint_graph_and_what_it_saved():
    m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Tanh())
    fast = tempa.compile(m)
    fast(torch.randn(3, 8)).sum().backward()
    info = tempa.entries(fast)[0].compiled.tempa_info
    text = info.trace()
    assert "joint graph:" in text and "tangent0" in text
    assert "saved for backward: 1 forward values" in text
    assert "##### forward #####" in text and "##### backward #####" in text
    assert info.forward.passes["lower"] and info.backward.passes["render"]


def test_the_triton_target_runs_the_same_passes_and_keeps_them():
    def f(x, w):
        return torch.softmax(x @ w, -1) * 2
    x, w = torch.randn(8, 32), torch.randn(32, 16)
    tr = trace_forward(fx.symbolic_trace(f), [x, w], gpu_decomps(), differentiable=False)
    plan = gc.plan_graph(tr.gm, tr.num_outputs, tr.mutated, 2, "inference")
    passes = plan.info.passes
    assert list(passes) == ["aten", "lower", "eliminate_dead", "schedule", "write_in_place", "partition", "plan_memory",
                            "render"]
    assert [n for n in pipeline.GRAPH_PASSES if n in passes] == list(passes)[1:]
    assert "@triton.jit" in str(passes["render"]) and "tl.exp(" in str(passes["render"])
    assert "= max over [16]" in str(passes["lower"])


def test_generated_wrappers_are_in_linecache():
    c = compile_fn(lambda x, i: torch.embedding(x, i), torch.randn(5, 3), torch.tensor([1, 2]))
    with pytest.raises(IndexError) as err:
        c(torch.randn(5, 3), torch.tensor([1, 7]))
    frames = [f for f in traceback.extract_tb(err.value.__traceback__) if f.filename.startswith("<tempa wrapper")]
    assert frames and "_index_error" in frames[-1].line
    assert linecache.getline(frames[-1].filename, 1).startswith("import torch")
