"""The on-disk cache of compiled artifacts.

Layout: ``<cache_dir>/<tempa version>/<kind>/<key[:2]>/<key>.<ext>`` with a sidecar
``.sha256`` holding the hash of the artifact's bytes. Why a sidecar: a truncated write, a
disk error or a file from a different build would otherwise be loaded and run; with it, an
entry whose bytes do not match is treated as missing and rebuilt. Writes go to a temporary
file in the same directory and are moved into place with ``os.replace`` (atomic on POSIX),
data first and hash last, so a concurrent reader sees either nothing or a complete entry.
The directory is created private (0700): a cache entry is code we load and run.
"""
from __future__ import annotations

import hashlib
import os
import tempfile

from ... import logs as _logs
from ...configuration import config

VERSION = "0.1.0-b1"


# configured cache dir -> the private directory used instead when it cannot be written
_unwritable: dict[str, str] = {}


def root() -> str:
    """The cache directory of this tempa version. When the configured one cannot be created
    or written (a read-only mount, a path under a file), the process caches in a private
    temporary directory instead and says so once: a cache is an optimisation, and without
    one every graph would run eagerly."""
    configured = os.path.expanduser(config.cache_dir)
    if configured in _unwritable:
        return _unwritable[configured]
    d = os.path.join(configured, VERSION)
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        if not os.access(d, os.W_OK | os.X_OK):
            raise PermissionError(f"{d} is not writable")
        return d
    except OSError as e:
        fallback = _unwritable[configured] = tempfile.mkdtemp(prefix="tempa-cache-")
        _logs.warn(f"tempa: the disk cache {configured} cannot be written ({e}); compiling "
                      f"into {fallback} for this process only (set TEMPA_CACHE_DIR or "
                      "tempa.config.cache_dir to a writable directory to keep kernels across "
                      "runs)")
        return fallback


def path(kind: str, key: str, ext: str) -> str:
    d = os.path.join(root(), kind, key[:2])
    os.makedirs(d, mode=0o700, exist_ok=True)
    return os.path.join(d, f"{key}.{ext}")


def key_of(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    return h.hexdigest()


def _atomic_write(dst: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(dst), prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, dst)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def store_file(dst: str, src_tmp: str | None = None, data: bytes | None = None) -> None:
    """Install an artifact (from bytes, or by moving ``src_tmp``) and then its hash."""
    if data is None:
        with open(src_tmp, "rb") as f:
            data = f.read()
        os.replace(src_tmp, dst)
    else:
        _atomic_write(dst, data)
    _atomic_write(dst + ".sha256", hashlib.sha256(data).hexdigest().encode())


def load_verified(p: str) -> bytes | None:
    """The artifact's bytes if present and matching its recorded hash, else None."""
    try:
        with open(p + ".sha256", "rb") as f:
            want = f.read().decode().strip()
        with open(p, "rb") as f:
            data = f.read()
    except (OSError, UnicodeDecodeError):
        return None
    if hashlib.sha256(data).hexdigest() != want:
        return None
    return data


def verified(p: str) -> bool:
    return load_verified(p) is not None
