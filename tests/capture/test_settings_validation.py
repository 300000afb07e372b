"""tempa.compile's and tempa.explain's arguments are checked at once, with the valid values
in the message (issue 20, point 8), as torch.compile checks its own."""
import pytest
import torch

import tempa

MODEL = torch.nn.Linear(2, 2)


@pytest.mark.passes_without_capture("refused by tempa.compile itself, before any call")
@pytest.mark.parametrize("kwargs, error, listed", [
    (dict(options={"nonsense_option": 1}), ValueError, "cudagraph_outputs"),
    (dict(options=["cudagraph_outputs"]), TypeError, "dict"),
    (dict(fullgraph="yes"), TypeError, "True or False"),
    (dict(dynamic="maybe"), ValueError, "None (automatic), True or False"),
    (dict(mode="fast"), ValueError, "'max-autotune-no-cudagraphs'"),
    (dict(backend="inductor"), ValueError, "tempa's compiler is 'tempa'"),
    (dict(backend="tempa_x"), ValueError, "'tempa', 'eager' or a callable"),
])
def test_bad_settings_are_refused_with_the_valid_values(kwargs, error, listed):
    with pytest.raises(error, match="tempa.compile") as e:
        tempa.compile(MODEL, **kwargs)
    assert listed in str(e.value)


def test_valid_settings_are_accepted():
    x = torch.randn(3, 2)
    for kwargs in (dict(options={"cudagraph_outputs": "clone"}, mode="reduce-overhead"),
                   dict(fullgraph=True, dynamic=False, backend="eager"), dict(dynamic=None)):
        assert torch.allclose(tempa.compile(MODEL, **kwargs)(x), MODEL(x))
    assert tempa.stats().captures == 3   # each compiled, none refused or run eagerly


def test_explain_of_a_non_callable_is_a_type_error():
    with pytest.raises(TypeError, match="tempa.explain expects an nn.Module or a Python function, got int"):
        tempa.explain(42)
    assert tempa.explain(MODEL)(torch.randn(1, 2)).graph_count == 1
