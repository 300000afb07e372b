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


# A big graph's C++ is compiled as several translation units at once, one per core, then
# linked: one gcc process uses one core, and its time grows with the source. Swin-T's
# training forward (76 segments, 217 KB): 4.2-5.0 s as one unit, 3.4-3.6 s as two on this
# 2-core machine with a test run on the other core. Below PARALLEL_MIN_BYTES the extra
# processes and the prelude parsed in each cost more than they save.
PARALLEL_MIN_BYTES = 64_000
MAX_JOBS = 8


def _jobs() -> int:
    try:
        return max(1, min(MAX_JOBS, len(os.sched_getaffinity(0))))
    except (AttributeError, OSError):
        return max(1, min(MAX_JOBS, os.cpu_count() or 1))


def _units(prelude: str, segments: list, jobs: int) -> list:
    """The segments in ``jobs`` groups of about equal size (largest first into the smallest
    group), each a translation unit with the prelude (declarations and static inline
    helpers only, so each unit may have its own copy)."""
    groups = [[] for _ in range(min(jobs, len(segments)))]
    sizes = [0] * len(groups)
    for seg in sorted(segments, key=len, reverse=True):
        i = sizes.index(min(sizes))
        groups[i].append(seg)
        sizes[i] += len(seg)
    return [prelude + "\n\n" + "\n\n".join(g) + "\n" for g in groups]


def _compile_in_parts(exe: str, units: list, out_so: str, workdir: str) -> bool:
    """Compile ``units`` concurrently and link them into ``out_so``; False where any step
    failed (the caller then builds the whole source as one unit, which reports the error)."""
    d = tempfile.mkdtemp(dir=workdir, prefix=".parts-")
    try:
        flags = [f for f in FLAGS if f != "-shared"]
        objs, procs = [], []
        for i, text in enumerate(units):
            src = os.path.join(d, f"u{i}.cpp")
            with open(src, "w") as f:
                f.write(text)
            objs.append(src[:-4] + ".o")
            procs.append(subprocess.Popen([exe, *flags, "-c", "-o", objs[-1], src],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        ok = True
        for proc in procs:
            try:
                ok = proc.wait(timeout=300) == 0 and ok
            except subprocess.TimeoutExpired:
                proc.kill()
                ok = False
        if not ok:
            return False
        link = subprocess.run([exe, "-shared", "-fPIC", "-fopenmp", "-o", out_so, *objs, *omp_link()],
                              capture_output=True, text=True, timeout=300)
        return link.returncode == 0
    except OSError:
        return False
    finally:
        shutil.rmtree(d, ignore_errors=True)


def build(source: str, prelude: str | None = None, segments: list | None = None):
    """Returns (ctypes.CDLL, so_path, from_cache). ``source`` is the whole library's C++;
    where it is big and the caller gives its ``prelude`` and ``segments`` (the functions
    it is made of, ``source`` being them after the prelude), they are compiled on several
    cores at once."""
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
    jobs = _jobs()
    if segments and len(segments) > 1 and jobs > 1 and len(source) >= PARALLEL_MIN_BYTES \
            and _compile_in_parts(exe, _units(prelude, segments, jobs), tmp_so, d):
        proc = None
    else:
        try:
            proc = subprocess.run([exe, *FLAGS, "-o", tmp_so, src, *omp_link()], capture_output=True,
                                  text=True, timeout=300)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BuildError(f"C++ compiler {cxx!r} failed to run: {e}") from e
    if proc is not None and proc.returncode != 0:
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
