"""A tied embedding's gradient on the CPU (lower/embedding_grad.py): the output layer's GEMM
and the embedding's backward sum into one gradient for the shared weight; the token rows
are added into the GEMM's output in place (``index_add_``) instead of a zero-filled
(vocab x d) tensor added to it. Checked on the generated wrapper (which path ran) and
against eager's gradients; where the rewrite does not apply (a padding row, an untied
output layer) the gradient is eager's too."""
import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tempa


@pytest.fixture(autouse=True)
def _fresh():
    tempa.reset()
    yield
    tempa.reset()


class TinyLM(nn.Module):
    def __init__(self, vocab=1000, d=64, tied=True, padding_idx=None):
        super().__init__()
        self.emb = nn.Embedding(vocab, d, padding_idx=padding_idx)
        self.pos = nn.Embedding(32, d)
        self.mix = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        if tied:
            self.head.weight = self.emb.weight

    def forward(self, ids, labels):
        h = self.emb(ids) + self.pos(torch.arange(ids.shape[1]))
        logits = self.head(torch.tanh(self.mix(h)))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _backward_wrapper(fast):
    return "\n".join(e.compiled.tempa_info.backward.wrapper_source for e in tempa.entries(fast)
                     if e.compiled.tempa_info.backward is not None)


def _embedding_backward_calls(src):
    names = re.findall(r"(_o\d+) = torch\.ops\.aten\.embedding_dense_backward", src)
    return sum(src.count(f"{n}(") for n in names)


def _grads(model, ids, labels):
    model.zero_grad(set_to_none=True)
    model(ids, labels).backward()
    return [p.grad.clone() for p in model.parameters()]


def _run(**kw):
    torch.manual_seed(0)
    model = TinyLM(**kw)
    ids = torch.randint(0, 1000, (2, 16))
    ids[0, :3] = ids[1, 5]                  # repeated tokens: rows added more than once
    labels = torch.randint(0, 1000, (2, 16))
    ref = _grads(model.double(), ids, labels)
    model.float()
    eager = _grads(model, ids, labels)
    fast = tempa.compile(model)
    got = _grads(fast, ids, labels)
    for k, (g, e, r) in enumerate(zip(got, eager, ref)):
        err, eager_err = (g.double() - r).abs().max(), (e.double() - r).abs().max()
        assert err <= max(4 * eager_err, 1e-6 * r.abs().max()), (k, err, eager_err)
    return _backward_wrapper(fast)


def test_tied_embedding_rows_are_added_into_the_gemm_output():
    src = _run()
    assert "index_add_" in src, src
    # the position embedding (untied) keeps its own backward; the token embedding's is gone
    assert _embedding_backward_calls(src) == 1, src


def test_a_padding_row_keeps_the_embedding_backward():
    src = _run(padding_idx=0)
    assert "index_add_" not in src, src
    assert _embedding_backward_calls(src) == 2, src


def test_an_untied_output_layer_keeps_the_embedding_backward():
    src = _run(tied=False)
    assert "index_add_" not in src, src
