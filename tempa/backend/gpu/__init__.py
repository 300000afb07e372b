"""tempa's GPU backend: the same lowering and scheduling as the CPU, rendered as Triton.

  gpu_backend     (backend.py)   attention rewrite, build with GpuTarget, modes
  compile.py                     lower -> schedule -> partition -> memory -> Triton -> wrapper
  kernels.py                     generated modules on disk, parallel compile, direct launch
  wrapper.py                     the per-call Python (allocations, launches, extern calls)
  dynamic.py                     symbolic sizes: one shape-generic compile (sizes as kernel args)
  attention.py                   softmax(QK^T)V with a causal mask -> scaled_dot_product_attention
  gemm.py, gemm_template.py,     max-autotune: matmul sites and their pointwise epilogues, the
  gemm_tune.py                   Triton GEMM template, tuning it against cuBLAS
The Triton renderer itself is codegen/triton.py (kernels) and codegen/triton_emit.py (the emitter); CUDA graphs and autotuning live in runtime/.
"""
from .backend import GpuTarget, gpu_backend

__all__ = ["gpu_backend", "GpuTarget"]
