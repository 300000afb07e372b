"""The numbers of `tempa explain` and the report agree with each other (issue 20, point 7)."""
import os

import tempa
from tempa.report import render
from tempa.tools import bench, explain
from tempa.tools.load import load

from .conftest import ROOT

MODEL = os.path.join(ROOT, "docs", "report_example.py")


def test_recompiles_listed_once_each_and_the_stance_is_not_a_fallback(cache_dir):
    ex = explain.explain(load(MODEL), backend="eager")
    # extra_inputs: batch 4 after 16 recompiles the forward and the resume function once each
    assert [r.split(" (")[0] for r in ex.recompiles] == [
        "recompiling SmallCNN.forward", "recompiling SmallCNN.forward.<resume at line 20>"]
    assert any("the size of x changed in dim(s) [0]" in n for n in ex.notes)
    res = bench.BenchResult("m", "m", "", "cpu", False, "eager", 0.0,
                            bench.Timing(1e-3, 1e-3, 1e-3, 0, 10), [], [
                                bench.ModeResult("default", fallback_messages=[
                                    "stance auto: f runs eager: compiled 2 ms vs eager 1 ms"])], {})
    html = render._fallbacks(ex, res)
    assert html.count("data-item") == 0 and "Stance auto: what each function kept" in html
    html = render._recompiles(ex, res)
    assert html.count("<li data-item>") == 2
    tempa.reset()
