"""tempa's backend: a torch-level FX graph in, a compiled callable out.

Contract (the same as the custom backends of PyTorch's own compiler):
``tempa_backend(gm, example_inputs)`` returns a callable taking the graph's inputs
positionally and returning what ``gm`` returns. The callable carries ``tempa_info`` (``BackendInfo``): generated C++ and wrapper, kernel
count, ATen fallbacks, the fusion report, whether gcc ran or the disk cache served it.

The pipeline, top to bottom:

  prepare          lift get_attr tensors to inputs (never bake parameter values)
  trace_forward    run the graph on private clones under a recording dispatch mode and
                   torch.func.functionalize: a functional ATen graph + which inputs it mutates
  compile_graph    lower -> schedule -> C++ -> gcc -> wrapper (compile_graph.py)
  [symbolic sizes] the same passes at a few sizes, interpolated into one shape-generic
                   template (sizes become kernel arguments), or per shape (dynamic.py)
  [training]       trace_training: trace a forward that keeps ops with good derivative
                   formulas whole (softmax, layer norm...), replay it with grad and record
                   the backward (trace_joint), partition into forward (outputs + saved)
                   and backward graphs, compile both, and wrap them in one
                   torch.autograd.Function (autograd.py)

Each call picks the variant cheaply: grad mode on and some input requiring grad -> the
autograd variant, otherwise the inference variant. Each variant is built on first use.
If anything here fails (an unsupported graph, gcc missing or failing), the graph runs
eagerly, with one warning that names the cause: correct results, visible in ``tempa_info``.
"""
from __future__ import annotations

from .entry import BackendInfo, tempa_backend

__all__ = ["tempa_backend", "BackendInfo"]
