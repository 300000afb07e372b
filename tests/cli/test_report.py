"""`tempa report`: one self-contained HTML page, checked in a real headless browser.

The browser is Debian's chromium (`apt-get install -y chromium`); without it the browser
tests skip with a message saying so, and the structural checks still run.
"""
import os
import re
import subprocess
import textwrap

import pytest

from tempa import cli

from .conftest import example

CHROMIUM = "/usr/bin/chromium"
SECTIONS = ("verdict", "bench", "charts", "graphs", "breaks", "guards", "recompiles",
            "fallbacks", "kernels", "environment")


def _chromium(tmp_path, *args):
    if not os.path.exists(CHROMIUM):
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium "
                    "(apt-get install -y chromium) to run the browser test of the report")
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={tmp_path / 'chromium-profile'}"]
    return subprocess.run([CHROMIUM, *flags, *args], capture_output=True, text=True,
                          timeout=120)


def _report(tmp_path, model, *extra):
    out = tmp_path / "report.html"
    rc = cli.main(["report", model, "-o", str(out), "--first-call", "in-process",
                   "--calls", "200", "--quiet", *extra])
    assert rc == 0
    return out


def _self_contained(html: str):
    # No network: no external scripts, styles, images or fonts.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "@import" not in html and "url(http" not in html


@pytest.fixture(scope="module")
def graph_break_report(tmp_path_factory):
    import tempa
    tmp = tmp_path_factory.mktemp("report")
    saved = tempa.config.cache_dir
    tempa.config.cache_dir = str(tmp / "cache")
    try:
        return _report(tmp, example("graph_break.py"))
    finally:
        tempa.config.cache_dir = saved


def test_report_is_one_self_contained_file(graph_break_report):
    html = graph_break_report.read_text()
    _self_contained(html)
    for sid in SECTIONS:
        assert f"id='{sid}'" in html
    assert "<svg" in html and "chart-per-call" in html and "chart-break-even" in html
    assert "if y.sum() &gt; 0:" in html                   # the break's source line, escaped
    assert "data-dependent branch" in html and "torch.where" in html
    assert "2</b> graphs, <b>1</b> graph breaks, <b>5</b> ops" in html


def test_report_renders_in_chromium(graph_break_report, tmp_path):
    url = graph_break_report.as_uri()
    shot = tmp_path / "report.png"
    p = _chromium(tmp_path, f"--screenshot={shot}", "--window-size=1280,2000", url)
    assert shot.exists(), p.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 30_000          # a blank 1280x2000 page compresses to a few KB
    width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    assert (width, height) == (1280, 2000)

    dom = _chromium(tmp_path, "--dump-dom", url).stdout
    assert 'data-rendered="1"' in dom                    # the inline script ran
    for sid in SECTIONS:
        assert f'id="{sid}"' in dom
    assert "Graph breaks" in dom and "(1)" in dom         # the script's section counts
    assert dom.count("<polyline") >= 3                     # eager, compiled, totals


def test_report_renders_when_compiling_fails(tmp_path, cache_dir, monkeypatch):
    import tempa
    (tmp_path / "failing_backend.py").write_text(textwrap.dedent('''
        def backend(gm, example_inputs):
            raise RuntimeError("this backend cannot compile anything")
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(tempa.config, "raise_on_failure", True)
    out = _report(tmp_path, example("seed_mlp.py"), "--backend", "failing_backend:backend")
    html = out.read_text()
    _self_contained(html)
    assert "compiling failed" in html and "this backend cannot compile anything" in html
    assert "<td>eager</td>" in html                        # the eager numbers are there
    for sid in SECTIONS:
        assert f"id='{sid}'" in html
    if os.path.exists(CHROMIUM):
        dom = _chromium(tmp_path, "--dump-dom", out.as_uri()).stdout
        assert 'data-rendered="1"' in dom and "compiling failed" in dom


def test_recompiles_while_timing_are_listed():
    # The explanation saw no recompile, the timing run did: the section must not say "No".
    from tempa.report import render
    from tempa.tools import bench
    from tempa.tools.explain import Explanation
    mode = bench.ModeResult("default", stats={"recompiles": 8}, fallback_messages=[
        "tempa: f was recompiled 8 times (recompile_limit=8); it runs eagerly from now on"])
    res = bench.BenchResult("m.py", "f", "", "cpu", False, "tempa", 0.0,
                            bench.Timing(1e-3, 1e-3, 1e-3, 0, 1), [], [mode], {})
    html = render._recompiles(Explanation("f", ""), res)
    assert "No recompiles" not in html
    assert "[default] 8 recompiles while timing: tempa: f was recompiled 8 times" in html
