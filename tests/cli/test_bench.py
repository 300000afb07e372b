"""`tempa bench`: the table, the verdict, the JSON schema, first-call measurement."""
import json

import pytest

from tempa.tools import bench
from tempa.tools.load import load

from .conftest import example

MODE_KEYS = {"mode", "ok", "error", "first_call_cold_s", "first_call_warm_s",
             "first_call_in_process_s", "first_call_method", "median_s", "q1_s", "q3_s",
             "iqr_s", "calls", "speedup", "graphs", "kernels", "break_even_calls",
             "break_even_calls_warm", "eager_after_s", "stats", "fallback_messages",
             "reasons", "verdict", "speedup_ci", "rounds"}


def test_bench_seed_mlp_table_and_json(run_tempa, tmp_path):
    out = tmp_path / "bench.json"
    p = run_tempa("bench", example("seed_mlp.py"), "--first-call", "in-process",
                  "--calls", "300", "--quiet", "--json", out)
    assert p.returncode == 0, p.stderr
    assert "tempa bench: JaringanKecil(Tensor[8, 32] float32)" in p.stdout
    assert "first call cold" in p.stdout and "break-even" in p.stdout
    assert "tempa [default]" in p.stdout
    verdict = [l for l in p.stdout.splitlines() if l.startswith("[default] ")]
    assert verdict and any(w in verdict[0] for w in ("pays off after", "slower than eager",
                                                     "does not pay off", "cannot tell"))
    data = json.loads(out.read_text())
    assert data["schema"] == "tempa.bench/1"
    assert set(data["target"]) == {"spec", "name", "inputs", "device", "no_grad", "backend"}
    assert {"tempa", "torch", "python", "cpu"} <= set(data["environment"])
    assert set(data["eager"]) == {"first_call_s", "median_s", "q1_s", "q3_s", "iqr_s", "calls"}
    (m,) = data["modes"]
    assert set(m) == MODE_KEYS
    assert m["ok"] and m["mode"] == "default" and m["graphs"] == 1
    assert m["stats"]["graph_breaks"] == 0 and m["stats"]["captures"] == 1
    assert m["calls"] == 300 and data["eager"]["calls"] == 300
    assert m["first_call_cold_s"] > 0 and m["first_call_warm_s"] is None
    assert m["median_s"] > 0 and m["q1_s"] <= m["median_s"] <= m["q3_s"]
    lo, hi = m["speedup_ci"]
    assert m["rounds"] == bench.ROUNDS and 0 < lo <= m["speedup"] <= hi
    assert ("cannot tell" in m["verdict"]) == (lo <= 1.0 <= hi)
    assert abs(m["speedup"] - data["eager"]["median_s"] / m["median_s"]) < 1e-9   # one table
    if m["speedup"] > 1 + bench.NOISE and "cannot tell" not in m["verdict"]:
        assert m["break_even_calls"] >= 1
        assert f"{m['break_even_calls']:,} calls" in m["verdict"]


def test_bench_json_stdout(run_tempa):
    p = run_tempa("bench", example("graph_break.py"), "--first-call", "in-process",
                  "--calls", "50", "--backend", "eager", "--json", "-")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    (m,) = data["modes"]
    assert data["target"]["backend"] == "eager"
    assert m["graphs"] == 2 and m["stats"]["graph_breaks"] == 1


def test_first_call_cold_and_warm_in_fresh_processes(cache_dir):
    """Cold and warm first calls come from two fresh processes sharing one disk cache."""
    res = bench.run(load(example("seed_mlp.py")), calls=50, progress=False)
    (m,) = res.modes
    assert m.ok and m.first_call_method == "subprocess"
    assert m.first_call_cold_s > 0 and m.first_call_warm_s > 0
    assert res.to_json()["modes"][0]["first_call_warm_s"] == m.first_call_warm_s


def _mode(**kw):
    m = bench.ModeResult("default", first_call_cold_s=2.0, first_call_warm_s=0.5,
                         timing=bench.Timing(kw.pop("compiled"), 0, 0, 0, 100), graphs=1)
    for k, v in kw.items():
        setattr(m, k, v)
    return m


EAGER = bench.Timing(20e-6, 19e-6, 21e-6, 2e-6, 100)


def test_break_even_and_verdict_when_compiled_is_faster():
    m = _mode(compiled=10e-6, stats={})
    bench._conclude(m, EAGER)
    # 2.0 + (n - 1) * 10us <= n * 20us  ->  n >= (2.0 - 10e-6) / 10e-6 = 199,999
    assert m.break_even_calls == 199_999
    assert m.break_even_calls_warm == 49_999
    assert m.verdict.startswith("compiling pays off after 199,999 calls (49,999 with a warm")


@pytest.mark.parametrize("stats,msgs,graphs,expect", [
    ({"graph_breaks": 1}, [], 2, "of graph breaks"),
    ({"eager_fallbacks": 1}, ["tempa: running f eagerly: unsupported"], 0,
     "runs the whole forward eagerly"),
    ({}, ["tempa backend unavailable (x); running the captured graph with ATen ops"], 1,
     "fell back to running the captured graph"),
    ({}, [], 1, "per-call overhead"),
])
def test_verdict_names_why_compiled_is_slower(stats, msgs, graphs, expect):
    m = _mode(compiled=30e-6, stats=stats, fallback_messages=msgs, graphs=graphs)
    bench._conclude(m, EAGER)
    assert m.break_even_calls is None
    assert m.verdict.startswith("compiled is slower than eager here (0.67x) because ")
    assert expect in m.verdict


def test_about_the_same_is_not_a_win():
    m = _mode(compiled=19.8e-6, stats={})
    bench._conclude(m, EAGER)
    assert m.verdict.startswith("compiling does not pay off here")


def test_fmt_and_table():
    assert bench.fmt_time(1.5) == "1.50 s"
    assert bench.fmt_time(0.0025) == "2.50 ms"
    assert bench.fmt_time(12.34e-6) == "12.3 µs"
    assert bench.break_even(1.0, 2e-6, 3e-6) is None


def test_no_kernel_compiled_gives_no_verdict():
    # A missing C++ compiler: the graph ran with ATen calls; a "pays off" verdict would lie.
    m = _mode(compiled=10e-6, stats={}, kernels=0, fallback_messages=[
        "C++ build failed: C++ compiler '/nonexistent' not found; running this graph with "
        "eager ATen calls instead"])
    bench._conclude(m, EAGER)
    assert m.verdict.startswith("nothing was compiled (C++ build failed")
    assert "pays off" not in m.verdict


def test_training_mode_dropout_is_not_compared():
    import torch
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5))
    assert bench.random_modules_in_training(model) == ["1: Dropout(p=0.5)"]
    assert bench.random_modules_in_training(model.eval()) == []
    mha = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=16)
    assert any("MultiheadAttention(p=0.1)" in n for n in bench.random_modules_in_training(mha))


def test_bench_of_a_train_mode_dropout_model_does_not_fail(tmp_path):
    import torch
    from tempa.tools.load import Target
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5))
    target = Target("m.py", model, (torch.randn(4, 8),))
    res = bench.run(target, first_call="in-process", calls=30, progress=False)
    m = res.modes[0]
    assert m.ok, m.error
    assert any("outputs not compared" in msg for msg in m.fallback_messages)


def test_speedup_interval_is_a_seeded_bootstrap_over_rounds():
    rounds = [([20 + i % 3] * 5, [10 + (i * 7) % 3] * 5) for i in range(12)]
    lo, hi = bench.speedup_interval(rounds)
    assert (lo, hi) == bench.speedup_interval(rounds)        # the same samples, the same interval
    assert 20 / 12 <= lo <= bench._speedup_of(rounds) <= hi <= 22 / 10
    assert bench.speedup_interval(rounds[:2]) is None          # too few rounds to say


def test_interval_spanning_one_cannot_tell():
    m = _mode(compiled=19e-6, stats={}, speedup_ci=(0.82, 1.31), rounds=12)
    bench._conclude(m, EAGER)
    assert m.verdict.startswith("cannot tell at this noise whether compiled is faster: 1.05x, "
                                "95% interval 0.82x-1.31x over 12 interleaved rounds")
    assert "pays off" not in m.verdict and "because" not in m.verdict
    assert m.break_even_calls is None and "?" in bench.table(bench.BenchResult(
        "m", "m", "", "cpu", False, "tempa", 0.0, EAGER, [], [m], {}))


def test_interval_above_one_states_the_verdict_with_it():
    m = _mode(compiled=10e-6, stats={}, speedup_ci=(1.8, 2.2), rounds=12)
    bench._conclude(m, EAGER)
    assert m.verdict.startswith("compiling pays off after 199,999 calls")
    assert m.verdict.endswith("(95% interval 1.80x-2.20x)")


def test_interleaved_eager_is_the_speedups_base():
    m = _mode(compiled=10e-6, stats={}, eager_timing=bench.Timing(30e-6, 0, 0, 0, 100))
    bench._conclude(m, EAGER)            # EAGER (alone, 20 µs) only feeds the interference note
    assert m.speedup == pytest.approx(3.0)
