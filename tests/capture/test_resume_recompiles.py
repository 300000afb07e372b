"""A resumed frame finds its graph again on every call (issue 16): what the eager part of
a frame hands to the resume function (the iterator of a loop or of ``iter(...)``, the
``.0`` iterator of a CPython 3.11 comprehension) is made anew by every call, so it is
guarded by class and the items it has left, never by identity (which recaptured the
resumed frame on every call). torch.compile on the same code: 1 graph, nothing new on
later calls. A HuggingFace ModelOutput handed to the resume function of the
``can_return_tuple`` wrapper (BERT, DistilBERT) is guarded by class and keys."""
import copy
import dataclasses
import typing

import pytest
import torch

import tempa


def _counts():
    s = tempa.stats()
    return s.captures, s.graph_breaks, s.eager_fallbacks


def _break():
    print("", end="")   # a graph break: print has effects outside the graph


def _calls(fn, n=3):
    fast = tempa.compile(fn, backend="eager")
    x = torch.ones(3)
    seen = []
    for _ in range(n):
        want, got = fn(x), fast(x)
        assert repr(got) == repr(want)
        seen.append(_counts())
    assert seen[0][0] >= 1   # captured (with capture off nothing is, and this must fail)
    return seen


def test_an_iterator_alive_at_a_break_is_handed_to_the_resume_function_by_its_items():
    def f(x):
        it = iter([x, x + 1])
        _break()
        return next(it) * 2 + next(it)
    first, *later = _calls(f)
    assert all(c == first for c in later)
    assert first[2] == 0


def test_a_comprehension_run_after_a_break_reuses_its_graph():
    def f(x):
        ys = [x + i for i in range(3)]
        return [y * 2 for y in ys if _break() is None]
    first, *later = _calls(f)
    assert all(c == first for c in later)
    assert first[2] == 0


def test_an_iterator_handed_in_is_moved_on_as_far_as_the_capture_took_it():
    def f(x, it):
        return x + next(it)
    fast = tempa.compile(f, backend="eager")
    x = torch.zeros(2)
    eager_it, compiled_it = iter([1, 2, 3, 4]), iter([1, 2, 3, 4])
    for _ in range(2):
        assert torch.equal(fast(x, compiled_it), f(x, eager_it))
    assert list(compiled_it) == list(eager_it) == [3, 4]
    assert _counts() == (2, 0, 0)   # the items left differ (4, then 3): by value, as guarded


transformers = pytest.importorskip("transformers")


@dataclasses.dataclass
class _Output(transformers.utils.ModelOutput):
    loss: typing.Optional[torch.Tensor] = None
    logits: torch.Tensor = None


def _model_with_a_break(x):
    y = x * 2
    _break()
    return _Output(loss=y.sum(), logits=y)


@pytest.mark.parametrize("use", ["returned", "attribute", "item"])
def test_an_output_record_made_by_the_eager_part_is_guarded_by_class(use):
    # HF's can_return_tuple wrapper resumes after the model's forward returned its
    # ModelOutput (a dataclass and a dict); it was guarded by identity, so the wrapper's
    # resumed frame recaptured on every call. Reading its items as a dict (C code) still
    # pins it: then each call is a new object, captured again, never a stale answer.
    def f(x):
        out = _model_with_a_break(x)
        if use == "returned":
            return out, isinstance(out, tuple)
        return out.logits + 1 if use == "attribute" else out["logits"] - 1
    fast = tempa.compile(f, backend="eager")
    seen = []
    for _ in range(3):
        x = torch.randn(3)
        assert repr(fast(x)) == repr(f(x))
        seen.append(_counts())
    assert seen[0][0] >= 1
    if use == "item":
        assert seen[2][0] > seen[1][0]
    else:
        assert seen[1] == seen[2] and not tempa.recompile_reasons(fast)


def test_bert_training_steps_reuse_their_graphs():
    torch.manual_seed(0)
    cfg = transformers.BertConfig(num_hidden_layers=2, hidden_size=32, intermediate_size=64,
                                  num_attention_heads=4, vocab_size=64, max_position_embeddings=32,
                                  hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = transformers.BertForSequenceClassification(cfg)
    twin = copy.deepcopy(model)
    ids = torch.randint(0, 64, (2, 8))
    labels = torch.tensor([0, 1])
    fast = tempa.compile(model, backend="eager")
    seen = []
    for _ in range(3):
        got, want = fast(input_ids=ids, labels=labels), twin(input_ids=ids, labels=labels)
        got.loss.backward()
        want.loss.backward()
        assert torch.allclose(got.loss, want.loss) and torch.allclose(got.logits, want.logits)
        seen.append(_counts())
    # the first call sets config.problem_type: one recompile (torch.compile: 2 graphs);
    # the third call captures nothing (test_custom_setattr checks that none breaks)
    assert seen[0][0] >= 1 and seen[1] == seen[2] and seen[2][2] == 0
    for p, q in zip(model.parameters(), twin.parameters()):
        assert torch.allclose(p.grad, q.grad, atol=1e-6)
