"""``gpu_backend``: the CUDA side of ``tempa_backend``.

  attention     rewrite softmax(QK^T * s + causal mask) V into scaled_dot_product_attention
                (attention.py), guarded by a cheap per-call check of the mask buffer
  build         entry.build with GpuTarget: trace, lower (shared with the CPU), schedule,
                Triton kernels, wrapper (compile.py); training through the same
                autograd.Function as the CPU path
  mode          "reduce-overhead": replay as CUDA graphs (runtime/cudagraphs.py);
                "max-autotune": GEMM epilogue templates vs cuBLAS (runtime/autotune.py)
"""
from __future__ import annotations

import torch

from ..variant_target import VariantTarget, conv_layout_option
from . import compile as gc

# The modes whose graphs replay as CUDA graphs (as torch.compile's max-autotune, the tuned
# graph does too); "max-autotune-no-cudagraphs" tunes without them.
CUDAGRAPH_MODES = ("reduce-overhead", "max-autotune")


class GpuTarget(VariantTarget):
    """Triton kernels, and by mode CUDA graphs and autotuning (a VariantTarget)."""
    name = "cuda"

    def __init__(self, examples, info, mode=None, options=None):
        self.info = info                 # the graph's BackendInfo: training CUDA graphs note into it
        self.params = frozenset(i for i, t in enumerate(examples) if isinstance(t, torch.nn.Parameter))
        self.mode = mode
        self.options = options or {}
        self.autotune = None
        if mode in ("max-autotune", "max-autotune-no-cudagraphs"):
            from ..runtime.autotune import Autotuner
            self.autotune = Autotuner(self.options)

    @staticmethod
    def decomps():
        return gpu_decomps()

    @staticmethod
    def conv_layout() -> str:
        """Channels-last convolutions by default (config.gpu_conv_layout, lower/layout.py)."""
        return conv_layout_option("gpu_conv_layout")

    def _plan(self, gm, num_outputs, mutated, n_in, label, prefix=""):
        params = self.params if label in ("inference", "forward") else frozenset()
        return gc.plan_graph(gm, num_outputs, mutated, n_in, label, prefix, params, self.autotune)

    def compile_graph(self, gm, num_outputs, mutated, n_in, label):
        return gc.finish([self._plan(gm, num_outputs, mutated, n_in, label)])[0]

    def build_training(self, joint, n_in, single):
        from ..autograd import build_training
        return build_training(joint, n_in, single, plan_fn=self._plan, finish_fn=gc.finish,
                              graph_calls=self._training_graphs(joint))

    def _training_graphs(self, joint):
        """reduce-overhead / max-autotune: the forward and backward replay as CUDA graphs."""
        if self.mode not in CUDAGRAPH_MODES:
            return None
        from ..runtime.cudagraphs import training_graphs
        return training_graphs(self.info, self.options, joint)


_DECOMPS = None


def gpu_decomps() -> dict:
    """The CPU's decomposition table plus: fused attention always computes its logsumexp.

    Why: the forward is traced on inputs that do not require grad, so SDPA picks
    ``compute_log_sumexp=False``; the joint trace then replays that call with grad and the
    backward reads a logsumexp that was never written (NaN, or an illegal address)."""
    global _DECOMPS
    if _DECOMPS is None:
        from ..lower.decomps import table
        aten = torch.ops.aten
        d = dict(table())

        def with_lse(op, pos):
            def dec(*args, **kwargs):
                if len(args) > pos and args[pos] is False:
                    args = args[:pos] + (True,) + args[pos + 1:]
                    return op(*args, **kwargs)
                if kwargs.get("compute_log_sumexp") is False:
                    kwargs = dict(kwargs, compute_log_sumexp=True)
                    return op(*args, **kwargs)
                return NotImplemented
            return dec
        eff = getattr(aten, "_scaled_dot_product_efficient_attention", None)
        if eff is not None:
            d[eff.default] = with_lse(eff.default, 4)
        cudnn = getattr(aten, "_scaled_dot_product_cudnn_attention", None)
        flash = getattr(aten, "_scaled_dot_product_flash_attention", None)
        if cudnn is not None:
            cudnn_lse = with_lse(cudnn.default, 4)

            def cudnn_to_flash(q, k, v, attn_bias=None, compute_lse=False, dropout_p=0.0, is_causal=False,
                               return_debug_mask=False, *, scale=None):
                # Why not cuDNN: its backward, called with the forward's q view but k/v in other
                # layouts (as a compiled graph may pass them), returned wrong gradients and
                # faulted on the H200 (torch 2.11). Flash has the same outputs, any layout.
                if attn_bias is None and q.dtype in (torch.float16, torch.bfloat16) and flash is not None \
                        and q.shape[-1] <= 256:
                    return flash.default(q, k, v, dropout_p, is_causal, return_debug_mask, scale=scale)
                return cudnn_lse(q, k, v, attn_bias, compute_lse, dropout_p, is_causal, return_debug_mask,
                                 scale=scale)
            d[cudnn.default] = cudnn_to_flash
        _DECOMPS = d
    return _DECOMPS


def gpu_backend(gm: torch.fx.GraphModule, example_inputs, *, mode: str | None = None,
                options: dict | None = None):
    from ..entry import _dynamic_dims, build
    from . import attention
    from .kernels import prewarm
    prewarm()                            # Triton workers start while the graph is traced
    options = dict(options or {})
    example_inputs = list(example_inputs)

    def make(graph):
        from ..entry import BackendInfo
        info = BackendInfo()
        target = GpuTarget(example_inputs, info, mode, options)
        dims = _dynamic_dims(graph)
        if dims:
            # symbolic sizes: one shape-generic compile for every size (gpu/dynamic.py),
            # or per-shape code where that cannot be made (said in tempa_info.dynamic)
            from .dynamic import GpuDynamicTarget
            target = GpuDynamicTarget(dims, target)
        compiled = build(graph, example_inputs, target, info)
        info.notes.append(f"device: cuda, mode: {mode or 'default'}")
        if mode in CUDAGRAPH_MODES:
            from ..runtime.cudagraphs import wrap
            used = [bool(n.users) for n in graph.graph.nodes if n.op == "placeholder"]
            compiled = wrap(compiled, example_inputs, info, options, used)
        return compiled

    rewritten, guard = attention.rewrite(gm, example_inputs)
    if guard is None:
        return make(gm)
    fast = make(rewritten)
    info = fast.tempa_info
    info.notes.append(guard.describe())
    return guard.wrap(fast, lambda: make(gm), info)


# Graphs with symbolic sizes get shape-generic kernels (or per-shape ones, said in tempa_info).
gpu_backend.supports_dynamic = True
