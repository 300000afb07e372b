"""A torch.library custom operator that writes its arguments (``mutates_args``), in captured
code: recorded as a functional operation plus copies into the written tensors.

Backends trace graphs to functional ATen, and PyTorch's functionalization refuses a custom
operator with mutable arguments. ``op(x, y)`` writing ``x`` is recorded as
``new_x, *outs = tempa_fn::functional_<hash>([x, y])`` (its kernel runs ``op`` on a clone
of ``x`` and returns the clone) followed by ``x.copy_(new_x)``: the same values land in the
same tensor, and every backend sees operations it can functionalize. (ATen's own ops are
functionalized by PyTorch; this is for the other namespaces only.)
"""
from __future__ import annotations

import hashlib

import torch

from . import regions
from .breaks import Unsupported
from .values import TensorVar


def writes_arguments(fn) -> bool:
    """An operator of a custom library whose schema writes one of its arguments."""
    return type(fn) is torch._ops.OpOverload and fn.namespace not in ("aten", "prims") and \
        fn._schema.is_mutable


def record(tracer, fn, args, kwargs):
    """``fn(*args, **kwargs)`` as the functional operation and its copies (module docstring)."""
    builder = tracer.builder
    schema = fn._schema
    try:
        bound = _bind(schema, args, kwargs)
    except TypeError as e:
        raise Unsupported("unsupported call", f"{fn}: {e}") from None
    written = [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    tensors = [name for name, v in bound.items() if isinstance(v, TensorVar)]
    if any(not isinstance(bound.get(name), TensorVar) for name in written) or \
            any(isinstance(v, (list, tuple)) and any(isinstance(i, TensorVar) for i in v)
                for v in bound.values()):
        raise Unsupported("unsupported call", f"{fn} writes an argument that is no single tensor")
    if any(type(r.type) is not torch.TensorType for r in schema.returns) or \
            any(r.alias_info is not None for r in schema.returns):
        raise Unsupported("unsupported call", f"{fn} returns what is no new tensor")
    if torch.is_grad_enabled() and any(bound[n].fake.requires_grad for n in tensors):
        raise Unsupported("unsupported call", f"{fn} writes its arguments and records autograd "
                          "history: it runs eagerly")
    constants = {name: v for name, v in bound.items() if name not in tensors}
    op = functional_op(fn, tuple(tensors), tuple(written), constants)
    results = builder.call("call_function", op, ([bound[n] for n in tensors],), {})
    for name, new in zip(written, results):
        builder.call("call_method", "copy_", (bound[name], new), {})
    outs = results[len(written):]
    if not schema.returns:
        return None
    return outs[0] if len(schema.returns) == 1 else tuple(outs)


def _bind(schema, args, kwargs) -> dict:
    """The arguments by name, defaults filled in."""
    bound = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(args) and not arg.kwarg_only:
            bound[arg.name] = args[i]
        elif arg.name in kwargs:
            bound[arg.name] = kwargs[arg.name]
        elif arg.has_default_value():
            bound[arg.name] = arg.default_value
        else:
            raise TypeError(f"missing argument {arg.name!r}")
    if len(args) > len(schema.arguments) or set(kwargs) - set(bound):
        raise TypeError("too many arguments")
    return bound




def functional_op(fn, tensors: tuple, written: tuple, constants: dict):
    """``tempa_fn::functional_<hash>(Tensor[] tensors) -> Tensor[]``: ``fn`` on clones of the
    ``written`` arguments (the others as given, ``constants`` fixed); returns those clones,
    then ``fn``'s outputs. Named by a hash of the operator and the constants."""
    key = hashlib.sha256(repr((str(fn._schema), tensors, written, sorted(constants.items(), key=str)))
                         .encode()).hexdigest()[:16]
    name = f"functional_{fn.namespace}_{fn._opname}_{key}"
    if name in regions.OPERATIONS:
        return regions.OPERATIONS[name]
    library = regions.tempa_fn_library()
    library.define(f"{name}(Tensor[] tensors) -> Tensor[]")

    def run(values, clone):
        given = dict(zip(tensors, values))
        copies = [clone(given[n]) for n in written]
        given.update(zip(written, copies))
        values = {**constants, **given}
        out = fn(*[values[a.name] for a in fn._schema.arguments if not a.kwarg_only],
                 **{a.name: values[a.name] for a in fn._schema.arguments if a.kwarg_only})
        outs = [] if out is None else [out] if isinstance(out, torch.Tensor) else list(out)
        return copies + outs

    def kernel(values):
        return run(values, torch.clone)

    def fake(values):
        return run(values, torch.empty_like)

    library.impl(name, kernel, "CompositeExplicitAutograd")
    torch.library.register_fake(f"tempa_fn::{name}", fake, lib=library)
    op = getattr(torch.ops.tempa_fn, name).default
    regions.OPERATIONS[name] = op
    return op
