"""The seed's graph-break model (JaringanPutus): eager vs tempa vs torch.compile, per call.

    python benchmarks/breaks.py

A break costs one extra Python-level step per call (the entry tests the tensor and calls the
resume function's entry); it must not make the model slower than eager by more than about
one extra Python call.
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import tempa  # noqa: E402
from common import per_call_us, seconds  # noqa: E402
from examples.graph_break import JaringanPutus  # noqa: E402  (the seed's model)


def main():
    torch.manual_seed(0)
    model = JaringanPutus()
    x = torch.randn(4, 32)
    rows = []
    for grad in (False, True):
        with torch.set_grad_enabled(grad):
            eager = per_call_us(model, x)
            tempa.reset()
            fast = tempa.compile(model)
            first = seconds(fast, x)
            t = per_call_us(fast, x)
            torch._dynamo.reset()
            dyn = torch.compile(model)
            first_dyn = seconds(dyn, x)
            d = per_call_us(dyn, x)
            rows.append(("grad" if grad else "no_grad", eager, t, first, d, first_dyn))
    print("Seed graph-break model (1 break: `if y.sum() > 0`), batch 4, per call µs (median)")
    print(f"{'mode':8s} {'eager':>8s} {'tempa':>8s} {'ratio':>6s} {'1st call':>9s} "
          f"{'torch.compile':>14s} {'ratio':>6s} {'1st call':>9s}")
    for mode, e, t, f1, d, f2 in rows:
        print(f"{mode:8s} {e:8.1f} {t:8.1f} {e / t:5.2f}x {f1:8.2f}s {d:14.1f} {e / d:5.2f}x {f2:8.2f}s")
    print("(ratio = eager time / compiled time: above 1 is faster than eager)")


if __name__ == "__main__":
    main()
