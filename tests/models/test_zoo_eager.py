"""The zoo itself: every case builds, runs eagerly, is deterministic, needs no network,
and the comparison helpers catch what they should. (Compiled-vs-eager tests live with the
code they test; they import `tests.models.zoo`.)"""

from __future__ import annotations

import os
import socket

import pytest
import torch

from tests.models import compare, gpt, zoo

_FIRST: dict[str, object] = {}  # name -> (case, output) from the first build, shared by the tests below


@pytest.fixture
def no_network(monkeypatch):
    """Any socket connection during the test is an error (HF must not try the Hub)."""
    def refuse(*a, **k):
        raise AssertionError("network access attempted")
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def _first(name):
    if name not in _FIRST:
        case = zoo.make(name)
        _FIRST[name] = (case, compare.run_eager(compare.clone_case(case)))
    return _FIRST[name]


def test_lists():
    assert len(zoo.ALL) == len(set(zoo.ALL))
    required = {"linear", "mlp_seed", "conv1d", "conv2d", "batchnorm2d_train", "batchnorm2d_eval",
                "layernorm", "groupnorm", "embedding", "dropout_eval", "multihead_attention",
                "transformer_encoder_layer", "gpt", "gpt_sdpa", "hf_bert", "hf_gpt2", "hf_llama",
                "hf_t5_encoder", "hf_vit", "graph_break_seed"}
    assert required <= set(zoo.ALL)
    for lst in (zoo.SEEDS, zoo.NN_LAYERS, zoo.GPT, zoo.HF, zoo.HF_CACHE, zoo.TRANSFORMERS,
                zoo.ONE_GRAPH, zoo.TRAIN):
        assert set(lst) <= set(zoo.ALL)
    assert set(zoo.SEEDS + zoo.NN_LAYERS + zoo.TRANSFORMERS) == set(zoo.ALL)
    assert {n + "_sdpa" for n in zoo.HF_EAGER} == set(zoo.HF_SDPA)
    with pytest.raises(KeyError, match="unknown zoo case"):
        zoo.make("no_such_model")


def test_make_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    zoo.make("gpt")
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("name", zoo.ALL)
def test_case_builds_and_runs(name, no_network):
    case, out = _first(name)
    assert case.name == name
    assert case.model.training == case.train
    assert (name in zoo.TRAIN) == case.train
    for p in case.model.parameters():
        assert p.dtype == torch.float32 and p.device.type == "cpu"
    leaves = list(compare._tensors(out))
    assert leaves, "no tensor in output"
    for t in leaves:
        if t.is_floating_point():
            assert torch.isfinite(t).all(), f"non-finite output in {name}"
    if name in zoo.HF:
        assert compare._is_model_output(out)
        impl = "sdpa" if name.endswith("_sdpa") else "eager"
        assert case.model.config._attn_implementation == impl


@pytest.mark.parametrize("name", zoo.ALL)
def test_deterministic_across_builds(name, no_network):
    case1, out1 = _first(name)
    case2 = zoo.make(name)
    sd1, sd2 = case1.model.state_dict(), case2.model.state_dict()
    assert list(sd1) == list(sd2)
    compare.assert_same(sd2, sd1, rtol=0, atol=0)
    compare.assert_same(case2.args, case1.args, rtol=0, atol=0)
    compare.assert_same(case2.kwargs, case1.kwargs, rtol=0, atol=0)
    compare.assert_same(compare.run_eager(case2), out1, rtol=0, atol=0)


@pytest.mark.parametrize("name", zoo.ALL)
def test_fp64_reference_within_tolerance(name):
    case, out = _first(name)
    compare.assert_same(out, compare.fp64_reference(case), *case.tolerance)


def test_hf_offline_env():
    assert os.environ.get("HF_HUB_OFFLINE") == "1"


def test_clone_case_is_independent():
    case = zoo.make("batchnorm2d_train")
    clone = compare.clone_case(case)
    before = case.model.running_mean.clone()
    compare.run_eager(clone)
    assert torch.equal(case.model.running_mean, before)
    assert not torch.equal(clone.model.running_mean, before)
    # running the original from the same state gives the same output and the same buffers
    out_clone = compare.run_eager(compare.clone_case(case))
    out = compare.run_eager(case)
    compare.assert_same(out, out_clone, rtol=0, atol=0)
    compare.assert_same(case.model.state_dict(), clone.model.state_dict(), rtol=0, atol=0)


def test_clone_keeps_weight_tying():
    case = compare.clone_case(zoo.make("gpt"))
    m = case.model
    assert m.transformer.wte.weight is m.lm_head.weight


@pytest.mark.parametrize("name", zoo.TRAIN + ["gpt", "hf_llama"])
def test_backward_and_grads(name):
    a = zoo.make(name)
    b = compare.clone_case(a)
    compare.scalar_loss(compare.run_eager(a)).backward()
    compare.scalar_loss(compare.run_eager(b)).backward()
    grads = compare.grads_of(a.model)
    assert any(g is not None for g in grads.values())
    compare.assert_same_grads(a.model, b.model, rtol=0, atol=0)
    next(p for p in b.model.parameters() if p.grad is not None).grad.add_(1.0)
    with pytest.raises(AssertionError, match="grad of"):
        compare.assert_same_grads(a.model, b.model)


def test_gpt_sdpa_matches_explicit():
    explicit, sdpa = zoo.make("gpt"), zoo.make("gpt_sdpa")
    compare.assert_same(sdpa(), explicit(), rtol=1e-5, atol=1e-5)


def test_gpt_train_returns_loss():
    case = zoo.make("gpt_train")
    logits, loss = case()
    assert logits.shape == (2, 16, 128) and loss.dim() == 0
    assert abs(loss.item() - torch.log(torch.tensor(128.0)).item()) < 0.5  # near-uniform at init


def test_gpt124m_config_size():
    with torch.device("meta"):
        m = gpt.GPT(gpt.gpt124m_config())
    n = m.num_params()
    assert 123e6 < n < 125e6, n  # 124.4M with tied embeddings and the padded vocab


def test_assert_same_checks_structure():
    t = torch.ones(2)
    compare.assert_same((t, [t]), (t.clone(), [t.clone()]))
    with pytest.raises(AssertionError, match="expected tuple"):
        compare.assert_same([t], (t,))
    with pytest.raises(AssertionError, match="keys"):
        compare.assert_same({"a": t}, {"b": t})
    with pytest.raises(AssertionError, match=r"output\[1\]"):
        compare.assert_same((t, t + 1), (t, t))
    with pytest.raises(AssertionError, match="expected a Tensor"):
        compare.assert_same(None, t)
    with pytest.raises(AssertionError):
        compare.assert_same(t.double(), t)  # dtype is checked
    from transformers.modeling_outputs import BaseModelOutput
    a = BaseModelOutput(last_hidden_state=t)
    compare.assert_same(BaseModelOutput(last_hidden_state=t.clone()), a)
    with pytest.raises(AssertionError, match="keys"):
        compare.assert_same(BaseModelOutput(last_hidden_state=t, hidden_states=(t,)), a)
    with pytest.raises(AssertionError, match="expected BaseModelOutput"):
        compare.assert_same((t,), a)
