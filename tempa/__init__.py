"""tempa: a just-in-time compiler for PyTorch.

    fast = tempa.compile(model)      # nothing happens yet
    fast(x)                          # capture + compile on the first call, then cached
"""
from .configuration import config
from .api import OptimizedModule, compile, disable, entries, eager_reasons, explain, mark_dynamic, mark_static, recompile_reasons, reset, stats
from .capture.breaks import GraphBreakError
from .api import stance_decisions
from .stance import RecompileError, set_stance

__all__ = ["compile", "OptimizedModule", "disable", "entries", "eager_reasons", "explain", "mark_dynamic", "mark_static", "recompile_reasons", "reset", "stats", "config",
           "GraphBreakError", "set_stance", "stance_decisions", "RecompileError"]
__version__ = "0.1.0"
