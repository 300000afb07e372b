"""Shared helpers for the CLI tests: run `python -m tempa ...` as a user would, with a
private disk cache so tests never touch (or depend on) ~/.cache/tempa."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    import tempa
    d = tmp_path / "cache"
    monkeypatch.setenv("TEMPA_CACHE_DIR", str(d))
    monkeypatch.setattr(tempa.config, "cache_dir", str(d))
    return d


@pytest.fixture
def run_tempa(cache_dir):
    def run(*args, timeout=300):
        env = dict(os.environ, TEMPA_CACHE_DIR=str(cache_dir),
                   PYTHONPATH=os.pathsep.join([ROOT] + [p for p in
                                               [os.environ.get("PYTHONPATH")] if p]))
        env.pop("TEMPA_LOGS", None)
        return subprocess.run([sys.executable, "-m", "tempa", *map(str, args)], cwd=ROOT,
                              capture_output=True, text=True, env=env, timeout=timeout)
    return run


def example(name: str) -> str:
    return os.path.join(EXAMPLES, name)
