"""A gathered value costs what its loader recomputes: the index expression and the source
element, not one load (lower/views.py _gather_cost). Why: T5's relative position bias is an
embedding of bucket numbers computed with a log per element from two aranges, read by every
layer's softmax; costed as a plain load it was inlined into each layer and each of the
softmax's three passes, so the log ran 3 x 6 times per element where eager computes the bias
once (T5-small inference 0.84x -> 1.07x eager, benchmarks/README.md)."""
import torch

import tempa

T, HEADS, BUCKETS, LAYERS = 32, 4, 16, 3


def _relative_bias(table):
    # T5's _relative_position_bucket, shortened: a log per (query, key) pair of positions
    pos = torch.arange(T)
    rel = (pos[None, :] - pos[:, None]).abs()
    large = 4 + (torch.log(rel.float() / 4) / 2.0 * 4).long()
    buckets = torch.where(rel < 4, rel, large.clamp(max=BUCKETS - 1))
    return torch.nn.functional.embedding(buckets, table).permute(2, 0, 1)   # HEADS x T x T


def _layers(scores, table):
    bias = _relative_bias(table)
    return torch.stack([torch.softmax(scores[i] + bias, dim=-1) for i in range(LAYERS)])


def _cpp(compiled) -> str:
    (entry,) = tempa.entries(compiled)
    return entry.kernels.inference.passes["render"]


def test_a_gather_of_a_computed_index_read_by_several_users_is_stored_once():
    tempa.reset()
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(LAYERS, HEADS, T, T, generator=g)
    table = torch.randn(BUCKETS, HEADS, generator=g)
    c = tempa.compile(_layers)
    with torch.no_grad():
        got = c(scores, table)
    # stored once: one log in the C++; inlined, each softmax pass of each layer had its own
    assert _cpp(c).count("m::log(") == 1, _cpp(c)
    ref = _layers(scores.double(), table.double())
    assert torch.allclose(got.double(), ref, rtol=1e-5, atol=1e-6)


def test_a_gather_of_input_indices_stays_inside_its_users():
    # an embedding of an input's indices is a load inside each user: no buffer of its own
    def f(ids, table, a, b):
        e = torch.nn.functional.embedding(ids, table)
        return e * a, e + b
    tempa.reset()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 10, (8,), generator=g)
    table, a, b = torch.randn(10, 16, generator=g), torch.randn(8, 16, generator=g), torch.randn(8, 16, generator=g)
    c = tempa.compile(f)
    with torch.no_grad():
        for got, want in zip(c(ids, table, a, b), f(ids, table, a, b)):
            assert torch.equal(got, want)
    (entry,) = tempa.entries(c)
    wrapper = entry.kernels.inference.passes["wrap"]
    assert wrapper.count("_empty_strided(") == 2, wrapper      # the two outputs only
