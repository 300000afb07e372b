"""mode="max-autotune": benchmark kernel variants at compile time and keep the fastest.

(Being written: GEMM templates with fused epilogues against cuBLAS.) Until then the mode
compiles exactly like the default one (plus CUDA graphs, as torch.compile's max-autotune).
"""
from __future__ import annotations


class Autotuner:
    def __init__(self, options=None):
        self.options = options or {}
        self.log: list = []
