"""The demo (`python examples/demo.py`) tells the seeds' story; `--quick` keeps the test
short by timing the first call in-process (the full demo runs in CI via `make demo`)."""
import os
import subprocess
import sys

from .conftest import EXAMPLES, ROOT


def test_demo_quick(cache_dir):
    env = dict(os.environ, TEMPA_CACHE_DIR=str(cache_dir))
    env.pop("TEMPA_LOGS", None)
    p = subprocess.run([sys.executable, os.path.join(EXAMPLES, "demo.py"), "--quick"],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    out = p.stdout
    for line in ("Tipe hasil tempa.compile : OptimizedModule",
                 "Keluaran sama (atol 1e-5): True",
                 "Jumlah graf : 2", "Graph break : 1", "Jumlah operasi: 5",
                 "batch 8: captures=1 recompiles=0", "batch 9: captures=2 recompiles=1",
                 "graph_break.py:20  if y.sum() > 0:"):
        assert line in out, out
    assert "tempa [default]" in out and "verdict: " in out
    assert "Traceback" not in p.stderr
