"""Comparing compiled results against eager on the zoo's cases.

`assert_same` walks nested outputs (tensors, tuples, lists, dicts, dataclasses and
HuggingFace `ModelOutput`) and insists the *structure* matches exactly (same container
types, same keys/fields, same None-ness) before comparing tensors with
`torch.testing.assert_close`, so a compiled model that returns a tuple where eager
returns a ModelOutput fails loudly instead of passing by accident.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Callable

import torch

__all__ = [
    "assert_same", "grads_of", "assert_same_grads", "run_eager", "clone_case",
    "fp64_reference", "scalar_loss", "to_dtype",
]


def _is_model_output(x) -> bool:
    # Avoid importing transformers just to test a type: ModelOutput is an OrderedDict
    # subclass that is also a dataclass; match it by its class name in the MRO.
    return any(c.__name__ == "ModelOutput" and c.__module__.startswith("transformers")
               for c in type(x).__mro__)


def _is_hf_cache(x) -> bool:
    return hasattr(x, "layers") and any(
        c.__name__ == "Cache" and c.__module__.startswith("transformers") for c in type(x).__mro__)


def _cache_tensors(cache) -> list:
    """A transformers Cache as [(keys, values), ...] per layer (None for an unfilled layer)."""
    return [(getattr(l, "keys", None), getattr(l, "values", None)) for l in cache.layers]


def assert_same(actual, expected, rtol: float = 1e-5, atol: float = 1e-5, *,
                path: str = "output", check_dtype: bool = True) -> None:
    """Assert `actual` equals `expected` structurally and numerically.

    `path` names the position inside the nest in failure messages (e.g.
    `output.last_hidden_state` or `output[1]`).
    """
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            raise AssertionError(f"{path}: expected a Tensor, got {type(actual).__name__}")
        torch.testing.assert_close(
            actual, expected, rtol=rtol, atol=atol, check_dtype=check_dtype,
            msg=lambda m: f"{path}: {m}")
        return
    if _is_model_output(expected):
        # ModelOutput: compare the same class and the same set of non-None fields
        # (iteration order = field order; None fields are absent from .keys()).
        if type(actual) is not type(expected):
            raise AssertionError(f"{path}: expected {type(expected).__name__}, got {type(actual).__name__}")
        if list(actual.keys()) != list(expected.keys()):
            raise AssertionError(f"{path}: keys {list(actual.keys())} != {list(expected.keys())}")
        for k in expected.keys():
            assert_same(actual[k], expected[k], rtol, atol, path=f"{path}.{k}", check_dtype=check_dtype)
        return
    if _is_hf_cache(expected):
        # DynamicCache & co. (past_key_values): same class, same per-layer keys/values
        if type(actual) is not type(expected):
            raise AssertionError(f"{path}: expected {type(expected).__name__}, got {type(actual).__name__}")
        assert_same(_cache_tensors(actual), _cache_tensors(expected), rtol, atol,
                    path=f"{path}.layers", check_dtype=check_dtype)
        return
    if dataclasses.is_dataclass(expected) and not isinstance(expected, type):
        if type(actual) is not type(expected):
            raise AssertionError(f"{path}: expected {type(expected).__name__}, got {type(actual).__name__}")
        for f in dataclasses.fields(expected):
            assert_same(getattr(actual, f.name), getattr(expected, f.name), rtol, atol,
                        path=f"{path}.{f.name}", check_dtype=check_dtype)
        return
    if isinstance(expected, Mapping):
        if type(actual) is not type(expected):
            raise AssertionError(f"{path}: expected {type(expected).__name__}, got {type(actual).__name__}")
        if list(actual.keys()) != list(expected.keys()):
            raise AssertionError(f"{path}: keys {list(actual.keys())} != {list(expected.keys())}")
        for k in expected:
            assert_same(actual[k], expected[k], rtol, atol, path=f"{path}[{k!r}]", check_dtype=check_dtype)
        return
    if isinstance(expected, (tuple, list)):
        if type(actual) is not type(expected):
            raise AssertionError(f"{path}: expected {type(expected).__name__}, got {type(actual).__name__}")
        if len(actual) != len(expected):
            raise AssertionError(f"{path}: length {len(actual)} != {len(expected)}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, rtol, atol, path=f"{path}[{i}]", check_dtype=check_dtype)
        return
    if isinstance(expected, float) and isinstance(actual, float):
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, msg=lambda m: f"{path}: {m}")
        return
    # Anything else (None, ints, strings, torch.Size, HF Cache objects compared by type) must be equal.
    if type(actual) is not type(expected):
        raise AssertionError(f"{path}: expected {type(expected).__name__}, got {type(actual).__name__}")
    if _is_plain_value(expected) and actual != expected:
        raise AssertionError(f"{path}: {actual!r} != {expected!r}")


def _is_plain_value(x) -> bool:
    return x is None or isinstance(x, (bool, int, float, complex, str, bytes, torch.Size,
                                       torch.dtype, torch.device))


# ---------------------------------------------------------------- gradients

def grads_of(model: torch.nn.Module) -> dict[str, torch.Tensor | None]:
    """Parameter gradients by name (None where a parameter got no gradient), cloned."""
    return {name: (None if p.grad is None else p.grad.detach().clone())
            for name, p in model.named_parameters()}


def assert_same_grads(model_a: torch.nn.Module, model_b: torch.nn.Module,
                      rtol: float = 1e-5, atol: float = 1e-5) -> None:
    """Both models have the same parameter names and the same gradients (None-ness included)."""
    ga, gb = grads_of(model_a), grads_of(model_b)
    if list(ga) != list(gb):
        raise AssertionError(f"parameter names differ: {sorted(set(ga) ^ set(gb))}")
    for name in ga:
        if (ga[name] is None) != (gb[name] is None):
            raise AssertionError(f"grad of {name}: {'None' if ga[name] is None else 'set'} vs "
                                 f"{'None' if gb[name] is None else 'set'}")
        if ga[name] is not None:
            torch.testing.assert_close(ga[name], gb[name], rtol=rtol, atol=atol,
                                       msg=lambda m, n=name: f"grad of {n}: {m}")


def scalar_loss(output) -> torch.Tensor:
    """A scalar to call backward() on: the sum of every floating tensor in a nested output.

    If the output carries a `loss` (HF ModelOutput or GPT's (logits, loss)) it is still
    summed with the rest, which is fine for gradient comparison.
    """
    total = None
    for t in _tensors(output):
        if t.is_floating_point() and t.requires_grad:
            s = t.sum()
            total = s if total is None else total + s
    if total is None:
        raise ValueError("output has no floating tensor that requires grad")
    return total


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif _is_hf_cache(x):
        yield from _tensors(_cache_tensors(x))
    elif _is_model_output(x) or isinstance(x, Mapping):
        for v in x.values():
            yield from _tensors(v)
    elif dataclasses.is_dataclass(x) and not isinstance(x, type):
        for f in dataclasses.fields(x):
            yield from _tensors(getattr(x, f.name))
    elif isinstance(x, (tuple, list)):
        for v in x:
            yield from _tensors(v)


# ---------------------------------------------------------------- running cases

def _map_tensors(x, fn: Callable[[torch.Tensor], torch.Tensor]):
    if isinstance(x, torch.Tensor):
        return fn(x)
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # namedtuple
        return type(x)(*(_map_tensors(v, fn) for v in x))
    if isinstance(x, (tuple, list)):
        return type(x)(_map_tensors(v, fn) for v in x)
    if isinstance(x, dict):
        return {k: _map_tensors(v, fn) for k, v in x.items()}
    return x


def to_dtype(x, dtype: torch.dtype):
    """Cast every floating tensor in a (tuple/list/dict) nest to `dtype`."""
    return _map_tensors(x, lambda t: t.to(dtype) if t.is_floating_point() else t)


def clone_case(case):
    """An independent copy of `case`: deep-copied model (parameters, buffers such as
    BatchNorm running stats, tied weights stay tied) and cloned inputs."""
    return dataclasses.replace(
        case,
        model=copy.deepcopy(case.model),
        args=_map_tensors(case.args, lambda t: t.clone()),
        kwargs=_map_tensors(case.kwargs, lambda t: t.clone()),
    )


def run_eager(case, fn: Callable | None = None):
    """Call `fn` (default: the case's model) on the case's inputs, with the case's own
    RNG seed so dropout-in-training cases are reproducible between eager and compiled."""
    fn = case.model if fn is None else fn
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case.seed)
        return fn(*case.args, **case.kwargs)


def fp64_reference(case, fn_of_model: Callable[[torch.nn.Module], Callable] | None = None):
    """Rerun `case` in float64 on a copy of its model and return outputs cast back to the
    case's dtype (float32). Use it where tolerance is in doubt: if compiled-vs-eager
    differs, the one closer to this reference is the more accurate one.

    `fn_of_model` maps the float64 model to the callable to run (default: the model).
    """
    c = clone_case(case)
    model = c.model.to(torch.float64)
    args = to_dtype(c.args, torch.float64)
    kwargs = to_dtype(c.kwargs, torch.float64)
    fn = model if fn_of_model is None else fn_of_model(model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(case.seed)
        out = fn(*args, **kwargs)
    return _to_dtype_nested(out, torch.float32)


def _to_dtype_nested(x, dtype):
    if isinstance(x, torch.Tensor):
        return x.detach().to(dtype) if x.is_floating_point() else x.detach()
    if _is_model_output(x):
        return type(x)(**{k: _to_dtype_nested(v, dtype) for k, v in x.items()})
    if _is_hf_cache(x):
        for layer in x.layers:  # our own float64 copy: convert in place
            for attr in ("keys", "values"):
                if isinstance(getattr(layer, attr, None), torch.Tensor):
                    setattr(layer, attr, _to_dtype_nested(getattr(layer, attr), dtype))
        return x
    if isinstance(x, (tuple, list, dict)):
        return _map_tensors(x, lambda t: _to_dtype_nested(t, dtype))
    return x


def describe_diff(actual, expected) -> str:
    """Max absolute difference per tensor leaf, for error messages and notes."""
    rows = []
    for i, (a, e) in enumerate(zip(_tensors(actual), _tensors(expected))):
        if a.shape == e.shape and a.is_floating_point():
            rows.append(f"leaf {i} {tuple(e.shape)}: max|diff| = {(a.double() - e.double()).abs().max().item():.3g}")
    return "\n".join(rows)

