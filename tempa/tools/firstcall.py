"""Time ONE first call of a compiled model in a fresh process: what a user pays on start-up.

    python -m tempa.tools.firstcall SPEC --mode default --backend tempa --device cpu [--no-grad]

`tempa bench` runs this twice per mode with the same TEMPA_CACHE_DIR: the first run starts
from an empty disk cache (cold), the second finds it filled by the first (warm). A fresh
process is the honest measurement: in the bench's own process, imports, loaded libraries and
Python caches left by earlier compiles would make a "second compile" look cheaper than any
user's restart. The model is run once eagerly before the timed call, so torch's own lazy
start-up is not charged to compiling.

Prints one line ``TEMPA_FIRSTCALL {json}`` on stdout (the user's file may print too).
"""
from __future__ import annotations

import argparse
import json
import sys
import time

MARKER = "TEMPA_FIRSTCALL "


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tempa.tools.firstcall")
    p.add_argument("spec")
    p.add_argument("--mode", default="default")
    p.add_argument("--backend", default="tempa")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-grad", action="store_true")
    a = p.parse_args(argv)

    import contextlib
    import torch
    import tempa
    from .bench import resolve_backend, sync_for
    from .load import TargetError, check_eager, load

    try:
        target = load(a.spec).to(a.device)
        grad = torch.no_grad() if a.no_grad else contextlib.nullcontext()
        sync = sync_for(a.device)
        with grad:
            check_eager(target)
            sync()
            compiled = tempa.compile(target.model, mode=None if a.mode == "default" else a.mode,
                                     backend=resolve_backend(a.backend))
            t0 = time.perf_counter()
            compiled(*target.args, **target.kwargs)
            sync()
            first = time.perf_counter() - t0
    except TargetError as e:
        print(MARKER + json.dumps({"ok": False, "error": str(e)}), flush=True)
        return 2
    except Exception as e:  # the compile failed: report it, the bench records it
        print(MARKER + json.dumps({"ok": False, "error": f"{type(e).__name__}: {e}"}), flush=True)
        return 1
    s = tempa.stats()
    print(MARKER + json.dumps({"ok": True, "first_call_s": first,
                               "disk_cache_hits": s.disk_cache_hits, "gcc_runs": s.gcc_runs,
                               "kernels_compiled": s.kernels_compiled}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
