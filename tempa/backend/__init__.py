"""tempa's backend: a torch-level FX graph in, a compiled callable out.

Contract (the same as the custom backends of PyTorch's own compiler):
``tempa_backend(gm, example_inputs)`` returns a callable taking the graph's inputs
positionally and returning what ``gm`` returns. The callable carries ``tempa_info`` (``BackendInfo``): generated C++ and wrapper, kernel
count, ATen fallbacks, the fusion report, whether gcc ran or the disk cache served it.

The passes are one list in code, ``pipeline.PASSES`` (each with a one-line comment), shared
by the C++ and Triton targets and by static and shape-generic graphs; every pass's output is
kept and printed by ``compiled.tempa_info.trace()``.

Each call picks the variant cheaply: grad mode on and some input requiring grad -> the
autograd variant, otherwise the inference variant. Each variant is built on first use.
If anything here fails (an unsupported graph, gcc missing or failing), the graph runs
eagerly, with one warning that names the cause: correct results, visible in ``tempa_info``.
"""
from __future__ import annotations

from .entry import BackendInfo, tempa_backend

__all__ = ["tempa_backend", "BackendInfo"]
