"""Where a grad-mode call of the seed MLP spends its microseconds, layer by layer.

The compiled call is a stack of callables; each is timed on its own with the arguments the
one above passes it, so each layer's cost is its time minus the time of the one it calls:

  call       ``fast(x)``: the OptimizedModule, the dispatcher, the entry and all below
  entry      the generated entry function (guards, then the compiled callable)
  compiled   the backend's callable: picks the variant (functorch/forward-AD, grad mode)
  apply      the training variant: tempa's native autograd node (runtime/nativeautograd.py:
             edges, the outputs' history, the saved values) or, where that extension is
             not built, ``autograd.Function`` apply (its node, ctx, edges, output wrapping)
  forward    the Function's generated forward (a plain object as ctx); the native node has
             none (it calls fw_call itself), so this layer reads ~0 there
  fw_call    the compiled forward: allocations, data pointers, the kernel
  kernel     the generated C++ alone (both matmuls, bias, ReLU), on preallocated buffers
  alloc      one allocation by the wrapper's allocator (the extension's ``empty_strided``
             or ``torch.empty_strided``; fw_call makes two: the output, the saved ReLU)

Timing as in guard_cost.py: warm-up, rounds of 200 calls interleaved over the callables,
median of the rounds, the calling thread's CPU time; ``--runs`` fresh processes (default 3),
medians over them. Eager (grad mode) is timed in the same rounds.

    python benchmarks/guard_cost.py            # guards, before and after
    python benchmarks/grad_breakdown.py        # this breakdown
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

CHILD = r"""
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
from common import interleaved_us
from seed_mlp import seed_setup

model, x, eager, fast = seed_setup()
fast(x)
(entry,) = [e for c in fast._tempa_context.caches.values() for e in c.entries]
args = (x, *entry.captured.attr_tensors)
cells = dict(zip(entry.compiled.__code__.co_freevars,
                 [c.cell_contents for c in entry.compiled.__closure__]))
apply = cells["state"].train_fn
native = hasattr(apply, "fw_call")     # tempa's native autograd node (runtime/nativeautograd.py)
forward = None if native else apply.__self__.forward
fw_call = apply.fw_call if native else forward.__globals__["fw_call"]
fw_cells = dict(zip(fw_call.__code__.co_freevars, [c.cell_contents for c in fw_call.__closure__]))
kernel, empty_strided = fw_cells["_S0"], fw_cells["_empty_strided"]
outs = fw_call(*args)
pointers = [t.data_ptr() for t in (outs[1], outs[0])] + [a.data_ptr() for a in args]


class Ctx:
    pass


timed = {
    "eager": (eager, (x,)), "call": (fast, (x,)), "entry": (entry.fn, (model, x)),
    "compiled": (entry.compiled, args), "apply": (apply, args),
    "forward": (fw_call if native else lambda *a: forward(Ctx(), *a), args),
    "fw_call": (fw_call, args),
    "kernel": (kernel, pointers),
    "alloc": (lambda: empty_strided((8, 64), (64, 1), dtype=torch.float32), ()),
}
out, _wall = interleaved_us(timed)
out["native"] = native
out["allocator"] = empty_strided.__module__ or ""
print(json.dumps(out))
"""


def measure() -> dict:
    bench = os.path.dirname(os.path.abspath(__file__))
    run = subprocess.run([sys.executable, "-c", CHILD, bench], capture_output=True, text=True)
    if run.returncode:
        raise SystemExit(run.stderr.strip().splitlines()[-1:])
    return json.loads(run.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    runs = int(argv[argv.index("--runs") + 1]) if "--runs" in argv else 3
    per_run = [measure() for _ in range(runs)]
    node = "native node" if per_run[0].pop("native") else "autograd.Function"
    allocator = per_run[0].pop("allocator")
    for r in per_run[1:]:
        r.pop("native"), r.pop("allocator")
    m = {k: statistics.median(r[k] for r in per_run) for k in per_run[0]}
    layers = [
        ("OptimizedModule + dispatcher", m["call"] - m["entry"]),
        ("entry: guards, frame, output", m["entry"] - m["compiled"]),
        ("variant choice (functorch/forward-AD/grad mode)", m["compiled"] - m["apply"]),
        (f"{node}: edges, history, saved values", m["apply"] - m["forward"]),
        ("generated forward (ctx tuple, slicing)", m["forward"] - m["fw_call"]),
        (f"two allocations (output, saved ReLU; {allocator})", 2 * m["alloc"]),
        ("kernel launch glue (data_ptr reads, call)", m["fw_call"] - m["kernel"] - 2 * m["alloc"]),
        ("generated C++ kernel", m["kernel"]),
    ]
    print(f"seed MLP, batch 8, grad mode, {runs} fresh processes, medians, thread CPU µs per call "
          f"(load average {os.getloadavg()[0]:.1f})")
    print(f"eager {m['eager']:.2f}   tempa {m['call']:.2f}   speedup {m['eager'] / m['call']:.2f}x")
    for name, us in layers:
        print(f"  {name:50} {us:6.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
