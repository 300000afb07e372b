"""Triton kernels on disk: one generated module per compiled graph set, compiled in parallel.

Why files: Triton reads a kernel's source with ``inspect``, so generated code must live in a
real file. Files are named by the hash of their text under ``<cache_dir>/triton_src`` and
Triton's own binary cache is pointed at ``<cache_dir>/triton`` (set before Triton is
imported), so a second process finds every kernel compiled and loads the cubins.

Why subprocesses: ``triton.compile`` holds the GIL for most of its work, so threads do not
overlap. Kernels not in Triton's cache are compiled by up to one worker process per core
(``_worker.py``, a plain script that imports only Triton: no re-import of the user's main
module, no CUDA); the parent then calls ``triton.compile`` itself and hits the cache.

Why our own launch: ``kernel[grid](...)`` re-derives its specialization key from every
argument on every call (tens of microseconds for a graph of kernels). We compile each kernel
once for a known signature (pointer dtypes, 16-byte alignment) and call the compiled
launcher directly; the wrapper guarantees the alignment it was compiled for.
"""
from __future__ import annotations

import atexit
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time

from ... import logs
from ...configuration import config

os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(config.cache_dir, "triton"))


def interpret_mode() -> bool:
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def write_module(source: str) -> str:
    digest = hashlib.sha256(source.encode()).hexdigest()[:24]
    d = os.path.join(config.cache_dir, "triton_src")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"k_{digest}.py")
    try:
        with open(path) as f:
            if f.read() == source:
                return path
    except OSError:
        pass
    fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        f.write(source)
    os.replace(tmp, path)          # atomic: a reader never sees half a file
    return path


def load_module(path: str):
    name = "tempa_triton_" + os.path.basename(path)[:-3]
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def target():
    from triton.backends.compiler import GPUTarget
    import torch
    major, minor = torch.cuda.get_device_capability()
    return GPUTarget("cuda", major * 10 + minor, 32)


class Job:
    """One kernel to compile: its name in the module, pointer signature, alignment, warps;
    ``cost``: a guess of its compile time (its source length), to start the slow ones first."""

    def __init__(self, name, signature: dict, aligned: list, num_warps: int, num_stages: int = 1,
                 cost: int = 0):
        self.name, self.signature, self.aligned = name, signature, aligned
        self.num_warps, self.num_stages = num_warps, num_stages
        self.cost = cost

    def as_json(self):
        return {"name": self.name, "signature": self.signature, "aligned": self.aligned,
                "num_warps": self.num_warps, "num_stages": self.num_stages}


def _source(mod, job: Job):
    from triton.compiler.compiler import ASTSource
    fn = getattr(mod, job.name)
    attrs = {(i,): [["tt.divisibility", 16]] for i in job.aligned}
    return ASTSource(fn, dict(job.signature), None, attrs)


def compile_jobs(path: str, jobs: list, parallel_min: int = 3) -> dict:
    """name -> CompiledKernel for every job (from Triton's cache when it has them). Each
    kernel is loaded, and its launcher's build started, as soon as a worker reports it
    compiled, while the workers go on with the others."""
    if not jobs:
        return {}
    mod = load_module(path)
    tgt = target()
    t0 = time.perf_counter()
    out = {}
    by_workers, hits = 0, 0.0          # kernels from workers; time loading them here
    with _Launchers() as launchers:
        for j, from_worker in _as_compiled(path, jobs, tgt, parallel_min):
            t = time.perf_counter()
            out[j.name] = _compile(mod, j, tgt)
            if from_worker:
                by_workers += 1
                hits += time.perf_counter() - t
            launchers.add(out[j.name])
    # the workers' kernels should load here from Triton's cache in milliseconds each
    logs.get("perf").info("triton: %d kernels ready in %.2f s, %d compiled by workers (%.2f s to load them "
                          "here), %d here", len(jobs), time.perf_counter() - t0, by_workers, hits,
                          len(jobs) - by_workers)
    return out


def compile_each(path: str, jobs: list, parallel_min: int = 3) -> dict:
    """name -> CompiledKernel, or the exception its compile raised (autotuning candidates:
    one configuration that does not compile must not stop the others)."""
    if not jobs:
        return {}
    mod = load_module(path)
    tgt = target()
    out = {}
    for j, _ in _as_compiled(path, jobs, tgt, parallel_min):
        try:
            out[j.name] = _compile(mod, j, tgt)
        except Exception as e:  # noqa: BLE001 - reported by the caller, candidate skipped
            out[j.name] = e
    return out


def _compile(mod, job, tgt):
    import triton
    return triton.compile(_source(mod, job), target=tgt,
                          options={"num_warps": job.num_warps, "num_stages": job.num_stages})


def _as_compiled(path, jobs, tgt, parallel_min):
    """(job, compiled by a worker?) for each job once: first those the workers (``_prefill``,
    from ``parallel_min`` jobs on) report compiled, as they report them, so the parent's
    compile is a cache hit; then the rest, which the parent compiles itself.

    While no worker is ready yet (new workers take about a second to import Triton), the
    parent takes the cheapest job left and compiles it itself: a small graph's few kernels
    are then under way at once instead of after that second."""
    given = set()
    if len(jobs) >= parallel_min:
        import collections
        import queue
        import threading
        by_name = {j.name: j for j in jobs}
        done = queue.Queue()
        todo = collections.deque(sorted(jobs, key=lambda j: -j.cost))   # slowest first
        ready = threading.Event()
        workers = threading.Thread(target=_prefill, args=(path, todo, tgt, done),
                                   kwargs={"ready": ready}, daemon=True)
        workers.start()
        while workers.is_alive() or not done.empty():
            try:
                name = done.get(timeout=0.05)
            except queue.Empty:
                if not ready.is_set():
                    try:
                        j = todo.pop()                  # the cheapest, from the other end
                    except IndexError:
                        continue
                    given.add(j.name)
                    yield j, False
                continue
            if name not in given:
                given.add(name)
                yield by_name[name], True
    for j in jobs:
        if j.name not in given:
            yield j, False


class _Launchers:
    """Builds Triton's host-side launchers (one small C module per kernel signature, compiled
    with gcc on first use) in parallel threads, so the wrapper's first launch of each kernel
    finds them in Triton's cache. Why: built lazily they are compiled one after another,
    ~0.3 s each; a GPT has ~20 signatures (6 s of a 12 s compile on the H200, profiled).
    The threads wait on gcc subprocesses, so the GIL does not serialise them; leaving the
    block waits for every build."""

    def __enter__(self):
        from concurrent.futures import ThreadPoolExecutor

        from triton.runtime import driver
        self.launcher_cls = driver.active.launcher_cls   # initialise the driver in this thread
        self.pool = ThreadPoolExecutor(max_workers=min(os.cpu_count() or 1, 16))
        self.seen = set()
        return self

    def add(self, ck):
        src = ck.src
        key = (repr(sorted(getattr(src, "constants", {}).items())), repr(sorted(src.signature.items())))
        if key not in self.seen:
            self.seen.add(key)
            self.pool.submit(self._build, ck)

    def _build(self, ck):
        try:
            self.launcher_cls(ck.src, ck.metadata)
        except Exception:  # noqa: BLE001 - the first launch builds it again and reports
            pass

    def __exit__(self, *exc):
        self.pool.shutdown(wait=True)
        return False


WORKERS = min(os.cpu_count() or 1, 16)
_WAITING: list = []                # idle workers: started by prewarm or kept from a graph


def _spawn():
    worker = os.path.join(os.path.dirname(__file__), "_worker.py")
    p = subprocess.Popen([sys.executable, worker], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, env=dict(os.environ), text=True, bufsize=1)
    p.tempa_owner = os.getpid()
    return p


def _owned(p) -> bool:
    """Did this process start worker ``p``? A process forked from this one (a DataLoader
    worker, say) inherits the idle list, but the pipes are the parent's."""
    return getattr(p, "tempa_owner", None) == os.getpid()


def _idle_worker():
    """An idle worker of this process, or None."""
    while _WAITING:
        p = _WAITING.pop()
        if _owned(p):
            return p
    return None


def prewarm():
    """Start the compile workers now (gpu_backend calls this when a graph is captured).

    Why: each worker spends about a second importing Triton before it can compile; started
    here, that happens while the parent traces, lowers and renders the graph, instead of
    after. Workers stay for the next graph (_prefill hands them back here) and are told to
    exit at interpreter exit (end of input)."""
    if interpret_mode() or any(map(_owned, _WAITING)):
        return
    for _ in range(WORKERS):
        try:
            _WAITING.append(_spawn())
        except OSError:
            break
    import threading
    threading.Thread(target=_hash_triton, daemon=True).start()


def _hash_triton():
    """Triton's cache key starts with a hash of its own files, the 400 MB libtriton
    included, computed on the parent's first compile (0.35 s of a GPT's first call on the
    H200, profiled). hashlib lets go of the GIL while it hashes, so computed here, at
    capture, it overlaps tracing; the result is cached for the process."""
    try:
        from triton.runtime.cache import triton_key
        triton_key()
    except Exception:  # noqa: BLE001 - the first compile computes it, and reports
        pass


@atexit.register
def _release_waiting():
    """At exit: end every idle worker's input (it exits at once), then reap them."""
    idle = [p for p in _WAITING if _owned(p)]
    _WAITING.clear()
    for p in idle:
        _close_pipes(p)            # all at once, so they exit side by side
    for p in idle:
        _stop(p)


def _prefill(path, jobs, tgt, done=None, timeout: float = 600.0, ready=None):
    """Compile ``jobs`` in worker processes so that the parent's compiles are cache hits.

    Why a shared queue and not a fixed share per worker: compile times of one graph's
    kernels differ by 10x (a pointwise add vs a fused layer-norm backward), so fixed shares
    leave most workers idle while one finishes its slow draw. Each worker is handed its next
    job when it reports the last one done, slowest-looking (longest source) first, so the
    last to finish is late by at most about one kernel. ``jobs``: a list, or a deque in
    that order that the caller may take jobs from too (from the other end); ``done``: a
    queue that receives the name of each kernel a worker reports compiled; ``ready``: an
    Event set when the first worker is ready."""
    import collections
    import queue
    import threading

    todo = jobs if isinstance(jobs, collections.deque) else \
        collections.deque(sorted(jobs, key=lambda j: -j.cost))
    done = done if done is not None else queue.Queue()
    n = max(1, min(len(todo), WORKERS))
    head = json.dumps({"path": path, "target": [tgt.backend, tgt.arch, tgt.warp_size],
                       "env": triton_environment(), "backend_hash": _backend_hash(tgt)}) + "\n"
    procs = []
    while len(procs) < n:
        try:
            p = _idle_worker() or _spawn()
            if p.poll() is not None:
                _close_pipes(p)
                continue           # an idle worker that died: start another
            p.stdin.write(head)
            p.stdin.flush()
            procs.append(p)
        except OSError:
            break                  # no (more) subprocesses here: the parent compiles what is left
    finished = []                  # workers that took every job they were given and are idle

    def feed(p):
        try:
            if not p.stdout.readline():          # "ready": Triton imported, module loaded
                return
            if ready is not None:
                ready.set()
            while True:
                try:
                    j = todo.popleft()
                except IndexError:
                    break
                p.stdin.write(json.dumps(j.as_json()) + "\n")
                p.stdin.flush()
                reply = p.stdout.readline()
                if not reply:                    # the worker died: leave the rest to the others
                    return
                if reply.startswith("ok "):
                    done.put(reply.split()[1])
            p.stdin.write("end\n")               # this module is done; wait for the next one
            p.stdin.flush()
            finished.append(p)
        except (OSError, ValueError):
            return
    threads = [threading.Thread(target=feed, args=(p,), daemon=True) for p in procs]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout
    for t, p in zip(threads, procs):
        t.join(max(0.0, deadline - time.monotonic()))
        if t.is_alive():
            p.kill()               # unblocks the feeding thread's read
    for p in procs:
        # Why keep them: a next graph (a graph break, another mode, a recompile) then finds
        # workers with Triton imported instead of waiting about a second for new ones
        if p in finished and p.poll() is None and len(_WAITING) < WORKERS:
            _WAITING.append(p)
        else:
            _stop(p)


def _stop(p):
    _close_pipes(p)                # end of input: the worker exits
    try:
        p.wait(timeout=5)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def _close_pipes(p):
    for pipe in (p.stdin, p.stdout):
        try:
            pipe.close()
        except OSError:
            pass


# Environment variables Triton reads while compiling (its cache directory, the ptxas it
# runs, MLIR/LLVM switches) or puts in its cache key.
TRITON_ENV_PREFIXES = ("TRITON_", "MLIR_", "LLVM_")


def triton_environment() -> dict:
    """This process's Triton environment, which workers compile with (see _backend_hash)."""
    return {k: v for k, v in os.environ.items() if k.startswith(TRITON_ENV_PREFIXES)}


def _backend_hash(tgt):
    """This process's hash of the Triton backend (the ptxas version, cached on first use):
    part of every kernel's cache key, so workers file their results under it.

    Why both this and the environment: a worker keeps the environment it was started with,
    and prewarmed workers start early. torch.compile in the same process sets
    TRITON_PTXAS_PATH (the ptxas shipped with torch) when it first compiles a kernel
    in-process, so workers and parent can run different ptxas builds, and each process
    caches the version it saw first. With different keys, every kernel the workers compiled
    was compiled again here, one after another: in benchmarks/gpu.py (after torch.compile's
    rows) a GPT training step's first call spent 9 s in this process's triton.compile
    (profiled on the H200), against ~3 s for the same step with only torch.compile's
    training row before it. Workers now compile with this process's environment and
    under its backend hash (_worker.py)."""
    try:
        from triton.compiler.compiler import make_backend
        return make_backend(tgt).hash()
    except Exception:  # noqa: BLE001 - workers then use their own (a mismatch costs time only)
        return None


def content_name(body: str, tag: str) -> str:
    """A kernel name derived from its text. Why: Triton's cache key covers the function's
    source, name included; a template instance compiled while autotuning and again in the
    final module must be spelt the same to be compiled once."""
    return f"{tag}_{hashlib.sha256(body.encode()).hexdigest()[:12]}"


def signature(kc) -> dict:
    """The signature of a rendered kernel: tensor pointers, then any size arguments."""
    from ..codegen.triton_emit import SIG
    sig = {f"p{i}": "*" + SIG[b.dtype] for i, b in enumerate(kc.params)}
    # size arguments of shape-generic kernels: plain int64. Compiled from this signature
    # with attributes only for aligned pointers (_source), Triton assumes nothing about
    # their values (no ==1 or %16 specialisation), so one binary serves every size
    sig.update({f"ds{i}": "i64" for i in range(getattr(kc, "nsizes", 0))})
    return sig


def aligned(kc) -> list:
    """Parameters the kernel may assume 16-byte aligned (the wrapper makes sure of it).
    A shape-generic kernel carries the claims that hold at every size (gpu/dynamic.py)."""
    if getattr(kc, "aligned_params", None) is not None:
        return list(kc.aligned_params)
    out = []
    for i, b in enumerate(kc.params):
        item = b.dtype.itemsize
        if b.kind == "input" and getattr(b, "_mutated", False):
            continue
        if ((b.offset + getattr(b, "base_offset", 0)) * item) % 16:
            continue
        out.append(i)
    return out


class Launcher:
    """The compiled launcher of one kernel, bound for the wrapper's direct calls."""

    def __init__(self, ck):
        self.ck = ck
        self.run = ck.run              # loads the cubin into the current context
        self.function = ck.function
        self.meta = ck.packed_metadata
        self.launch, self.cooperative, self.pdl = _c_launch(self.run)


def _c_launch(run):
    """(launch, cooperative, pdl): the wrapper calls ``launch(grid, 1, 1, stream, function,
    cooperative, pdl, global_scratch, profile_scratch, metadata, hooks..., *args)``.

    Why not ``run`` itself: Triton's launcher object wraps its C ``launch`` in a Python
    ``__call__`` that defines a closure and sizes two scratch buffers on every launch, a
    couple of microseconds each time; a GPT at batch 1 makes ~400 launches a call and is
    bound by that host time. A kernel that needs no scratch memory (every kernel tempa
    renders) gets the C function itself, with the arguments ``__call__`` would pass. Any
    other launcher (scratch memory, another Triton's attribute names) keeps ``run``
    behind a shim with the same argument list."""
    launch = getattr(run, "launch", None)
    coop = getattr(run, "launch_cooperative_grid", None)
    pdl = getattr(run, "launch_pdl", None)
    if (launch is not None and coop is not None and pdl is not None
            and getattr(run, "global_scratch_size", 1) == 0 and getattr(run, "profile_scratch_size", 1) == 0):
        return launch, coop, pdl

    def through_run(gx, gy, gz, stream, function, _coop, _pdl, _gs, _ps, *args):
        return run(gx, gy, gz, stream, function, *args)
    return through_run, False, False
