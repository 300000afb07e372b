"""Settings a user types in the shell: a typo gets a message that names it and what is
valid, never a silent no-op or a traceback at import."""
import logging
import os
import subprocess
import sys

import pytest

from tempa import cli, configuration, logs



@pytest.mark.parametrize("spec", ["grpahs", "graph", "graphs,nope"])
def test_unknown_log_channel_is_an_error_listing_the_channels(spec):
    with pytest.raises(ValueError) as e:
        logs.parse(spec)
    assert "unknown log channel" in str(e.value)
    assert "graphs, guards, recompiles" in str(e.value)


def test_plus_prefix_is_verbose_and_all_is_every_channel():
    assert logs.parse("+graphs, guards") == {"graphs": logging.DEBUG, "guards": logging.INFO}
    assert set(logs.parse("all")) == set(logs.CHANNELS)


def test_bad_environment_value_warns_and_keeps_the_default(monkeypatch):
    monkeypatch.setenv("TEMPA_RECOMPILE_LIMIT", "abc")
    monkeypatch.setenv("TEMPA_DISK_CACHE", "maybe")
    with pytest.warns(UserWarning) as record:
        cfg = configuration._from_environment()
    assert cfg.recompile_limit == configuration.Config().recompile_limit
    assert cfg.disk_cache is True
    text = " ".join(str(w.message) for w in record)
    assert "TEMPA_RECOMPILE_LIMIT='abc' ignored (expected an integer)" in text
    assert "TEMPA_DISK_CACHE='maybe' ignored" in text


def test_import_with_a_bad_environment_value_does_not_fail():
    env_code = "import tempa; print(tempa.config.recompile_limit)"
    env = dict(os.environ, TEMPA_RECOMPILE_LIMIT="abc")
    out = subprocess.run([sys.executable, "-c", env_code], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "8"
    assert "TEMPA_RECOMPILE_LIMIT='abc' ignored" in out.stderr


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("tempa ") and "torch " in out
