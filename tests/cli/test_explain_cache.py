"""`tempa explain` and `tempa cache`."""
import json
import re
import os

from tempa import cli
from tempa.tools import cache as cache_tool

from .conftest import example


def test_explain_graph_break_shows_counts_source_and_hint(run_tempa):
    p = run_tempa("explain", example("graph_break.py"))
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "Graphs: 2    Graph breaks: 1    Ops in graphs: 5" in out
    assert "Break 1: data-dependent branch at " in out and "graph_break.py:20" in out
    assert ">   20 |         if y.sum() > 0:" in out          # the user's line, marked
    assert "hint: " in out and "torch.where" in out
    assert re.search(r"guards \(\d+\):", out) and "x is a Tensor" in out


def test_explain_seed_shows_recompile_from_extra_inputs(capsys, cache_dir):
    assert cli.main(["explain", example("seed_mlp.py"), "--no-code"]) == 0
    out = capsys.readouterr().out
    assert "Graphs: 1    Graph breaks: 0    Ops in graphs: 3" in out
    assert "Recompiles:\n  - recompiling JaringanKecil.forward" in out
    assert "shape (8, 32)" in out


def _fake_cache(root):
    for kind, key in (("so", "ab12"), ("so", "cd34"), ("src", "ef56")):
        d = root / "0.1.0-b1" / kind / key[:2]
        d.mkdir(parents=True, exist_ok=True)
        (d / f"{key}.bin").write_bytes(b"x" * 100)
        (d / f"{key}.bin.sha256").write_text("0" * 64)
    (root / "0.1.0-b1" / "so" / "ab" / ".tmp-zzz").write_bytes(b"half")


def test_cache_info_and_clear(capsys, cache_dir):
    _fake_cache(cache_dir)
    (cache_dir / "NOT_OURS.txt").write_text("keep me")
    assert cli.main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"tempa disk cache: {cache_dir}" in out and "entries: 3" in out
    assert cli.main(["cache", "info", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["entries"] == 3 and info["by_kind"] == {"0.1.0-b1/so": 2, "0.1.0-b1/src": 1}
    assert info["bytes"] == 3 * 100 + 3 * 64 + 4
    assert cli.main(["cache", "clear"]) == 0
    assert "removed 3 entries" in capsys.readouterr().out
    assert cache_tool.info(str(cache_dir)).entries == 0
    assert (cache_dir / "NOT_OURS.txt").exists()          # only the cache's own files go
    assert not (cache_dir / "0.1.0-b1").exists()


def test_cache_info_when_missing(capsys, cache_dir):
    assert cli.main(["cache", "info"]) == 0
    assert "does not exist yet" in capsys.readouterr().out
    assert not os.path.exists(cache_dir)
