"""The native tensor check (tempa/backend/runtime/nativeguards.py) gives the answer of the
Python guard expressions it stands for, on every kind of tensor, and entries use it.

The Python expression (``GuardSet.tensor_expression``) is the definition; for each pair of
(tensor seen at capture, tensor seen at call) both must pass or both must fail (a raising
Python check is a miss, as in the entry)."""
import pytest
import torch
import torch.nn as nn

import tempa
from tempa.backend.runtime import nativeguards
from tempa.capture.cache import MISS
from tempa.capture.guards import GuardSet, TensorSpec


@pytest.fixture(autouse=True)
def _native_available():
    if nativeguards.module() is None:
        pytest.skip("the tensor-check extension cannot be built here (no compiler or headers)")


class Sub(torch.Tensor):
    pass


def _tensors():
    base = torch.randn(4, 6)
    complex_ = torch.randn(4, 6, dtype=torch.cfloat)
    with torch.inference_mode():
        inference = torch.randn(4, 6)
    return {
        "base": base, "other_values": torch.randn(4, 6), "t": base.t(), "t_contig": base.t().contiguous(),
        "rows": base[1:], "cols": base[:, ::2], "offset_view": base.view(-1)[6:].view(3, 6),
        "double": base.double(), "half": base.half(), "int": torch.arange(24).view(4, 6),
        "requires_grad": torch.randn(4, 6, requires_grad=True),
        "parameter": nn.Parameter(torch.randn(4, 6)),
        "frozen_parameter": nn.Parameter(torch.randn(4, 6), requires_grad=False),
        "subclass": torch.randn(4, 6).as_subclass(Sub), "complex": complex_,
        "conj": complex_.conj(), "neg": complex_.conj().imag, "inference": inference,
        "expanded": torch.randn(1, 6).expand(4, 6), "row": torch.randn(1, 6),
        "scalar": torch.tensor(1.0), "empty": torch.randn(0, 6), "three_d": torch.randn(2, 4, 6),
        "meta": torch.empty(4, 6, device="meta"), "batch5": torch.randn(5, 6),
    }


def _checks(spec):
    g = GuardSet()
    ns = {}
    exec(f"def python(t):\n    return {g.tensor_expression('t', spec)}\n", g.consts, ns)
    python = ns["python"]
    return python, nativeguards.checker([spec], python)


def _passes(check, value) -> bool:
    try:
        return check(value) is True
    except Exception:   # an entry's check that raises is a miss
        return False


def _specs():
    for name, t in _tensors().items():
        for attribute in (False, True):
            yield name, TensorSpec.of(t, (), attribute)
        if t.dim() and t.is_contiguous():
            yield name + "/dynamic0", TensorSpec.of(t, (0,), False)


@pytest.mark.passes_without_capture("a unit test of the extension against GuardSet's expression, no capture")
@pytest.mark.parametrize("name,spec", list(_specs()), ids=lambda v: v if isinstance(v, str) else "")
def test_native_check_agrees_with_the_python_expression(name, spec):
    python, native = _checks(spec)
    if not nativeguards.native(spec):
        assert spec.type is Sub      # a subclass keeps its Python check
        return
    assert native is not None
    calls = list(_tensors().items()) + [("none", None), ("int", 3), ("list", [1.0])]
    disagree = [(call, _passes(python, v), _passes(native, v)) for call, v in calls
                if _passes(python, v) != _passes(native, v)]
    assert not disagree, disagree


@pytest.mark.passes_without_capture("a unit test of the extension against GuardSet's expression, no capture")
def test_native_check_falls_back_to_python_under_vmap():
    spec = TensorSpec.of(torch.randn(4, 6), (), False)
    python, native = _checks(spec)
    seen = []

    def body(t):
        seen.append((_passes(python, t), _passes(native, t)))
        return t
    torch.func.vmap(body)(torch.randn(3, 4, 6))
    torch.func.vmap(body)(torch.randn(3, 4, 5))
    assert len(seen) == 2 and all(p == n for p, n in seen), seen


@pytest.mark.passes_without_capture("a unit test of the extension against GuardSet's expression, no capture")
def test_native_check_takes_exactly_its_tensors():
    spec = TensorSpec.of(torch.randn(2), (), False)
    _, native = _checks(spec)
    with pytest.raises(TypeError):
        native(torch.randn(2), torch.randn(2))


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def _entries(fast):
    return [e for c in fast._tempa_context.caches.values() for e in c.entries]


def test_entries_check_their_tensors_in_one_native_call():
    model, x = MLP(), torch.randn(4, 6)
    fast = tempa.compile(model)
    with torch.no_grad():
        fast(x)
    (entry,) = _entries(fast)
    native_lines = [line for line in entry.source.splitlines() if "___TC" in line]
    assert len(native_lines) == 1 and native_lines[0].count(",") == 4   # x and 4 parameters
    assert ".dtype" not in entry.source


def test_fast_guards_off_keeps_the_python_expressions(monkeypatch):
    monkeypatch.setattr(tempa.config, "fast_guards", False)
    model, x = MLP(), torch.randn(4, 6)
    fast = tempa.compile(model)
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x))
    (entry,) = _entries(fast)
    assert "___TC" not in entry.source and ".dtype is" in entry.source


class FrozenSubclass(nn.Parameter):
    pass


def _change(change, model, w):
    if change == "data_dtype":
        w.data = w.data.double()
    elif change == "data_transposed":
        w.data = w.data.t().contiguous().t()
    elif change == "requires_grad":
        w.requires_grad_(True)
    elif change == "t_":
        w.t_()
    elif change == "resize_":
        w.resize_(3, 6)
    elif change == "swap_tensors":
        torch.utils.swap_tensors(w, nn.Parameter(torch.randn(6, 6).t(), requires_grad=False))
    elif change == "class":
        w.__class__ = FrozenSubclass


@pytest.mark.parametrize("change", ["data_dtype", "data_transposed", "requires_grad", "t_",
                                    "resize_", "swap_tensors", "class"])
def test_parameter_changes_are_seen_by_the_native_check(change):
    """Each way a parameter's metadata changes in place (same object, so no module
    registration event) fails the entry's native check."""
    model, x = MLP(), torch.randn(4, 6)
    model.requires_grad_(False)      # in-place metadata changes need a parameter without grad
    fast = tempa.compile(model)
    with torch.no_grad():
        fast(x)
        (entry,) = _entries(fast)
        assert entry.fn(model, x) is not MISS
        _change(change, model, model.fc1.weight)
        assert entry.fn(model, x) is MISS, change
        assert entry.why(model, x).startswith("self.fc1.weight is a ")
        if change in ("data_dtype", "resize_"):
            with pytest.raises(RuntimeError):   # as eager does (float input, 3x6 weight)
                model(x)
            with pytest.raises(RuntimeError):
                fast(x)
            return
        torch.testing.assert_close(fast(x), model(x))



# -- the storage-sharing guard, natively ------------------------------------------------------
def _storage_cases():
    base, other, empty = torch.randn(10), torch.randn(3), torch.empty(0)
    with torch.inference_mode():
        inference = torch.ones(3)
    many = [torch.randn(2) for _ in range(120)]     # past the linear scan: the map
    many[100] = many[7][1:]
    return {
        "distinct": [torch.randn(4, 8) for _ in range(40)],
        "views": [base, base[2:], other, base.view(2, 5), other.t(), base],
        "empty": [empty, torch.empty(0), torch.randn(1), empty],
        "parameter": [nn.Parameter(base), base, torch.randn(3)],
        "subclass": [base, base.as_subclass(Sub)],             # the Python function, whole
        "meta": [torch.zeros(2, device="meta"), torch.zeros(2, device="meta")],
        "inference": [inference, inference[1:], base],
        "many": many,
    }


@pytest.mark.passes_without_capture("a unit test of the extension against the Python function, no capture")
@pytest.mark.parametrize("case", sorted(_storage_cases()))
def test_native_storage_groups_agrees_with_python(case):
    from tempa.capture.guards import storage_groups
    tensors = _storage_cases()[case]
    native = nativeguards.storage_groups()
    assert native(storage_groups, *tensors) == storage_groups(*tensors)


@pytest.mark.passes_without_capture("a unit test of the extension against the Python function, no capture")
def test_native_storage_groups_under_vmap_falls_back():
    from tempa.capture.guards import storage_groups
    native, seen = nativeguards.storage_groups(), []

    def body(a, b):
        seen.append((native(storage_groups, a, b, a), storage_groups(a, b, a)))
        return a
    torch.func.vmap(body)(torch.randn(3, 4), torch.randn(3, 4))
    assert seen and all(n == p for n, p in seen), seen


def test_entries_guard_storage_sharing_natively():
    def f(a, b):
        a.add_(1)
        return b * 2
    fast = tempa.compile(f)
    x, y, z = torch.randn(4), torch.randn(4), torch.randn(4)
    torch.testing.assert_close(fast(x, y), y * 2)
    (entry,) = [e for c in fast.__tempa_context__.caches.values() for e in c.entries]
    native = nativeguards.storage_groups()
    names = [name for name, value in entry.fn.__globals__.items() if value is native]
    assert len(names) == 1 and f"{names[0]}(" in entry.source
    # the guard still sees aliasing: f(z, z) must add before doubling, as eager does
    expected = (z + 1) * 2
    torch.testing.assert_close(fast(z, z), expected)
