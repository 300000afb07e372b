"""`--stance` on the CLI: stance "auto" decides within explain's and bench's calls and
both say what it chose (issue 20, stances)."""
from .conftest import example


def test_explain_with_stance_auto_says_what_it_kept(run_tempa):
    p = run_tempa("explain", example("seed_mlp.py"), "--stance", "auto", "--backend", "tempa",
                  "--no-code")
    assert p.returncode == 0, p.stderr
    tail = p.stdout.split("\nStance:\n", 1)
    assert len(tail) == 2, p.stdout
    assert "stance auto: JaringanKecil.forward" in tail[1]
    assert "runs compiled code" in tail[1] or "runs eager" in tail[1]
    assert "interleaved calls each, on live inputs" in tail[1]


def test_bench_with_force_eager_compiles_nothing(run_tempa):
    p = run_tempa("bench", example("seed_mlp.py"), "--stance", "force_eager", "--first-call",
                  "in-process", "--calls", "30", "--quiet", "--json", "-")
    assert p.returncode == 0, p.stderr
    import json
    (m,) = json.loads(p.stdout)["modes"]
    assert m["stats"]["captures"] == 0 and m["graphs"] == 0


def test_unknown_stance_is_bad_input(run_tempa):
    p = run_tempa("explain", example("seed_mlp.py"), "--stance", "sometimes")
    assert p.returncode == 2 and "invalid choice" in p.stderr
