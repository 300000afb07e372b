"""tempa.compile's arguments: checked at once, and the backend they name resolved to a
callable with torch.compile's ``(gm, example_inputs)`` contract."""
from __future__ import annotations

from . import logs

_fallback_log = logs.get("fallbacks")


def resolve_backend(backend, mode, options):
    if callable(backend):
        return backend
    if backend == "eager":
        def eager_backend(gm, example_inputs):
            return gm.forward   # skips nn.Module.__call__: ~3 µs a call on small graphs
        eager_backend.supports_dynamic = True
        return eager_backend
    if backend == "tempa":
        def tempa_backend(gm, example_inputs):
            try:
                from .backend import tempa_backend as compile_graph
            except ImportError as e:
                _fallback_log.warning("tempa backend unavailable (%s); running the captured "
                                      "graph with ATen ops", e)
                return gm
            return compile_graph(gm, example_inputs, mode=mode, options=options)
        tempa_backend.supports_dynamic = True   # shape-generic code, or per shape inside
        return tempa_backend
    hint = " (torch.compile's backends are not tempa's; tempa's compiler is 'tempa', the " \
        "default)" if backend in _TORCH_BACKENDS else ""
    raise ValueError(f"tempa.compile: unknown backend {backend!r}{hint}; the backends are "
                     "'tempa', 'eager' or a callable (gm, example_inputs) -> callable")


_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_TORCH_BACKENDS = ("inductor", "aot_eager", "aot_eager_decomp_partition", "cudagraphs",
                   "onnxrt", "tvm", "openxla")
# options= keys the tempa backend reads (what they do: the modules named)
OPTIONS = {
    "cudagraph_outputs": "'protect', 'clone' or 'overwrite' (runtime/cudagraphs.py)",
    "max_autotune_gemm_backends": "'triton,aten', 'triton' or 'aten' (gpu/gemm_tune.py)",
    "max_autotune_gemm_configs": "a list of [BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages]",
    "freezing": "True or False (default): CPU inference graphs read Linear weights that are "
                "parameters packed once for MKL, packed again when they change; in-place "
                "changes through .data are not seen (lower/matmul.py, runtime/packed_weights.py)",
}
# options whose values are checked at once: key -> the values accepted
_OPTION_VALUES = {"freezing": (True, False)}


def check_settings(fullgraph, dynamic, mode, options) -> None:
    """tempa.compile's arguments, refused at once with the valid values (a typo accepted
    silently would compile something other than what the user asked for)."""
    if not isinstance(fullgraph, bool):
        raise TypeError(f"tempa.compile: fullgraph must be True or False, not {fullgraph!r}")
    if not isinstance(dynamic, (bool, type(None))):
        raise ValueError(f"tempa.compile: dynamic must be None (automatic), True or False, "
                         f"not {dynamic!r}")
    if mode not in (None, *_MODES):
        raise ValueError(f"tempa.compile: unknown mode {mode!r}; the modes are "
                         f"{', '.join(map(repr, _MODES))}")
    if options is None:
        return
    if not isinstance(options, dict):
        raise TypeError(f"tempa.compile: options must be a dict, not {type(options).__name__}")
    unknown = [k for k in options if k not in OPTIONS]
    if unknown:
        raise ValueError(f"tempa.compile: unknown option(s) {', '.join(map(repr, unknown))}; "
                         "the options are " + "; ".join(f"{k}: {v}" for k, v in OPTIONS.items()))
    for key, accepted in _OPTION_VALUES.items():
        if key in options and not any(options[key] is v for v in accepted):
            raise ValueError(f"tempa.compile: option {key!r} must be one of "
                             f"{', '.join(map(repr, accepted))}, not {options[key]!r}")
