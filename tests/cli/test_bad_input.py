"""Bad input: one line naming what is missing and the convention, exit status 2, no
traceback (unless --debug)."""
import textwrap

import pytest

from tempa import cli

from .conftest import example

CASES = {
    "missing": (None, "no such file"),
    "no_model.py": ("import torch\nx = 1\n", "defines neither `model` nor `make()`"),
    "no_inputs.py": ("import torch\nmodel = torch.nn.Linear(2, 2)\n",
                     "defines `model` but not `example_inputs`"),
    "raises.py": ("import torch\n\n1 / 0\n", "raised ZeroDivisionError: division by zero "
                                             "(line 3) while being loaded"),
    "bad_inputs.py": ("import torch\nmodel = torch.nn.Linear(2, 2)\nexample_inputs = 3\n",
                      "`example_inputs` is a int; it must be a tuple"),
    "eager_fails.py": ("import torch\nmodel = torch.nn.Linear(2, 2)\n"
                       "example_inputs = (torch.randn(3, 5),)\n",
                       "raised RuntimeError: mat1 and mat2 shapes cannot be multiplied"),
    "make_wrong.py": ("def make():\n    return 42\n", "returned int, not (model, example_inputs)"),
    "exits.py": ("import sys\nsys.exit(3)\n", "called sys.exit(3) while being loaded"),
}


def _write(tmp_path, name):
    src, expect = CASES[name]
    path = tmp_path / name
    if src is not None:
        path.write_text(textwrap.dedent(src))
    return path, expect


# Every case through bench; the loader is shared, so three cases each for the others.
COMBOS = [("bench", n) for n in sorted(CASES)] + [
    (c, n) for c in ("explain", "report") for n in ("missing", "no_model.py", "raises.py")]


@pytest.mark.parametrize("command,name", COMBOS)
def test_bad_target_one_line_exit_2(tmp_path, capsys, cache_dir, name, command):
    path, expect = _write(tmp_path, name)
    extra = ["--quiet", "--first-call", "in-process"] if command != "explain" else []
    if command == "report":
        extra += ["-o", str(tmp_path / "r.html")]
    assert cli.main([command, str(path), *extra]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"tempa {command}: error: ")
    assert expect in lines[0]
    assert "Traceback" not in err
    if name in ("missing", "no_model.py", "no_inputs.py"):
        assert "must define `model`" in lines[0]


def test_debug_shows_the_traceback(tmp_path):
    path, _ = _write(tmp_path, "raises.py")
    with pytest.raises(ZeroDivisionError):
        cli.main(["explain", str(path), "--debug"])


def test_bad_options(capsys, cache_dir):
    assert cli.main(["bench", example("seed_mlp.py"), "--mode", "fastest", "--quiet"]) == 2
    assert "--mode fastest: unknown mode" in capsys.readouterr().err
    assert cli.main(["bench", example("seed_mlp.py"), "--backend", "nope:x", "--quiet"]) == 2
    assert "--backend nope:x: cannot import it" in capsys.readouterr().err


def test_exit_status_and_stderr_of_the_real_command(run_tempa, tmp_path):
    p = run_tempa("bench", tmp_path / "nothing_here.py")
    assert p.returncode == 2
    assert p.stdout == ""
    (line,) = p.stderr.strip().splitlines()
    assert "nothing_here.py: no such file" in line and "example_inputs" in line


def test_help_documents_the_convention_and_schema(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "example_inputs" in out and "make()" in out and '"tempa.bench/1"' in out
    assert "break_even_calls" in out and "first call" in out
    assert cli.main([]) == 2
