import torch
import torch.fx as fx

from tempa.backend import tempa_backend


class FlatTracer(fx.Tracer):
    """Traces through submodules, so the graph is call_function/call_method + get_attr."""

    def is_leaf_module(self, m, qualname):
        return False


def graph_of(fn_or_module):
    if isinstance(fn_or_module, torch.nn.Module):
        return fx.GraphModule(fn_or_module, FlatTracer().trace(fn_or_module))
    return fx.symbolic_trace(fn_or_module)


def compile_fn(fn, *inputs):
    return tempa_backend(graph_of(fn), list(inputs))


def close(a, b, atol=1e-5, rtol=1e-5):
    if isinstance(a, (tuple, list)):
        return all(close(x, y, atol, rtol) for x, y in zip(a, b)) and len(a) == len(b)
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, atol=atol, rtol=rtol, equal_nan=True)
    return a == b
