"""The harness compiles hundreds of small graphs: a private disk cache for the session
unless the caller chose one (TEMPA_CACHE_DIR), so a user's cache neither speeds up nor
pollutes the run; tempa's fallback notices are expected here and would only be noise."""
import logging
import os
import shutil
import tempfile

import pytest

if "TEMPA_CACHE_DIR" not in os.environ:
    _dir = tempfile.mkdtemp(prefix="tempa-differential-")
    os.environ["TEMPA_CACHE_DIR"] = _dir

    def _remove_cache():
        shutil.rmtree(_dir, ignore_errors=True)
else:
    def _remove_cache():
        pass


@pytest.fixture(scope="session", autouse=True)
def _quiet_and_private_cache():
    import tempa
    tempa.config.cache_dir = os.environ["TEMPA_CACHE_DIR"]
    logging.getLogger("tempa").setLevel(logging.ERROR)
    yield
    tempa.reset()
    _remove_cache()
