"""Seed MLP (Linear(32,64) -> relu -> Linear(64,10), batch 8): eager vs tempa vs torch.compile.

The seed's timing pattern: 10 warm-up calls, then 200 timed calls; median over ROUNDS rounds;
reported per call and as a ratio vs eager, under no_grad and with grad. Also the cold
compile time (empty cache dir, fresh process) and warm (fresh process, cache filled).
Run: python benchmarks/seed_mlp.py [--no-torch-compile] [--backend-only]
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.nn as nn

ROUNDS = 7


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(32, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def seed_setup():
    """The seed's model and input (seed 0), an eager copy made before tempa sees the model
    (its timings never see anything tempa installed), and ``tempa.compile`` of the model:
    (model, x, eager, fast)."""
    import copy
    import tempa
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(8, 32)
    eager = copy.deepcopy(model)
    return model, x, eager, tempa.compile(model)


def tempa_compiled(model, x, backend_only=False):
    """tempa.compile when the frontend is there, else the backend on an FX graph of the MLP."""
    try:
        if backend_only:
            raise RuntimeError
        import tempa
        fast = tempa.compile(model)
        fast(x)
        return fast, "tempa.compile"
    except Exception:   # noqa: BLE001 - frontend not ready: drive the backend directly
        import torch.fx as fx
        from tempa.backend import tempa_backend

        class T(fx.Tracer):
            def is_leaf_module(self, m, q):
                return False
        gm = fx.GraphModule(model, T().trace(model))
        return tempa_backend(gm, [x]), "tempa_backend(fx graph)"


def per_call_us(f, x):
    for _ in range(10):
        f(x)
    times = []
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        for _ in range(200):
            f(x)
        times.append((time.perf_counter() - t0) / 200 * 1e6)
    return statistics.median(times)


def compile_time_child(cache_dir, backend_only=False):
    code = f"""
import time, torch, os
os.environ['TEMPA_CACHE_DIR'] = {cache_dir!r}
import sys; sys.path.insert(0, {os.path.dirname(os.path.abspath(__file__))!r})
from seed_mlp import MLP, tempa_compiled
torch.manual_seed(0)
m = MLP(); x = torch.randn(8, 32)
import tempa.backend
t0 = time.perf_counter()
with torch.no_grad():
    f, how = tempa_compiled(m, x, {backend_only!r})
    f(x)
print(time.perf_counter() - t0)
"""
    env = dict(os.environ, TEMPA_CACHE_DIR=cache_dir)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if out.returncode:
        return float("nan")
    return float(out.stdout.strip().splitlines()[-1])


def main():
    torch.manual_seed(0)
    model = MLP()
    x = torch.randn(8, 32)
    import copy
    eager_model = copy.deepcopy(model)   # eager timings never see anything tempa installed
    fast, how = tempa_compiled(model, x, "--backend-only" in sys.argv)
    rows = []
    use_tc = "--no-torch-compile" not in sys.argv
    tc = torch.compile(model) if use_tc else None
    for mode in ("no_grad", "grad"):
        ctx = torch.no_grad() if mode == "no_grad" else torch.enable_grad()
        with ctx:
            e = per_call_us(eager_model, x)
            t = per_call_us(fast, x)
            c = per_call_us(tc, x) if tc is not None else float("nan")
        rows.append((mode, e, t, c))
    print(f"seed MLP, batch 8, torch {torch.__version__}, {os.cpu_count()} cores; tempa via {how}")
    print(f"{'mode':8} {'eager us':>9} {'tempa us':>9} {'compile us':>11} {'tempa x':>8} {'t.compile x':>12}")
    for mode, e, t, c in rows:
        print(f"{mode:8} {e:9.2f} {t:9.2f} {c:11.2f} {e / t:8.2f} {e / c:12.2f}")
    for backend_only in (False, True):
        with tempfile.TemporaryDirectory() as d:
            cold = compile_time_child(d, backend_only)
            warm = compile_time_child(d, backend_only)
        what = "backend only (FX graph -> callable)" if backend_only else "end to end (first call)"
        print(f"compile, {what}, fresh process, no_grad: cold {cold:.3f} s (empty cache), "
              f"warm {warm:.3f} s (cache filled)")


if __name__ == "__main__":
    main()
