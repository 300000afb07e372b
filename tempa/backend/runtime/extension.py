"""tempa's own small CPython extensions (fast kernel calls, native tensor guards): built
once with the system compiler, kept in the disk cache, loaded by path.

Each is compiled the first time it is needed (or in a background thread started early,
so that its compiler run overlaps other work), stored in the disk cache under a key of
its source and everything the binary depends on, and shared by every process after.
Where it cannot be built or loaded, its user gets None and keeps a slower Python path.
"""
from __future__ import annotations

import importlib.machinery
import importlib.util
import logging
import os
import subprocess
import tempfile
import threading
from typing import Callable

from . import diskcache

_log = logging.getLogger("tempa.perf")


def build_cached(name: str, kind: str, source: str, language: str, key_parts: tuple,
                 command: Callable[[str, str], list], timeout: int):
    """The extension module ``name`` compiled from ``source``: loaded from the disk cache
    (``kind``) when one built from the same source and ``key_parts`` is there, else
    compiled with ``command(source_path, so_path)`` (``language``: the source file's
    suffix, "c" or "cpp") and stored first."""
    so = _cached_path(kind, source, key_parts)
    if diskcache.verified(so):
        try:
            return _load(name, so)
        except ImportError as e:
            # the hash matches but the loader refuses it (another machine's build): rebuild
            _log.info("cached %s extension %s cannot be loaded (%s); rebuilding it", kind, so, e)
    _compile(source, language, command, timeout, so)
    return _load(name, so)


def is_cached(kind: str, source: str, key_parts: tuple) -> bool:
    """Whether ``build_cached`` with these arguments would find its module in the disk cache
    (loading it is then fast; building it may not be)."""
    return diskcache.verified(_cached_path(kind, source, key_parts))


def _cached_path(kind: str, source: str, key_parts: tuple) -> str:
    key = diskcache.key_of(source, *key_parts, importlib.machinery.EXTENSION_SUFFIXES[0])
    return diskcache.path(kind, key, "so")


def _compile(source: str, language: str, command, timeout: int, so: str) -> None:
    fd, src = tempfile.mkstemp(dir=os.path.dirname(so), prefix=".src-", suffix="." + language)
    with os.fdopen(fd, "w") as f:
        f.write(source)
    tmp_so = src[:-len(language)] + "so"
    try:
        proc = subprocess.run(command(src, tmp_so), capture_output=True, text=True,
                              timeout=timeout)
    finally:
        os.unlink(src)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-1000:])
    diskcache.store_file(so, src_tmp=tmp_so)


def _load(name: str, so: str):
    loader = importlib.machinery.ExtensionFileLoader(name, so)
    spec = importlib.util.spec_from_file_location(name, so, loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


class BuiltOnce:
    """An extension built at most once per process: ``get()`` builds it (or waits for the
    build under way) and returns the module, or None after a failure, said once in the
    perf log as ``unavailable`` plus the error."""

    def __init__(self, build: Callable, unavailable: str, thread_name: str):
        self._build = build
        self._unavailable = unavailable
        self._thread_name = thread_name
        self._lock = threading.Lock()
        self._state: dict = {}   # "module" -> the module or None; "thread" -> its builder

    def get(self):
        if "module" not in self._state:
            with self._lock:
                if "module" not in self._state:
                    try:
                        self._state["module"] = self._build()
                    except Exception as e:  # noqa: BLE001 - any failure: the Python path
                        _log.info("%s: %s", self._unavailable, e)
                        self._state["module"] = None
        return self._state["module"]

    def settled(self) -> bool:
        """Whether ``get()`` has its answer (the module or None) without waiting."""
        return "module" in self._state

    def prebuild(self) -> None:
        """Start the build in a background thread; a no-op once built or started."""
        if "module" in self._state or "thread" in self._state:
            return
        with self._lock:
            if "module" in self._state or "thread" in self._state:
                return
            self._state["thread"] = threading.Thread(target=self.get, name=self._thread_name,
                                                     daemon=True)
        self._state["thread"].start()
