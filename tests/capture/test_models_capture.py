"""Every model of the suite is captured as ONE graph with no break and matches eager."""
import pytest
import torch

import tempa
from tests.capture.paths import counts
from tests.models import zoo
from tests.models.compare import assert_same, clone_case, run_eager, scalar_loss, assert_same_grads


@pytest.mark.parametrize("name", zoo.ONE_GRAPH)
def test_one_graph_matches_eager(name):
    case = zoo.make(name)
    reference = clone_case(case)
    expected = run_eager(reference)
    fast = tempa.compile(case.model, backend="eager", fullgraph=True)
    torch.manual_seed(case.seed)
    out = fast(*case.args, **case.kwargs)
    assert_same(out, expected, *case.tolerance)
    s = tempa.stats()
    assert (s.captures, s.graph_breaks, s.eager_fallbacks) == (1, 0, 0)
    # Second call: served from the cache, same result (training cases re-run from a clone).
    if not case.train:
        out2 = fast(*case.args, **case.kwargs)
        assert_same(out2, expected, *case.tolerance)
        assert tempa.stats().captures == 1


@pytest.mark.parametrize("name", ["gpt_train", "batchnorm2d_train", "mlp_seed", "hf_bert"])
def test_gradients_match_eager(name):
    case = zoo.make(name)
    reference = clone_case(case)
    torch.manual_seed(case.seed)
    scalar_loss(reference.model(*reference.args, **reference.kwargs)).backward()
    fast = tempa.compile(case.model, backend="eager", fullgraph=True)
    torch.manual_seed(case.seed)
    scalar_loss(fast(*case.args, **case.kwargs)).backward()
    assert_same_grads(case.model, reference.model, *case.tolerance)
    assert counts() == (1, 0, 0, 0)
