"""The metadata rules of static capture (tempa/capture/meta.py) against real execution:
capture each zoo model, run its graph on the real inputs node by node, and compare every
node's recorded metadata (shape, dtype, device, requires_grad) with the real tensor's."""
import operator

import pytest
import torch
import torch.fx as fx

import tempa
from tempa.capture.meta import MetaInfo
from tests.models import zoo
from tests.models.compare import clone_case


class _Check(fx.Interpreter):
    def __init__(self, gm):
        super().__init__(gm)
        self.checked = 0

    def run_node(self, n):
        out = super().run_node(n)
        expected = n.meta.get("example_value")
        if isinstance(expected, MetaInfo) and isinstance(out, torch.Tensor):
            got = (tuple(out.shape), out.dtype, out.device.type, out.requires_grad)
            want = (tuple(expected.shape), expected.dtype, expected.device.type,
                    expected.requires_grad)
            assert got == want, f"{n.format_node()}: real {got} != rule {want}"
            self.checked += 1
        return out


def _capture_one(model, args, kwargs, seed=0):
    """(graph, example inputs) of ``model``'s single captured graph, after one call."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append((gm, list(example_inputs)))
        return gm.forward

    torch.manual_seed(seed)
    tempa.compile(model, backend=keep)(*args, **kwargs)
    (gm, inputs), = graphs
    return gm, inputs


@pytest.mark.parametrize("name", zoo.ONE_GRAPH)
@pytest.mark.parametrize("grad", [False, True])
def test_rules_match_real_execution(name, grad):
    tempa.reset()
    case = zoo.make(name)
    with torch.set_grad_enabled(grad):
        gm, inputs = _capture_one(clone_case(case).model, case.args, case.kwargs, case.seed)
        checker = _Check(gm)
        torch.manual_seed(case.seed)
        checker.run(*[t.detach().clone().requires_grad_(t.requires_grad) if t.is_leaf else t
                      for t in inputs])
    # (models whose ops all lack rules, e.g. conv1d, check nothing here: fake tensors ran)


def _samples():
    f32 = torch.randn(2, 3, 4)
    i64 = torch.randint(0, 5, (2, 3, 4))
    w = torch.randn(5, 4, requires_grad=True)
    F = torch.nn.functional
    import operator
    return [
        ("call_function", operator.add, (f32, i64)), ("call_function", operator.add, (i64, 2.5)),
        ("call_function", operator.truediv, (i64, 2)), ("call_function", operator.floordiv, (i64, 2)),
        ("call_function", operator.mul, (f32, torch.tensor(2.0, dtype=torch.float64))),
        ("call_function", operator.lt, (f32, 0)), ("call_function", torch.where, (f32 > 0, f32, 0.0)),
        ("call_function", F.linear, (f32, w)), ("call_function", torch.matmul, (f32, torch.randn(4))),
        ("call_function", torch.matmul, (torch.randn(4), torch.randn(3, 4, 2))),
        ("call_function", torch.softmax, (f32, -1)), ("call_function", torch.exp, (i64,)),
        ("call_method", "sum", (i64, -1)), ("call_method", "mean", (f32, (0, 2), True)),
        ("call_method", "max", (f32, 1)), ("call_method", "argmax", (f32,)),
        ("call_method", "view", (f32, -1, 4)), ("call_method", "permute", (f32, 2, 0, 1)),
        ("call_method", "transpose", (f32, -1, 0)), ("call_method", "unsqueeze", (f32, -1)),
        ("call_method", "expand", (torch.randn(1, 4), 3, -1)), ("call_method", "split", (f32, 2, -1)),
        ("call_method", "chunk", (f32, 3, 1)), ("call_function", operator.getitem, (f32, (slice(None), None, 1, slice(1, None, 2)))),
        ("call_function", operator.getitem, (f32, (Ellipsis, 0))),
        ("call_function", torch.cat, ([f32, f32], 1)), ("call_function", torch.stack, ([f32, f32], -1)),
        ("call_method", "to", (i64, torch.float16)), ("call_method", "float", (i64,)),
        ("call_function", torch.arange, (5,)), ("call_function", torch.arange, (0, 1, 0.25)),
        ("call_function", torch.full, ((2, 2), 3)), ("call_function", torch.ones, (2, 3)),
        ("call_method", "masked_fill", (f32, f32 > 0, float("-inf"))),
        ("call_function", F.embedding, (torch.tensor([[0, 1]]), torch.randn(3, 4))),
        ("call_function", F.layer_norm, (f32, (4,))), ("call_method", "flatten", (f32, 1)),
        ("call_method", "reshape", (f32.transpose(0, 1), 3, -1)), ("call_method", "repeat", (f32, 1, 2, 1, 1)),
        ("call_method", "cumsum", (i64, 0)), ("call_method", "new_zeros", (f32, (3,))),
    ]


def _rule_and_real(kind, target, args):
    """(rule's result, real result) pairs for one call; None where no rule answers."""
    from tempa.capture.meta import infer, NoRule
    metas = [MetaInfo.of(a) if isinstance(a, torch.Tensor) else
             [MetaInfo.of(t) for t in a] if isinstance(a, list) else a for a in args]
    try:
        rule = infer(kind, target, tuple(metas), {})
    except NoRule:
        return None
    real = getattr(args[0], target)(*args[1:]) if kind == "call_method" else target(*args)
    return list(zip(rule, real)) if isinstance(real, tuple) else [(rule, real)]


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.passes_without_capture("the metadata rules called directly, against real execution")
def test_rules_on_single_operations(grad):
    with torch.set_grad_enabled(grad):
        for kind, target, args in _samples():
            pairs = _rule_and_real(kind, target, args)
            for r, t in pairs or ():
                assert (tuple(r.shape), r.dtype, r.requires_grad) == \
                    (tuple(t.shape), t.dtype, t.requires_grad), f"{target} {args[1:]}"


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.passes_without_capture("the metadata rules called directly, against real execution")
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=CUDA)])
def test_rules_under_autocast_match_real_execution_on_single_operations(device):
    """Under autocast a rule answers only for an operation whose autocast policy it knows
    (meta.py AUTOCAST_POLICY, or neutral), and its answer matches real execution, with
    bfloat16 operands among the float32 ones."""
    from tempa.capture.meta import AUTOCAST_NEUTRAL_FUNCTIONS, AUTOCAST_NEUTRAL_METHODS, AUTOCAST_POLICY
    bf16 = torch.randn(2, 3, 4).bfloat16()
    F = torch.nn.functional
    samples = _samples() + [
        ("call_function", operator.add, (bf16, torch.randn(2, 3, 4))),
        ("call_method", "masked_fill", (bf16, bf16 > 0, 0.5)), ("call_method", "view", (bf16, 6, 4)),
        ("call_function", F.layer_norm, (bf16, (4,), torch.randn(4), torch.randn(4))),
        ("call_function", F.linear, (bf16, torch.randn(5, 4), torch.randn(5))),
        ("call_function", F.linear, (torch.randn(3, 4).double(), torch.randn(5, 4).double())),
        ("call_function", F.softmax, (bf16, -1)), ("call_method", "log_softmax", (bf16, -1)),
        ("call_function", F.gelu, (bf16,)), ("call_function", F.gelu, (torch.randn(3),)),
        ("call_function", F.cross_entropy, (bf16.view(6, 4), torch.tensor([0, 1, 2, 3, 0, 1]))),
        ("call_function", F.scaled_dot_product_attention, (bf16.view(1, 2, 3, 4), torch.randn(1, 2, 3, 4),
                                                           torch.randn(1, 2, 3, 4))),
        ("call_function", torch.bmm, (torch.randn(2, 3, 4), bf16.transpose(1, 2)))]

    def moved(v):
        return v.to(device) if isinstance(v, torch.Tensor) else [moved(t) for t in v] if isinstance(v, list) \
            else tuple(moved(t) for t in v) if isinstance(v, tuple) else v
    answered = 0
    with torch.autocast(device, dtype=torch.bfloat16):
        for kind, target, args in samples:
            pairs = _rule_and_real(kind, target, moved(args))
            if pairs is None:
                continue
            known = target in (AUTOCAST_NEUTRAL_METHODS if kind == "call_method" else AUTOCAST_NEUTRAL_FUNCTIONS) \
                or target in AUTOCAST_POLICY[device]
            assert known, f"{target} answered under autocast"
            answered += 1
            for r, t in pairs:
                assert (tuple(r.shape), r.dtype) == (tuple(t.shape), t.dtype), f"{target} {args[1:]}"
    assert answered >= 30


class _Autocast(torch.nn.Module):
    def __init__(self, m, device="cpu"):
        super().__init__()
        self.m, self.device = m, device

    def forward(self, *args, **kwargs):
        with torch.autocast(self.device, dtype=torch.bfloat16):
            return self.m(*args, **kwargs)


def _check_under_autocast(model, args, kwargs, seed=0, grad=False):
    with torch.set_grad_enabled(grad):
        gm, inputs = _capture_one(model, args, kwargs, seed)
        checker = _Check(gm)
        torch.manual_seed(seed)
        checker.run(*inputs)
    return checker.checked


@pytest.mark.parametrize("name", zoo.ONE_GRAPH)
def test_rules_under_autocast_match_real_execution(name):
    """As test_rules_match_real_execution, the model under CPU bfloat16 autocast."""
    tempa.reset()
    case = zoo.make(name)
    checked = _check_under_autocast(_Autocast(clone_case(case).model), case.args, case.kwargs, case.seed)
    if name.startswith("gpt"):
        assert checked > 0


def _small_gpt(device):
    from tests.models.gpt import GPT, GPTConfig
    tempa.reset()
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=128, block_size=32, n_layer=2, n_head=2, n_embd=32)).to(device)
    return _Autocast(model, device), torch.randint(0, 128, (2, 16), device=device)


@CUDA
@pytest.mark.parametrize("grad", [False, True])
def test_rules_under_cuda_autocast_match_real_execution(grad):
    model, idx = _small_gpt("cuda")
    assert _check_under_autocast(model, (idx, idx), {}, grad=grad) > 0


def test_an_autocast_gpt_is_captured_without_fake_tensors():
    """Every operation of a GPT under autocast has a rule (AUTOCAST_POLICY or neutral), so
    capture never switches to fake tensors (their first use costs seconds of imports)."""
    from torch._subclasses.fake_tensor import FakeTensor
    model, idx = _small_gpt("cpu")
    gm, _ = _capture_one(model, (idx, idx), {})
    metas = [n.meta.get("example_value") for n in gm.graph.nodes]
    assert not any(isinstance(m, FakeTensor) for m in metas)
    assert sum(isinstance(m, MetaInfo) for m in metas) > 20
