"""First-call (compile) time on the GPU, each system in a fresh process with empty caches.

    python benchmarks/gpu_first_call.py                    # tempa and torch.compile, every row
    python benchmarks/gpu_first_call.py --rows b8,train    # some rows (mlp, b1, b8, train)

Why fresh processes: in one process the second compiler finds the first one's imports done
and its compile workers still busy. Each child builds the model (benchmarks/gpu.py's rows),
then times ``compile`` + the first call + synchronise, importing the compiler included.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import warnings


ROWS = {"mlp": "mlp", "b1": "gpt_b1", "b8": "gpt_b8", "train": "gpt_train"}


def child(system: str, which: str) -> float:
    for v in ("TEMPA_CACHE_DIR", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR"):
        os.environ[v] = tempfile.mkdtemp()
    warnings.simplefilter("ignore")
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    import torch
    from benchmarks.gpu import make_rows
    key = ROWS[which]
    row = make_rows([key])[key]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    if system == "tempa":
        import tempa
        fn = tempa.compile(row["model"])
    else:
        fn = torch.compile(row["model"])
    if row["train"]:
        logits, loss = fn(*row["args"])
        loss.backward()
    else:
        with torch.no_grad():
            fn(*row["args"])
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main():
    if len(sys.argv) == 3 and sys.argv[1] in ("tempa", "torch.compile"):
        print(f"{child(sys.argv[1], sys.argv[2]):.2f}")
        return
    rows = list(ROWS)
    if "--rows" in sys.argv:
        rows = sys.argv[sys.argv.index("--rows") + 1].split(",")
    print(f"{'model':8s} {'tempa s':>8s} {'torch.compile s':>16s} {'ratio':>6s}")
    for which in rows:
        t = {}
        for system in ("tempa", "torch.compile"):
            out = subprocess.run([sys.executable, __file__, system, which], capture_output=True, text=True)
            lines = out.stdout.strip().splitlines()
            t[system] = float(lines[-1]) if out.returncode == 0 and lines else float("nan")
        print(f"{which:8s} {t['tempa']:8.2f} {t['torch.compile']:16.2f} {t['tempa'] / t['torch.compile']:6.2f}", flush=True)


if __name__ == "__main__":
    main()
