"""Higher-order constructs user code applies to its functions: torch.compiler.disable,
user autograd Functions, torch.utils.checkpoint.

Each is recognised by the object the user calls (an attribute the decorator sets, the
class's base), never by importing torch._dynamo.
"""
from __future__ import annotations

from .breaks import Unsupported


def is_disabled(fn) -> bool:
    """Whether ``fn`` is wrapped by ``torch.compiler.disable`` / ``torch._dynamo.disable``
    (the wrapper sets ``_torchdynamo_disable``): it always runs eagerly, its callees too."""
    return getattr(fn, "_torchdynamo_disable", False) is True


def check_not_disabled(fn) -> None:
    """A call of a disabled function is a graph break: it runs eagerly, as it is."""
    if is_disabled(fn):
        inner = getattr(fn, "_torchdynamo_orig_callable", fn)
        name = getattr(inner, "__qualname__", repr(inner))
        raise Unsupported("disabled by torch.compiler.disable",
                          f"{name} is marked @torch.compiler.disable")
