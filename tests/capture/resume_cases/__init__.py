"""Helpers for tests/capture/test_resume.py and test_liveness.py.

``tempa/__init__.py`` imports torch, which is not installed for the 3.12/3.13 runs here;
the modules under test (tempa.capture.liveness and .resume) must not need it. Without
torch, register bare package objects for ``tempa`` and ``tempa.capture`` (their
``__init__`` not executed) so that those submodules import on their own.
"""

import importlib.util
import os
import sys
import types

if importlib.util.find_spec("torch") is None and "tempa" not in sys.modules:
    _root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    for _name, _sub in (("tempa", "tempa"), ("tempa.capture", os.path.join("tempa", "capture"))):
        _m = types.ModuleType(_name)
        _m.__path__ = [os.path.join(_root, _sub)]
        sys.modules[_name] = _m
    sys.modules["tempa"].capture = sys.modules["tempa.capture"]
