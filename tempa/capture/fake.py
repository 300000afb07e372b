"""Fake tensors without importing Dynamo.

Fake tensors reach into ``torch._dynamo`` in two ways, neither of which needs Dynamo
itself:
  - ``FakeTensorMode`` reads a few flags of ``torch._dynamo.config`` (when it is created,
    and on its slow dispatch path);
  - ``__torch_dispatch__`` of every dispatch mode, and the reference implementations that
    fake kernels fall back on (layer norm, mean, ...), are wrapped by
    ``torch._disable_dynamo``, which on its first call imports Dynamo to make the
    function's Dynamo-disabled form (``torch._dynamo.disable(fn)``) and caches it on the
    function (``fn.__dynamo_disable``).
Importing ``torch._dynamo`` runs all of Dynamo, and sympy with it: about 3 s. Profiled on
the H200, that was 3.1-3.7 s of a GPT's 5.3-8.0 s first call (capture runs fake tensors
from the first operation without a metadata rule; under autocast, before meta.py modelled
it, that was the first one).

So while tempa's fake tensors of static sizes are created or run, and only while Dynamo
is not imported, ``torch._dynamo`` is a stand-in:
  - ``config`` is the real config module, loaded from its file without running the
    package (the package, imported later, finds it loaded and keeps it);
  - ``disable(fn)`` is ``fn``: Dynamo not imported cannot be tracing anything, so the
    disabled form of a function is the function itself. The forms cached this way are
    removed when the block ends, so that a Dynamo imported later makes its own;
  - importing a submodule imports the real package first (``_SubmoduleFinder``);
  - any other name imports the real package, which then replaces the stand-in for good
    (probes of dunder attributes, which inspect makes on every module, are answered "no
    such attribute").
Where the config file is not where this torch keeps it, nothing is replaced and PyTorch
imports Dynamo as usual.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.abc
import importlib.util
import os
import sys
import types

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

_PACKAGE = "torch._dynamo"
_CONFIG = "torch._dynamo.config"
_DISABLED = "__dynamo_disable"     # torch._disable_dynamo's cache attribute


class _DynamoStandIn(types.ModuleType):
    """``torch._dynamo`` while it is not imported: ``config`` and ``disable`` only."""

    def __init__(self, config):
        super().__init__(_PACKAGE)
        self.config = config
        # a package, so that importing a submodule reaches the finder below
        self.__path__ = [os.path.dirname(config.__file__)]
        self.disabled: list = []           # functions given their own disabled form

    def disable(self, fn=None, recursive=True, **kwargs):
        if fn is None:                     # decorator form: disable(recursive=...)(fn)
            return lambda f: self.disable(f, recursive, **kwargs)
        self.disabled.append(fn)
        return fn

    def __getattr__(self, name):
        # Probes of module attributes (inspect.getmodule reads every module's __file__)
        # must not import Dynamo in the middle of someone else's import.
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(_import_real(self), name)


def _import_real(stand_in):
    if sys.modules.get(_PACKAGE) is stand_in:
        del sys.modules[_PACKAGE]
    if vars(torch).get("_dynamo") is stand_in:
        del torch._dynamo
    return importlib.import_module(_PACKAGE)


class _SubmoduleFinder(importlib.abc.MetaPathFinder):
    """While the stand-in is ``torch._dynamo``: an import of one of its submodules imports
    the real package first (which imports most of them), then answers with the module
    it loaded. Why not load the submodule under the stand-in: Dynamo's modules import
    each other in the order its __init__ sets; one loaded alone meets half-initialised
    others, and the package imported later would not bind it as its attribute."""

    def __init__(self, stand_in):
        self.stand_in = stand_in

    def find_spec(self, name, path, target=None):
        if not name.startswith(_PACKAGE + ".") or sys.modules.get(_PACKAGE) is not self.stand_in:
            return None
        _import_real(self.stand_in)
        module = importlib.import_module(name)     # loaded by the package, or now under it
        spec = importlib.util.spec_from_loader(name, _Loaded(module))
        # The import system, seeing the module loaded meanwhile, goes on with the module's
        # own __spec__ and would run its file again (a second copy of every class in it):
        # until _Loaded puts it back, the module's spec is this one.
        module.__spec__ = spec
        return spec


class _Loaded(importlib.abc.Loader):
    """Hands the import system a module that is already loaded, unchanged."""

    def __init__(self, module):
        self.module = module
        self.spec = module.__spec__

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        module.__spec__ = self.spec


def _config_alone():
    """The config module, loaded from its file without running the package's __init__;
    None where that is not possible (the caller then lets PyTorch import as usual)."""
    if _CONFIG in sys.modules:
        return sys.modules[_CONFIG]
    path = os.path.join(os.path.dirname(torch.__file__), "_dynamo", "config.py")
    if not os.path.isfile(path):
        return None
    spec = importlib.util.spec_from_file_location(_CONFIG, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_CONFIG] = module
    try:
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001 - a torch whose config needs its package: import it whole
        sys.modules.pop(_CONFIG, None)
        return None
    return sys.modules[_CONFIG]


@contextlib.contextmanager
def without_dynamo_import():
    """Within this block, fake tensors do not import Dynamo (see the module doc)."""
    if _PACKAGE in sys.modules or "_dynamo" in vars(torch):
        yield                       # imported already, or our stand-in (a nested block)
        return
    config = _config_alone()
    if config is None:
        yield
        return
    stand_in = _DynamoStandIn(config)
    finder = _SubmoduleFinder(stand_in)
    sys.modules[_PACKAGE] = stand_in
    torch._dynamo = stand_in
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        if sys.modules.get(_PACKAGE) is stand_in:
            del sys.modules[_PACKAGE]
        if vars(torch).get("_dynamo") is stand_in:
            del torch._dynamo
        for fn in stand_in.disabled:
            if getattr(fn, "__dict__", {}).get(_DISABLED) is fn:
                delattr(fn, _DISABLED)


def new_fake_mode(shape_env=None) -> FakeTensorMode:
    """A fake mode for capture. With symbolic sizes (``shape_env``) Dynamo is imported as
    usual: those fake tensors name their sizes' sources with Dynamo's classes."""
    if shape_env is not None:
        return FakeTensorMode(allow_non_fake_inputs=False, shape_env=shape_env)
    with without_dynamo_import():
        return FakeTensorMode(allow_non_fake_inputs=False)


@contextlib.contextmanager
def running(mode: FakeTensorMode):
    """``with mode:``, without importing Dynamo where the mode is static."""
    if mode.shape_env is not None:
        with mode:
            yield
        return
    with without_dynamo_import(), mode:
        yield
