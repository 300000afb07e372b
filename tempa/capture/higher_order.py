"""Higher-order constructs user code applies to its functions: torch.compiler.disable,
user autograd Functions (recognised here, captured by ``autograd_function.py``),
torch.utils.checkpoint (``checkpoint.py``), torch.vmap of a torch operation (of Python
functions: ``func_transforms.py``), torch.autograd.functional's transforms (breaks).
torch.func.functional_call is traced as the Python it is: its writes into the module's
``_parameters``/``_buffers`` are side effects the module's forward then reads.

Each is recognised by the object the user calls (an attribute the decorator sets, the
class's base), never by importing the compiler it rebuilds.
"""
from __future__ import annotations

import inspect
import types

import torch
import torch.utils.checkpoint as checkpoint_module

from . import checkpoint, func_transforms
from .breaks import Unsupported, UserError


def is_disabled(fn) -> bool:
    """Whether ``fn`` is wrapped by ``torch.compiler.disable`` (or its private alias)
    (the wrapper sets ``_torchdynamo_disable``): it always runs eagerly, its callees too."""
    return getattr(fn, "_torchdynamo_disable", False) is True


def unpatched_optimizer_method(fn):
    """The original of a torch.optim ``_init_group`` that torch.compile's first call wrapped
    in its own disable (Dynamo's TorchPatcher does so for every optimizer class, for its
    tracer's sake, not as the user's mark), else None. Tracing the original is what tempa
    does in a process where torch.compile never ran; without this, every optimizer step
    compiled after any torch.compile call in the process would break around it."""
    if not is_disabled(fn):
        return None
    original = getattr(fn, "_torchdynamo_orig_callable", None)
    if getattr(original, "__name__", None) == "_init_group" and \
            getattr(original, "__module__", "").startswith("torch.optim."):
        return original
    return None


# Dynamo's first compile replaces nn.Module.__init__ and __setstate__ for the whole process
# by wrappers that call the original, then tag the new module in a weak dictionary of its
# own (its mutation_guard module's install_generation_tagging_init), so that its guards
# can tell modules built inside a forward from the model's. The tag is Dynamo's bookkeeping,
# read only by Dynamo, and only under torch.export (for torch.compile every module counts as
# dynamic); tracing it meant tracing weakref.ref into Dynamo's dictionary, a graph break at
# every module built inside a forward (HF DistilBERT's `nn.ReLU()(x)`) in any process that
# had run torch.compile before.
_GENERATION_TAGGING = {"patched_init": "init", "patched_setstate": "setstate"}


def untagged_module_method(fn):
    """The original ``nn.Module.__init__``/``__setstate__`` where ``fn`` is Dynamo's
    generation-tagging wrapper of it, else None. Tracing the original leaves new modules
    untagged: modules built in the graph are not in Dynamo's dictionary, the one difference
    from eager, seen only by a later torch.export of such a module."""
    original = _GENERATION_TAGGING.get(getattr(fn, "__name__", None))
    if original is None or getattr(fn, "__qualname__", None) != \
            f"install_generation_tagging_init.<locals>.{fn.__name__}":
        return None
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    inner = cells[original].cell_contents if original in cells else None
    return inner if isinstance(inner, types.FunctionType) else None


def check_not_disabled(fn) -> None:
    """A call of a disabled function is a graph break: it runs eagerly, as it is."""
    if is_disabled(fn):
        inner = getattr(fn, "_torchdynamo_orig_callable", fn)
        name = getattr(inner, "__qualname__", repr(inner))
        raise Unsupported("disabled by torch.compiler.disable",
                          f"{name} is marked @torch.compiler.disable")


def is_autograd_function_apply(fn) -> bool:
    """Whether ``fn`` is ``Fn.apply`` of a user ``torch.autograd.Function`` (captured as one
    operation, ``autograd_function.py``; a break runner calls it as it is)."""
    owner = getattr(fn, "__self__", None)
    return isinstance(owner, type) and issubclass(owner, torch.autograd.Function) and \
        getattr(fn, "__func__", None) is torch.autograd.Function.apply.__func__


# torch.autograd.functional's transforms: each marks its inputs requires_grad and calls the
# autograd engine on the function's outputs, which a graph cannot do inside itself (as under
# torch.compile, a break: the call runs eagerly, whole); torch.func's are captured.
_AUTOGRAD_FUNCTIONAL = {torch.autograd.functional.jacobian: "jacrev or jacfwd",
                        torch.autograd.functional.hessian: "hessian",
                        torch.autograd.functional.vjp: "vjp",
                        torch.autograd.functional.jvp: "jvp",
                        torch.autograd.functional.hvp: "jvp of torch.func.grad",
                        torch.autograd.functional.vhp: "vjp of torch.func.grad"}


def _autograd_functional(fn):
    name, captured = fn.__name__, _AUTOGRAD_FUNCTIONAL[fn]

    def model(tracer, frame, args, kwargs):
        raise Unsupported("unsupported call", f"torch.autograd.functional.{name} runs the "
                          f"autograd engine: it runs eagerly (torch.func.{captured} is captured)")
    return model


def runs_as_is(fn) -> bool:
    """Whether a break runner calls ``fn`` as it is rather than compiling its frame."""
    return is_disabled(fn) or is_autograd_function_apply(fn) or fn in _AUTOGRAD_FUNCTIONAL


# checkpoint's options that change neither a value nor a gradient (what it checks, logs, or
# when its recomputation stops)
_CHECKPOINT_OPTIONS = ("determinism_check", "debug", "early_stop")


def _checkpoint(tracer, frame, args, kwargs):
    """``checkpoint(fn, *args, use_reentrant=False)``: one operation whose backward
    recomputes ``fn``'s region (``checkpoint.py``). Reentrant checkpointing runs eagerly."""
    kwargs = dict(kwargs)
    if kwargs.pop("use_reentrant", None) is not False:
        # reentrant checkpointing drops the graph when no input requires grad
        raise Unsupported("unsupported call", "torch.utils.checkpoint.checkpoint without "
                          "use_reentrant=False runs eagerly")
    if kwargs.pop("context_fn", checkpoint_module.noop_context_fn) is not \
            checkpoint_module.noop_context_fn:
        raise Unsupported("unsupported call", "torch.utils.checkpoint.checkpoint with a "
                          "context_fn runs eagerly")
    for name in _CHECKPOINT_OPTIONS:
        kwargs.pop(name, None)
    preserve_rng_state = kwargs.pop("preserve_rng_state", True)
    if not args or not isinstance(preserve_rng_state, bool):
        raise Unsupported("unsupported call", "torch.utils.checkpoint.checkpoint without a "
                          "function or with a preserve_rng_state that is no bool")
    fn, *fn_args = args
    return checkpoint.call(tracer, frame, fn, fn_args, kwargs, preserve_rng_state)


class VmappedOp:
    """``torch.vmap(op, ...)`` of a torch operation, made during capture. Calling it records
    one graph node whose target is the real vmapped callable: functorch's batching runs
    on the fake tensors for the result's metadata (an in-place ``op`` hands back its
    argument, as eager's vmap does) and on the real ones in the graph."""
    __slots__ = ("vmapped",)

    def __init__(self, vmapped):
        def run_vmapped(*args, **kwargs):
            # a function of ours: torch.fx binds it as a global of the graph's code, where
            # vmap's own wrapper (named after the op, in a torch module) it would import
            return vmapped(*args, **kwargs)
        self.vmapped = run_vmapped

    def __call__(self, *args, **kwargs):   # only ever called through the interpreter
        raise Unsupported("unsupported call", "a torch.vmap function called outside capture")


_VMAP_OPTIONS = ("in_dims", "out_dims", "randomness", "chunk_size")


def vmap_model(is_torch_op):
    """The model of ``torch.vmap(func, in_dims=0, out_dims=0, randomness='error', *,
    chunk_size=None)``. A torch operation is one node vmapping it (``VmappedOp``): it runs
    on fake tensors at capture and again in the graph, so it must have no Python effects. A
    Python function is captured as a subgraph the real vmap runs (``func_transforms.py``).
    A randomness other than 'error' (random draws under vmap) stays in Python."""
    python_function = func_transforms.model(torch.vmap)

    def vmap(tracer, frame, args, kwargs):
        from .values import contains_tensor
        try:
            bound = inspect.signature(torch.vmap).bind(*args, **kwargs).arguments
        except TypeError as e:
            raise UserError(e) from None
        func = bound["func"]
        options = {k: bound[k] for k in _VMAP_OPTIONS if k in bound}
        if contains_tensor(list(options.values())) or options.get("randomness", "error") != "error":
            raise Unsupported("unsupported call", "torch.vmap with tensor options or randomness "
                              "other than 'error'")
        if not is_torch_op(func):
            return python_function(tracer, frame, args, kwargs)
        return tracer.mark_internal(VmappedOp(torch.vmap(func, **options)))
    return vmap


MODELS = {checkpoint_module.checkpoint: _checkpoint,
          **{fn: _autograd_functional(fn) for fn in _AUTOGRAD_FUNCTIONAL}}
