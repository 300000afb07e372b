"""What tempa.compile returns for an nn.Module: ``OptimizedModule``, a wrapper that shares
the module's parameters and calls the compiled code of its forward."""
from __future__ import annotations

import functools
import types
from typing import TYPE_CHECKING

import torch
from torch.nn.modules.lazy import LazyModuleMixin

from . import distributed
from .configuration import config
from .backend.runtime import nativeguards

if TYPE_CHECKING:
    from .context import CompileContext   # (context imports this module)


class OptimizedModule(torch.nn.Module):
    """What tempa.compile returns for an nn.Module: shares the original's parameters and
    buffers (it is registered as ``_orig_mod``), leaves it untouched, and calls the compiled
    code of its forward."""

    def __init__(self, mod: torch.nn.Module, context: "CompileContext"):
        super().__init__()
        self.__dict__["_tempa_mod"] = mod
        self._orig_mod = mod
        self.__dict__["_tempa_context"] = context
        # state_dict() keys are the module's own (no "_orig_mod." prefix): a checkpoint moves
        # freely between the eager and the compiled model
        self._register_state_dict_hook(_drop_orig_mod_prefix)
        self.register_load_state_dict_pre_hook(_add_orig_mod_prefix)
        forward = mod.__dict__.get("forward")
        call_override = type(mod).__call__
        if forward is None and call_override is not torch.nn.Module.__call__ and \
                isinstance(call_override, types.FunctionType):
            # a class that overrides __call__: calling the module runs that, so it is what
            # gets compiled (its super().__call__ reaches forward inside the capture)
            fn, eager = call_override, call_module
        elif forward is None:
            fn = type(mod).forward
            eager = call_module
        elif isinstance(forward, types.MethodType):
            fn, eager = forward.__func__, call_module
        else:
            fn = forward
            eager = lambda *a, **k: forward(*a, **k)  # noqa: E731
        self.__dict__["_tempa_ddp"] = distributed.is_ddp(mod)
        # Submodules with hooks (FSDP2's fully_shard puts its collectives there) run their
        # hooks eagerly around a compiled forward; see __call__.
        self.__dict__["_tempa_hooked"] = [m for m in mod.modules()
                                          if m is not mod and distributed.has_module_hooks(m)]
        if self._tempa_ddp:
            # DDP's forward (reducer, hooks, no_sync) runs eagerly around its compiled
            # inner module, whose graphs are split at DDP's bucket boundaries.
            context.backend = distributed.split_backend(context.backend, mod)
            self.__dict__["_tempa_call"] = distributed.ddp_forward_runner(
                mod, context.forward_of(mod.module))
        elif isinstance(forward, types.FunctionType):
            dispatch = context.dispatcher(fn, eager)
            self.__dict__["_tempa_call"] = lambda *a, **k: dispatch(*a, **k)
        else:
            dispatch = context.dispatcher(fn, eager)
            self.__dict__["_tempa_call"] = functools.partial(dispatch, mod)

    def __call__(self, *args, **kwargs):
        # Instance state is read from __dict__: a module's attribute reads go through the
        # __getattr__ hook (not specialised by CPython), ~35 ns each on every call.
        d = self.__dict__
        if _hooks_clear(d, d["_tempa_mod"]):
            return d["_tempa_call"](*args, **kwargs)
        if d["_forward_hooks"] or d["_forward_pre_hooks"]:
            return super().__call__(*args, **kwargs)
        mod = d["_tempa_mod"]
        m = mod.__dict__
        own_hooks = (m["_forward_hooks"] or m["_forward_pre_hooks"] or m["_backward_hooks"] or
                     m["_backward_pre_hooks"]) and not d["_tempa_ddp"]
        if not own_hooks and not d["_tempa_hooked"]:
            return d["_tempa_call"](*args, **kwargs)
        if isinstance(mod, LazyModuleMixin) and mod.has_uninitialized_params():
            mod._infer_parameters(mod, args, kwargs)   # its first call creates its parameters
            own_hooks = distributed.has_module_hooks(mod) and not d["_tempa_ddp"]
            if not own_hooks and not d["_tempa_hooked"]:
                return d["_tempa_call"](*args, **kwargs)
        # A hooked submodule reached from eagerly run code (the rest of a loop after a graph
        # break) still runs its compiled forward: each is installed for this call.
        context = self._tempa_context
        with distributed.forwards_replaced([(m, context.forward_of(m)) for m in self._tempa_hooked]):
            if own_hooks:
                # The module's own hooks (FSDP2's root unshard, user hooks) run as eager runs
                # them, around its compiled forward.
                return distributed.call_with_compiled_forward(mod, context.forward_of(mod),
                                                              args, kwargs)
            return self._tempa_call(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self._tempa_call(*args, **kwargs)

    @property
    def training(self):
        return self.__dict__["_tempa_mod"].training

    @training.setter
    def training(self, mode):
        # the wrapper's mode is the module's: tempa.compile(model.eval()).training is False,
        # and model.train() later shows through (Module.__init__'s default is ignored)
        mod = self.__dict__.get("_tempa_mod")
        if mod is not None:
            mod.training = mode

    def __getattr__(self, name):
        if name == "_orig_mod":
            return self._modules["_orig_mod"]
        return getattr(self._modules["_orig_mod"], name)

    def __setattr__(self, name, value):
        # Writes go where reads come from: `fast.flag = x` changes the module (eager code
        # reading model.flag sees it), unless the name is the wrapper's own.
        if self._owns(name):
            super().__setattr__(name, value)
        else:
            setattr(self._orig_mod, name, value)

    def __delattr__(self, name):
        if self._owns(name):
            super().__delattr__(name)
        else:
            delattr(self._orig_mod, name)

    def _owns(self, name) -> bool:
        return name == "_orig_mod" or name in self.__dict__ or hasattr(type(self), name) or \
            "_tempa_mod" not in self.__dict__

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(dir(self._orig_mod)))

    def __bool__(self):
        # the wrapper is truthy like the module it stands for (an empty ModuleList is not)
        return bool(self._orig_mod)

    def __reduce__(self):
        """copy.copy, copy.deepcopy and pickle, as for torch's OptimizedModule: the copy wraps
        a copy of the module (deepcopy: a deep copy) and compiles it afresh under the same
        settings. The compiled entries, guards and kernels stay with the original (they read
        its module). The wrapper's own hooks and attributes travel as the state."""
        state = {k: v for k, v in self.__dict__.items() if not k.startswith("_tempa_")}
        return _rebuild_optimized_module, (self._orig_mod, self._tempa_context.settings), state


def _hooks_clear_python(d: dict, mod) -> bool:
    """No hooks to run around the compiled call: the wrapper's own (``d``, its __dict__) and
    its module's (``mod``) hook tables are empty, and no submodule has hooks."""
    m = mod.__dict__
    return not (d["_forward_hooks"] or d["_forward_pre_hooks"] or d["_tempa_hooked"] or
                m["_forward_hooks"] or m["_forward_pre_hooks"] or m["_backward_hooks"] or
                m["_backward_pre_hooks"])


def _hooks_clear_until_native(d: dict, mod) -> bool:
    """``_hooks_clear_python``, until the native guards' build has settled: then the native
    ``hooks_clear`` (the same truth tests in one C call) takes its place, or where it cannot
    be used, ``_hooks_clear_python`` itself."""
    global _hooks_clear
    # (with config.fast_guards off, hooks_clear() is None whatever the build: no choice is
    # made for good then, so turning it on again later still reaches the native test)
    if nativeguards.settled() and config.fast_guards:
        _hooks_clear = nativeguards.hooks_clear() or _hooks_clear_python
    return _hooks_clear_python(d, mod)


# OptimizedModule.__call__'s test for its fast path (see _hooks_clear_until_native)
_hooks_clear = _hooks_clear_until_native


def _rebuild_optimized_module(mod, settings):
    from .api import compile   # (api imports this module)
    return compile(mod, **settings)


_ORIG_MOD = "_orig_mod"


def _drop_orig_mod_prefix(wrapper, state_dict, prefix, local_metadata):
    """state_dict hook: ``prefix + "_orig_mod.fc.weight"`` becomes ``prefix + "fc.weight"``
    (the wrapper has no state of its own, so nothing can collide). torch.compile keeps the
    prefix, which makes its checkpoints fail to load into the eager model."""
    inner = prefix + _ORIG_MOD + "."
    for key in [k for k in state_dict if k.startswith(inner)]:
        state_dict[prefix + key[len(inner):]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:   # per-module versions, keyed by module path without the dot
        for key in [k for k in metadata if k == inner[:-1] or k.startswith(inner)]:
            metadata[(prefix + key[len(inner):]).rstrip(".") if key != inner[:-1]
                     else prefix[:-1]] = metadata.pop(key)


def _add_orig_mod_prefix(wrapper, state_dict, prefix, local_metadata, strict, missing_keys,
                         unexpected_keys, error_msgs):
    """load_state_dict pre-hook: every key under ``prefix`` belongs to the module, so a
    plain (eager) checkpoint gets the ``_orig_mod.`` the module tree needs; one saved from
    torch.compile, which has it already, loads as it is."""
    inner = prefix + _ORIG_MOD + "."
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        state_dict[inner + key[len(prefix):]] = state_dict.pop(key)


def call_module(mod, *args, **kwargs):
    # The eager path runs the module as the user would: its __call__, hooks, forward.
    return mod(*args, **kwargs)
