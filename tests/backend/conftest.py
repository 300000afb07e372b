import os
import tempfile

import pytest


@pytest.fixture(autouse=True, scope="session")
def _private_cache():
    """Each test session gets its own cache dir (the disk-cache tests need a known state)."""
    import importlib
    cfg = importlib.import_module("tempa.config").config
    old = cfg.cache_dir
    d = tempfile.mkdtemp(prefix="tempa-test-cache-")
    cfg.cache_dir = d
    os.environ["TEMPA_CACHE_DIR"] = d
    yield d
    cfg.cache_dir = old
