"""The differential soundness harness: run a case eagerly and compiled, step by step, and
compare everything a user could observe.

A `Case` builds fresh state with `setup()` (a `State` whose `fn` is what gets compiled: a
function or a module) and lists `steps`. Each run (eager, compiled with backend "eager",
compiled with backend "tempa") builds its OWN state from the same setup under the same
seeds, executes the steps in order and records, after every step, a `Record`: the result
(or the exception), the warnings emitted, the autograd metadata of the result, the alias
signature of the result against the inputs and the state, and a snapshot of the state and
the arguments (side effects). `compare_runs` then diffs the compiled records against the
eager ones and returns the list of differences (empty = the compiled run is sound).

Runs are sequential, not interleaved, so that global state (grad mode, RNG, global hooks,
os.environ) set by one run cannot leak into the other; a case that changes global state
restores it in `teardown`.
"""
from __future__ import annotations

import dataclasses
import math
import random
import re
import types
import warnings
from collections.abc import Mapping
from typing import Any, Callable

import torch

import tempa

BACKENDS = ("eager", "tempa")


class State(types.SimpleNamespace):
    """A case's mutable world: `fn` (compiled) plus anything the steps read or change."""


# ---------------------------------------------------------------------------- steps
class R:
    """A reference to an object of the state, by attribute path: `R("m.fc.weight")`."""

    def __init__(self, path: str):
        self.path = path

    def get(self, state):
        obj = state
        for name in self.path.split("."):
            obj = getattr(obj, name)
        return obj


class Lazy:
    """An argument built from the state at call time: `Lazy(lambda s: [s.x, s.y])`."""

    def __init__(self, build: Callable[[State], Any]):
        self.build = build


def _resolve(v, state):
    if isinstance(v, R):
        return v.get(state)
    if isinstance(v, Lazy):
        return v.build(state)
    if isinstance(v, torch.Tensor):
        # Each run gets its own copy of a literal tensor (it may be mutated in place).
        return v.detach().clone().requires_grad_(v.requires_grad)
    if type(v) in (list, tuple):
        return type(v)(_resolve(a, state) for a in v)
    if type(v) is dict:
        return {k: _resolve(a, state) for k, a in v.items()}
    return v


@dataclasses.dataclass
class Step:
    """One step. `kind` is "call" (fn(*args, **kwargs), compared), "apply" (an arbitrary
    use of fn, compared: vmap, hessian, deepcopy...), "mutate" (change the state; only its
    exception and the resulting state are compared) or "probe" (read a value from the
    state, compared)."""
    kind: str
    args: tuple = ()
    kwargs: dict = dataclasses.field(default_factory=dict)
    action: Callable | None = None
    backward: bool = False
    label: str = ""


def call(*args, _backward: bool = False, _label: str = "", **kwargs) -> Step:
    """Call fn with these arguments (tensors are copied per run; `R`/`Lazy` read the
    state). `_backward=True`: backward() on the sum of the result's grad-requiring tensors,
    then the gradients in the state are compared too."""
    return Step("call", args, kwargs, backward=_backward, label=_label or "call")


def mutate(action: Callable[[State], Any], label: str = "mutate") -> Step:
    return Step("mutate", action=action, label=label)


def probe(action: Callable[[State], Any], label: str = "probe") -> Step:
    return Step("probe", action=action, label=label)


def apply(action: Callable[["Context", Callable, State], Any], label: str = "apply") -> Step:
    """`action(ctx, fn, state)`: fn is the eager object or the compiled one; ctx.compile
    compiles another object the same way (identity in the eager run)."""
    return Step("apply", action=action, label=label)


# A few mutations every topic uses.
def set_attr(path: str, name: str, value_fn: Callable[[State], Any]) -> Step:
    return mutate(lambda s: setattr(R(path).get(s), name, value_fn(s)), f"set {path}.{name}")


def del_attr(path: str, name: str) -> Step:
    return mutate(lambda s: delattr(R(path).get(s), name), f"del {path}.{name}")


def requires_grad(path: str, flag: bool) -> Step:
    """Freeze / unfreeze a parameter, a tensor or all of a module's parameters."""
    return mutate(lambda s: R(path).get(s).requires_grad_(flag), f"{path}.requires_grad_({flag})")


def zero_grad(path: str = "fn") -> Step:
    return mutate(lambda s: R(path).get(s).zero_grad(set_to_none=True), "zero_grad")


@dataclasses.dataclass
class Case:
    """`setup()` returns a fresh State; `steps` run in order. Options:
    check_version: compare tensors' `_version` in the state/args (in-place bumps);
    check_message: exceptions must also have the same message;
    check_rng: compare torch's RNG state after each step;
    warnings_filter: the filter steps run under ("always"; "error" turns warnings into
    exceptions, as under `python -W error`);
    backends: which compiled backends to run; tol: (rtol, atol) or None for PyTorch's
    defaults; breaks: a function of the state returning the code objects the forced-break
    mode breaks in (None: the case is not in that mode); teardown(state): restore global
    state the case changed."""
    id: str
    setup: Callable[[], State]
    steps: list
    check_version: bool = False
    check_message: bool = False
    check_rng: bool = False
    warnings_filter: str = "always"
    backends: tuple = BACKENDS
    tol: tuple | None = None
    breaks: Callable[[State], list] | None = None
    teardown: Callable[[State], Any] | None = None
    seed: int = 0
    fullgraph: bool = False


def forward_code(state: State) -> list:
    """The default forced-break target: the compiled function's code, or forward's."""
    fn = state.fn
    if isinstance(fn, torch.nn.Module):
        fn = type(fn).forward
    return [fn.__code__]


# ---------------------------------------------------------------------------- running
@dataclasses.dataclass
class Context:
    compiled: bool
    backend: str | None
    fullgraph: bool = False

    def compile(self, obj, **kwargs):
        if not self.compiled:
            return obj
        kwargs.setdefault("fullgraph", self.fullgraph)
        return tempa.compile(obj, backend=self.backend, **kwargs)


@dataclasses.dataclass
class Record:
    """What one step left behind, as plain snapshots (independent of the live objects)."""
    label: str
    result: Any = None          # snapshot of the result (None for mutate)
    error: tuple | None = None  # (exception type name, message)
    warnings: list = dataclasses.field(default_factory=list)   # [(category name, message)]
    aliases: list = dataclasses.field(default_factory=list)
    after: Any = None           # snapshot of {state, args}
    global_state: dict = dataclasses.field(default_factory=dict)


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy as np
        np.random.seed(seed)
    except ImportError:
        pass


def run_case(case: Case, backend: str | None, forced_breaks: list = ()) -> list:
    """Run the case: eagerly if backend is None, else compiled with that backend.
    `forced_breaks` is a list of (index into case.breaks(state), offset)."""
    from tempa.capture import interpreter

    tempa.reset()
    seed_everything(case.seed)
    state = case.setup()
    seed_everything(case.seed)
    ctx = Context(compiled=backend is not None, backend=backend, fullgraph=case.fullgraph)
    fn = ctx.compile(state.fn) if ctx.compiled else state.fn
    breaks = []
    if ctx.compiled and forced_breaks:
        codes = case.breaks(state)
        breaks = [(codes[i], off) for i, off in forced_breaks]
    records = []
    interpreter.FORCED_BREAKS.update(breaks)
    try:
        for step in case.steps:
            records.append(_run_step(case, step, ctx, fn, state))
    finally:
        interpreter.FORCED_BREAKS.difference_update(breaks)
        if case.teardown is not None:
            case.teardown(state)
        tempa.reset()
    return records


def _run_step(case: Case, step: Step, ctx: Context, fn, state: State) -> Record:
    rec = Record(step.label)
    args, kwargs = (), {}
    result = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter(case.warnings_filter)
        try:
            if step.kind == "call":
                args = _resolve(step.args, state)
                kwargs = _resolve(step.kwargs, state)
                result = fn(*args, **kwargs)
                if step.backward:
                    _backward(result)
            elif step.kind == "apply":
                result = step.action(ctx, fn, state)
            else:
                result = step.action(state)
        except Exception as e:  # noqa: BLE001 - the exception is what we compare
            rec.error = (type(e).__name__, str(e))
    # tempa's own diagnostics are not eager's warnings: they are attributed to the user's
    # line (logs.warn) and start with "tempa"
    rec.warnings = [(w.category.__name__, str(w.message)) for w in caught
                    if not _is_tempa_file(w.filename) and not str(w.message).startswith("tempa")]
    if step.kind != "mutate":
        rec.aliases = alias_signature(result, args, kwargs, state)
        rec.result = snapshot(result)
    rec.after = snapshot({"state": _state_view(state), "args": list(args), "kwargs": kwargs},
                         versions=case.check_version)
    rec.global_state = {"grad_enabled": torch.is_grad_enabled(),
                        "inference_mode": torch.is_inference_mode_enabled()}
    if case.check_rng:
        rec.global_state["rng"] = torch.get_rng_state()
    return rec


def _is_tempa_file(filename: str) -> bool:
    import os
    return os.path.dirname(tempa.__file__) in os.path.abspath(filename)


def _backward(result) -> None:
    tensors = [t for t in _leaves(result) if isinstance(t, torch.Tensor) and t.requires_grad]
    if tensors:
        # Weighted, not a plain sum: the sum of a normalised output has zero gradient,
        # which would compare rounding noise.
        sum((t.float() * _weights(t)).sum() for t in tensors).backward()


def _weights(t: torch.Tensor) -> torch.Tensor:
    return torch.arange(t.numel(), dtype=torch.float32).add(1).sin().reshape(t.shape)


def _leaves(obj, depth: int = 0):
    if depth > 20:
        return
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _leaves(v, depth + 1)
    elif isinstance(obj, Mapping):
        for v in obj.values():
            yield from _leaves(v, depth + 1)


def _state_view(state: State) -> dict:
    return {k: v for k, v in vars(state).items() if not k.startswith("_")}


# ---------------------------------------------------------------------------- snapshots
_SCALARS = (bool, int, float, complex, str, bytes, type(None))
_MAX_DEPTH = 30


@dataclasses.dataclass
class TensorSnap:
    type_name: str
    value: torch.Tensor | None      # None when the tensor has no readable data
    requires_grad: bool
    has_grad_fn: bool
    is_leaf: bool
    grad: Any
    version: int | None
    strides: tuple = ()             # the strides of the dims of size > 1 (the layout)


@dataclasses.dataclass
class ObjSnap:
    """A non-tensor, non-scalar object: its type name and its comparable contents."""
    type_name: str
    items: Any


def _type_name(obj) -> str:
    t = type(obj)
    return f"{t.__module__}.{t.__qualname__}"


def snapshot(obj, versions: bool = False, _depth: int = 0, _seen=None):
    """A deep, detached copy of what is observable in `obj`."""
    seen = set() if _seen is None else _seen
    rec = lambda v: snapshot(v, versions, _depth + 1, seen)  # noqa: E731
    if isinstance(obj, _SCALARS):
        return obj
    if _depth > _MAX_DEPTH:
        return ObjSnap(_type_name(obj), "<too deep>")
    if isinstance(obj, torch.Tensor):
        return _tensor_snap(obj, versions)
    if isinstance(obj, (types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
                        types.MethodType, type)) or callable(obj) and not isinstance(obj, torch.nn.Module):
        return ObjSnap("<callable>", None)   # code is not state we compare
    if id(obj) in seen:
        return ObjSnap(_type_name(obj), "<cycle>")
    seen.add(id(obj))
    if isinstance(obj, torch.nn.Module):
        return ObjSnap(_type_name(obj), _module_items(obj, rec))
    if isinstance(obj, (map, filter, zip, types.GeneratorType, range, enumerate)) \
            or type(obj).__name__.endswith("iterator"):
        try:
            return ObjSnap(_type_name(obj), [rec(v) for v in obj]) if not isinstance(obj, range) \
                else ObjSnap(_type_name(obj), (obj.start, obj.stop, obj.step))
        except Exception as e:  # noqa: BLE001
            return ObjSnap(_type_name(obj), f"<iteration raised {type(e).__name__}>")
    if isinstance(obj, BaseException):
        return ObjSnap(_type_name(obj), [str(obj), [rec(a) for a in obj.args]])
    if isinstance(obj, (torch.Size, torch.dtype, torch.device)):
        return ObjSnap(_type_name(obj), str(obj))
    if isinstance(obj, torch.Generator):
        return ObjSnap(_type_name(obj), _tensor_snap(obj.get_state(), False))
    if isinstance(obj, (list, tuple)):
        return ObjSnap(_type_name(obj), [rec(v) for v in obj])
    if isinstance(obj, Mapping):
        return ObjSnap(_type_name(obj), [(rec(k), rec(v)) for k, v in obj.items()])
    if isinstance(obj, (set, frozenset)):
        return ObjSnap(_type_name(obj), sorted((repr(rec(v)) for v in obj)))
    if dataclasses.is_dataclass(obj) or hasattr(obj, "__dict__"):
        items = {k: rec(v) for k, v in vars(obj).items() if not k.startswith("__")}
        return ObjSnap(_type_name(obj), items)
    return ObjSnap(_type_name(obj), re.sub(r" at 0x[0-9a-f]+", "", repr(obj)))


def _tensor_snap(t: torch.Tensor, versions: bool) -> TensorSnap:
    try:
        with torch.no_grad():
            value = torch.Tensor._make_subclass(torch.Tensor, t.detach().clone()) \
                if type(t) is not torch.Tensor else t.detach().clone()
            value = value.resolve_conj().resolve_neg()
    except Exception:  # noqa: BLE001 - no storage (a functorch wrapper, a fake tensor)
        value = None
    grad = t.grad if t.is_leaf else None
    return TensorSnap(
        type_name=_type_name(t), value=value, requires_grad=t.requires_grad,
        has_grad_fn=t.grad_fn is not None, is_leaf=t.is_leaf,
        grad=None if grad is None else _tensor_snap(grad, False),
        version=t._version if versions else None, strides=_layout(t))


def _layout(t: torch.Tensor) -> tuple:
    """The strides that say how the elements lie (size-1 dims' strides say nothing)."""
    try:
        return tuple(st for st, n in zip(t.stride(), t.shape) if n > 1)
    except RuntimeError:  # noqa: BLE001 - sparse / nested tensors have no strides
        return ()


def _module_items(m: torch.nn.Module, rec) -> dict:
    items = {"training": m.training}
    for name, p in m._parameters.items():
        items[f"param:{name}"] = None if p is None else rec(p)
    for name, b in m._buffers.items():
        items[f"buffer:{name}"] = None if b is None else rec(b)
    for name, sub in m._modules.items():
        items[f"module:{name}"] = None if sub is None else rec(sub)
    for name, v in vars(m).items():
        if not name.startswith("_") and name != "training":
            items[f"attr:{name}"] = rec(v)
    return items


# ---------------------------------------------------------------------------- aliasing
def _is_identity_object(obj) -> bool:
    """Objects whose identity a user can observe (not interned scalars, strings, tuples)."""
    return not isinstance(obj, (*_SCALARS, tuple, frozenset, type, types.FunctionType,
                                types.BuiltinFunctionType, types.ModuleType))


def _walk(obj, path: str, out: list, depth: int = 0, seen=None):
    """(path, object) for obj and everything reachable through containers, module
    parameters/buffers/attributes and plain objects' attributes."""
    seen = set() if seen is None else seen
    if depth > 12 or isinstance(obj, _SCALARS):
        return
    if _is_identity_object(obj) or isinstance(obj, tuple):
        if id(obj) in seen:
            return
        seen.add(id(obj))
    if not isinstance(obj, tuple) and _is_identity_object(obj):
        out.append((path, obj))
    if isinstance(obj, torch.Tensor):
        return
    if isinstance(obj, torch.nn.Module):
        for name, t in list(obj.named_parameters(recurse=False)) + list(obj.named_buffers(recurse=False)):
            _walk(t, f"{path}.{name}", out, depth + 1, seen)
        for name, sub in obj.named_children():
            _walk(sub, f"{path}.{name}", out, depth + 1, seen)
        for name, v in vars(obj).items():
            if not name.startswith("_"):
                _walk(v, f"{path}.{name}", out, depth + 1, seen)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _walk(v, f"{path}[{i}]", out, depth + 1, seen)
    elif isinstance(obj, Mapping):
        for k, v in list(obj.items()):
            _walk(v, f"{path}[{k!r}]", out, depth + 1, seen)
    elif hasattr(obj, "__dict__") and not callable(obj):
        for k, v in vars(obj).items():
            _walk(v, f"{path}.{k}", out, depth + 1, seen)


def _storage_key(t: torch.Tensor):
    try:
        st = t.untyped_storage()
        return (st.data_ptr(), t.device) if st.nbytes() > 0 else None
    except Exception:  # noqa: BLE001 - tensors without storage
        return None


def alias_signature(result, args, kwargs, state) -> list:
    """For every identity-carrying object in the result: which input/state object it IS,
    and (tensors) which inputs, state tensors and earlier outputs share its storage. Named
    by paths, so eager's and the compiled run's signatures compare as plain lists."""
    roots = []
    _walk(list(args), "args", roots)
    _walk(dict(kwargs), "kwargs", roots)
    _walk(_state_view(state), "state", roots)
    outs = []
    _walk(result, "out", outs)
    by_id = {}
    for p, o in roots:
        by_id.setdefault(id(o), p)
    storage_roots = {}
    for p, o in roots:
        if isinstance(o, torch.Tensor) and (k := _storage_key(o)) is not None:
            storage_roots.setdefault(k, []).append(p)
    sig, out_ids, out_storages = [], {}, {}
    for p, o in outs:
        entry = (p, by_id.get(id(o)) or out_ids.get(id(o)))
        out_ids.setdefault(id(o), p)
        if isinstance(o, torch.Tensor) and (k := _storage_key(o)) is not None:
            entry += (tuple(sorted(storage_roots.get(k, []))), out_storages.get(k))
            out_storages.setdefault(k, p)
        sig.append(entry)
    return sig


# ---------------------------------------------------------------------------- comparing
def compare_snap(actual, expected, path: str, tol: tuple | None, diffs: list) -> None:
    """Append a description of every difference between two snapshots to `diffs`."""
    if isinstance(expected, TensorSnap):
        if not isinstance(actual, TensorSnap):
            diffs.append(f"{path}: expected a tensor ({expected.type_name}), got {_describe(actual)}")
            return
        _compare_tensor(actual, expected, path, tol, diffs)
        return
    if isinstance(expected, ObjSnap):
        if not isinstance(actual, ObjSnap) or actual.type_name != expected.type_name:
            diffs.append(f"{path}: expected {expected.type_name}, got {_describe(actual)}")
            return
        _compare_items(actual.items, expected.items, path, tol, diffs)
        return
    if type(actual) is not type(expected):
        diffs.append(f"{path}: expected {type(expected).__name__} {expected!r}, got {_describe(actual)}")
    elif isinstance(expected, float):
        if not _same_float(actual, expected, tol):
            diffs.append(f"{path}: expected {expected!r}, got {actual!r}")
    elif actual != expected:
        diffs.append(f"{path}: expected {expected!r}, got {actual!r}")


def _same_float(a: float, b: float, tol) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if a == b:
        return math.copysign(1.0, a) == math.copysign(1.0, b)
    rtol, atol = tol or (1.3e-6, 1e-5)
    return abs(a - b) <= atol + rtol * abs(b)


def _compare_items(actual, expected, path, tol, diffs):
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or list(actual) != list(expected):
            diffs.append(f"{path}: fields {list(expected) if isinstance(expected, dict) else expected} "
                         f"!= {list(actual) if isinstance(actual, dict) else actual}")
            return
        for k in expected:
            compare_snap(actual[k], expected[k], f"{path}.{k}", tol, diffs)
    elif isinstance(expected, list):
        if not isinstance(actual, list) or len(actual) != len(expected):
            diffs.append(f"{path}: length {len(expected)} != {len(actual) if isinstance(actual, list) else actual!r}")
            return
        for i, (a, e) in enumerate(zip(actual, expected)):
            if isinstance(e, tuple) and len(e) == 2 and isinstance(a, tuple):   # a mapping's (key, value)
                compare_snap(a[0], e[0], f"{path}<key {i}>", tol, diffs)
                key = repr(e[0]) if isinstance(e[0], _SCALARS) else f"<key {i}>"
                compare_snap(a[1], e[1], f"{path}[{key}]", tol, diffs)
            else:
                compare_snap(a, e, f"{path}[{i}]", tol, diffs)
    else:
        compare_snap(actual, expected, path, tol, diffs)


def _compare_tensor(a: TensorSnap, e: TensorSnap, path, tol, diffs):
    if a.type_name != e.type_name:
        diffs.append(f"{path}: tensor type {e.type_name} expected, got {a.type_name}")
    for attr in ("requires_grad", "has_grad_fn", "is_leaf", "version", "strides"):
        if getattr(a, attr) != getattr(e, attr):
            diffs.append(f"{path}: {attr} {getattr(e, attr)} expected, got {getattr(a, attr)}")
    if (a.value is None) != (e.value is None):
        diffs.append(f"{path}: tensor data readable: {e.value is not None} expected, got {a.value is not None}")
    elif e.value is not None:
        kw = {} if tol is None else {"rtol": tol[0], "atol": tol[1]}
        try:
            torch.testing.assert_close(a.value, e.value, equal_nan=True, **kw)
        except AssertionError as err:
            diffs.append(f"{path}: {str(err).strip().splitlines()[0]} "
                         f"(expected {_short(e.value)}, got {_short(a.value)})")
    if (a.grad is None) != (e.grad is None):
        diffs.append(f"{path}.grad: {'a tensor' if e.grad is not None else 'None'} expected, "
                     f"got {'a tensor' if a.grad is not None else 'None'}")
    elif e.grad is not None:
        _compare_tensor(a.grad, e.grad, f"{path}.grad", tol, diffs)


def _short(t: torch.Tensor) -> str:
    return f"{tuple(t.shape)} {t.dtype} {t.flatten()[:6].tolist()}"


def _describe(v) -> str:
    if isinstance(v, TensorSnap):
        return f"a tensor ({v.type_name})"
    if isinstance(v, ObjSnap):
        return v.type_name
    return f"{type(v).__name__} {v!r}"


def compare_records(actual: list, expected: list, case: Case, who: str) -> list:
    """The differences between a compiled run's records and eager's, one string each."""
    diffs = []
    for i, (a, e) in enumerate(zip(actual, expected)):
        where = f"[{who}] step {i} ({e.label})"
        step_diffs = []
        if (a.error is None) != (e.error is None):
            step_diffs.append(f"exception: eager {_fmt_error(e.error)}, compiled {_fmt_error(a.error)}")
        elif e.error is not None:
            if a.error[0] != e.error[0] or (case.check_message and a.error[1] != e.error[1]):
                step_diffs.append(f"exception: eager {_fmt_error(e.error)}, compiled {_fmt_error(a.error)}")
        if e.error is None and a.error is None:
            compare_snap(a.result, e.result, "result", case.tol, step_diffs)
            if a.aliases != e.aliases:
                step_diffs.append(f"aliasing: eager {e.aliases}, compiled {a.aliases}")
        if [w[0] for w in a.warnings] != [w[0] for w in e.warnings]:
            step_diffs.append(f"warnings: eager {e.warnings}, compiled {a.warnings}")
        compare_snap(a.after, e.after, "after", case.tol, step_diffs)
        for k, v in e.global_state.items():
            av = a.global_state.get(k)
            same = torch.equal(av, v) if isinstance(v, torch.Tensor) else av == v
            if not same:
                step_diffs.append(f"global state {k}: eager {v if k != 'rng' else '...'}, "
                                  f"compiled {av if k != 'rng' else '(differs)'}")
        diffs += [f"{where}: {d}" for d in step_diffs]
    if len(actual) != len(expected):
        diffs.append(f"[{who}] {len(actual)} steps recorded, eager {len(expected)}")
    return diffs


def _fmt_error(err) -> str:
    if err is None:
        return "no exception"
    return f"{err[0]}({err[1].splitlines()[0][:120] if err[1] else ''!r})"


def check_case(case: Case, forced_breaks: list = ()) -> list:
    """Run the case eagerly and compiled with each of its backends; all differences.
    A first eager run is discarded: once-per-process work (lazy imports and the warnings
    they emit, first-use initialisation) then happens before the reference run."""
    run_case(case, None)
    expected = run_case(case, None)
    diffs = []
    for backend in case.backends:
        diffs += compare_records(run_case(case, backend, forced_breaks), expected, case, backend)
    return diffs
