"""Compile generated C++ into a shared library with gcc and load it with ctypes.

One library per graph (all its segments), so one gcc run and one ``dlopen``. The cache key
covers everything that changes the machine code: the source, the flags, the compiler's
version and the CPU (``-march=native`` code is not portable across CPUs).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile

from ... import counters, logs as _logs
from ...configuration import config
from . import diskcache

FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c++17",
         "-fno-math-errno", "-w"]


class BuildError(Exception):
    pass


@functools.lru_cache(None)
def omp_link() -> tuple:
    """Link flags that bind our OpenMP calls to the runtime PyTorch itself loaded.

    Why: one OpenMP runtime means one thread pool and one wait policy. A second runtime
    (gcc's own libgomp next to a wheel's renamed copy) keeps a second set of threads that
    spin after each of our parallel loops while PyTorch's threads want the same cores. With
    ``--as-needed`` the implicit ``-lgomp`` is dropped once PyTorch's copy resolved the calls.
    (In this venv both are ``libgomp.so.1`` and the loader already shares one: measured.)"""
    try:
        import glob

        import torch
        root = os.path.dirname(torch.__file__)
        libs = sorted(glob.glob(os.path.join(root, "lib", "libgomp*.so*")) +
                      glob.glob(os.path.join(root, os.pardir, "torch.libs", "libgomp*.so*")))
    except Exception:  # noqa: BLE001 - no torch copy: gcc's own libgomp
        libs = []
    mvec = ("-lmvec",) if ctypes.util.find_library("mvec") else ()   # vector libm (cpp.prelude)
    if not libs:
        return ("-Wl,--as-needed",) + mvec
    lib = os.path.realpath(libs[0])
    return ("-Wl,--as-needed", lib, f"-Wl,-rpath,{os.path.dirname(lib)}") + mvec


@functools.lru_cache(None)
def compiler_id(cxx: str) -> str:
    exe = shutil.which(cxx) if not os.path.isabs(cxx) else (cxx if os.path.exists(cxx) else None)
    if exe is None:
        raise BuildError(f"C++ compiler {cxx!r} not found (set tempa.config.cxx or TEMPA_CXX)")
    try:
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30)
    except OSError as e:
        raise BuildError(f"cannot run C++ compiler {cxx!r}: {e}") from e
    return exe + "\n" + out.stdout.splitlines()[0] if out.stdout else exe


@functools.lru_cache(None)
def cpu_id() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            txt = f.read()
        lines = [l for l in txt.splitlines() if l.startswith(("model name", "flags"))][:2]
        return platform.machine() + hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
    except OSError:
        return platform.machine() + platform.processor()


def build(source: str):
    """Returns (ctypes.CDLL, so_path, from_cache)."""
    cxx = config.cxx
    comp = compiler_id(cxx)
    key = diskcache.key_of(source, " ".join(FLAGS + list(omp_link())), comp, cpu_id(), diskcache.VERSION)
    if config.disk_cache:
        so = diskcache.path("cpp", key, "so")
        if diskcache.verified(so):
            lib = _load_cached(so)
            if lib is not None:
                counters.bump("disk_cache_hits")
                return lib, so, True
    else:
        so = os.path.join(tempfile.mkdtemp(prefix="tempa-"), f"{key}.so")
    d = os.path.dirname(so)
    fd, src = tempfile.mkstemp(dir=d, prefix=".src-", suffix=".cpp")
    with os.fdopen(fd, "w") as f:
        f.write(source)
    tmp_so = src[:-4] + ".so"
    exe = comp.split("\n")[0]
    counters.bump("gcc_runs")
    try:
        proc = subprocess.run([exe, *FLAGS, "-o", tmp_so, src, *omp_link()], capture_output=True, text=True,
                              timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(f"C++ compiler {cxx!r} failed to run: {e}") from e
    finally:
        pass
    if proc.returncode != 0:
        try:
            os.unlink(src)
        except OSError:
            pass
        raise BuildError(f"C++ compiler {cxx!r} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}\n"
                         f"source kept at {src.replace('.src-', 'failed-')}" if _keep(src) else
                         f"C++ compiler {cxx!r} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    os.unlink(src)
    if config.disk_cache:
        diskcache.store_file(so, src_tmp=tmp_so)
    else:
        os.replace(tmp_so, so)
    try:
        return ctypes.CDLL(so), so, False
    except OSError as e:
        raise BuildError(f"the library gcc just built cannot be loaded: {e}") from e


_warned_unloadable = False


def _load_cached(so: str):
    """The cached library at ``so``, or None when it cannot be loaded (then it is rebuilt).

    Why: its bytes match their hash, yet ``dlopen`` can still refuse it (built against
    another glibc on a shared home directory, copied from another machine). A cache entry
    is only an optimisation, so the call recompiles instead of raising."""
    global _warned_unloadable
    try:
        return ctypes.CDLL(so)
    except OSError as e:
        if not _warned_unloadable:
            _warned_unloadable = True
            _logs.warn(f"tempa: a cached kernel library cannot be loaded ({e}); rebuilding it; "
                          "if this repeats, run `tempa cache clear` once.")
        return None


def _keep(src):
    return False
