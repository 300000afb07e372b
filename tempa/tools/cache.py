"""`tempa cache info|clear`: the on-disk cache of compiled artifacts.

The backend stores each artifact as ``<cache_dir>/<version>/<kind>/<xx>/<key>.<ext>`` with
a ``.sha256`` sidecar (tempa/backend/runtime/diskcache.py). An entry is an artifact with its
sidecar. Clearing deletes exactly those files (and half-written ``.tmp-*`` files), then the
directories left empty, never anything else: TEMPA_CACHE_DIR may point somewhere shared.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class CacheInfo:
    path: str
    exists: bool
    entries: int = 0
    bytes: int = 0
    by_kind: dict = field(default_factory=dict)   # "<version>/<kind>" -> entries


def _walk(root: str):
    """(path, is_entry_file) for every file that belongs to the cache."""
    for d, _dirs, files in os.walk(root):
        names = set(files)
        for f in files:
            p = os.path.join(d, f)
            if f.startswith(".tmp-"):
                yield p, False
            elif f.endswith(".sha256"):
                yield p, False
            elif f + ".sha256" in names:
                yield p, True


def cache_dir() -> str:
    import tempa
    return os.path.abspath(os.path.expanduser(tempa.config.cache_dir))


def info(root: str | None = None) -> CacheInfo:
    root = root or cache_dir()
    ci = CacheInfo(root, os.path.isdir(root))
    if not ci.exists:
        return ci
    for p, is_entry in _walk(root):
        try:
            ci.bytes += os.path.getsize(p)
        except OSError:
            continue
        if is_entry:
            ci.entries += 1
            rel = os.path.relpath(p, root).split(os.sep)
            kind = "/".join(rel[:2]) if len(rel) >= 4 else rel[0]
            ci.by_kind[kind] = ci.by_kind.get(kind, 0) + 1
    return ci


def clear(root: str | None = None) -> tuple[int, int]:
    """Delete the cache's files; returns (entries removed, bytes freed)."""
    root = root or cache_dir()
    if not os.path.isdir(root):
        return 0, 0
    n = freed = 0
    for p, is_entry in list(_walk(root)):
        try:
            size = os.path.getsize(p)
            os.unlink(p)
        except OSError:
            continue
        freed += size
        n += is_entry
    for d, _dirs, _files in sorted(os.walk(root, topdown=False), key=lambda t: -len(t[0])):
        if d != root:
            try:
                os.rmdir(d)   # only succeeds when empty
            except OSError:
                pass
    return n, freed


def human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
