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

import importlib

_config_mod = importlib.import_module("tempa.config")  # the module, even if tempa.config is re-exported as the object

VERSION = "0.1.0-b1"


def root() -> str:
    d = os.path.join(os.path.expanduser(_config_mod.config.cache_dir), VERSION)
    os.makedirs(d, mode=0o700, exist_ok=True)
    return d


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
