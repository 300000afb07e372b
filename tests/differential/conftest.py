"""The harness compiles hundreds of small graphs: a private disk cache for the package
unless the caller chose one (TEMPA_CACHE_DIR), so a user's cache neither speeds up nor
pollutes the run; tempa's fallback notices are expected here and would only be noise.
Set while these tests run and restored after, so other test directories in the same
session see their own settings."""
import logging
import os
import shutil
import tempfile

import pytest


@pytest.fixture(scope="package", autouse=True)
def _quiet_and_private_cache():
    import tempa
    chosen = os.environ.get("TEMPA_CACHE_DIR")
    private = None if chosen else tempfile.mkdtemp(prefix="tempa-differential-")
    saved_dir, logger = tempa.config.cache_dir, logging.getLogger("tempa")
    saved_level = logger.level
    os.environ["TEMPA_CACHE_DIR"] = chosen or private   # subprocess cases inherit it
    tempa.config.cache_dir = chosen or private
    logger.setLevel(logging.ERROR)
    yield
    tempa.reset()
    tempa.config.cache_dir = saved_dir
    logger.setLevel(saved_level)
    if private:
        del os.environ["TEMPA_CACHE_DIR"]
        shutil.rmtree(private, ignore_errors=True)
