import os
import tempfile

import pytest


@pytest.fixture(autouse=True, scope="package")
def _private_cache():
    """The backend tests get their own cache dir (the disk-cache tests need a known state);
    package scope: restored before other packages' tests run (they check the default)."""
    from tempa import config as cfg
    old, old_env = cfg.cache_dir, os.environ.get("TEMPA_CACHE_DIR")
    d = tempfile.mkdtemp(prefix="tempa-test-cache-")
    cfg.cache_dir = d
    os.environ["TEMPA_CACHE_DIR"] = d
    yield d
    cfg.cache_dir = old
    if old_env is None:
        os.environ.pop("TEMPA_CACHE_DIR", None)
    else:
        os.environ["TEMPA_CACHE_DIR"] = old_env


@pytest.fixture(params=["native", "autograd.Function"])
def autograd_path(request):
    """Which training node the graphs compiled in the test use (their ``forward.autograd``):
    tempa's native autograd node, or torch.autograd.Function."""
    import tempa
    from tempa.backend.runtime import nativeautograd
    old = tempa.config.native_autograd
    if request.param == "native":
        if nativeautograd.module() is None:     # builds it (once per cache dir)
            pytest.skip("the native autograd extension cannot be built here")
    else:
        tempa.config.native_autograd = False
    yield request.param
    tempa.config.native_autograd = old
