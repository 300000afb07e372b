"""The GPU backend's compile workers (gpu/kernels.py), run without a GPU: Triton compiles for
sm_90 with the ptxas it ships, so only Triton is needed."""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_MODULE = '''
import triton
import triton.language as tl

@triton.jit
def k_add(p0, p1, p2):
    i = tl.arange(0, 128)
    tl.store(p2 + i, tl.load(p0 + i) + tl.load(p1 + i))

@triton.jit
def k_mul(p0, p1, p2):
    i = tl.arange(0, 128)
    tl.store(p2 + i, tl.load(p0 + i) * tl.load(p1 + i))

@triton.jit
def k_bad(p0, p1, p2):
    tl.store(p2 + tl.arange(0, 100), 1.0)   # not a power of two: does not compile
'''


def test_workers_compile_each_job_once_report_failures_and_close_their_pipes(tmp_path):
    (tmp_path / "mod.py").write_text(_MODULE)
    child = textwrap.dedent(f"""
        import gc, os, queue, sys
        os.environ["TEMPA_CACHE_DIR"] = {str(tmp_path / "cache")!r}
        from tempa.backend.gpu import kernels as K
        from triton.backends.compiler import GPUTarget
        sig = {{"p0": "*fp32", "p1": "*fp32", "p2": "*fp32"}}
        jobs = [K.Job(n, sig, [0, 1, 2], 4) for n in ("k_add", "k_mul", "k_bad")]
        done = queue.Queue()
        K._prefill({str(tmp_path / "mod.py")!r}, jobs, GPUTarget("cuda", 90, 32), done)
        got = []
        while not done.empty():
            got.append(done.get())
        gc.collect()
        print(sorted(got))
    """)
    p = subprocess.run([sys.executable, "-W", "always::ResourceWarning", "-c", child], capture_output=True,
                       text=True, env=_child_env(), timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "['k_add', 'k_mul']", p.stderr[-3000:]   # k_bad: reported failed
    assert "ResourceWarning" not in p.stderr, p.stderr[-2000:]


_KERNELS = "\n".join(f"""
@triton.jit
def k{i}(p0, p1, p2):
    j = tl.arange(0, 128)
    tl.store(p2 + j, tl.load(p0 + j) * {i} + tl.load(p1 + j))
""" for i in range(6))

# A child's helper: compile a module as compile_jobs does (each job as _as_compiled hands it
# over). Reports whether workers compiled any of it, whether each kernel is in Triton's
# cache once (a kernel a worker compiled under another key would be compiled again here and
# filed twice), and whether this process compiled some itself.
_COMPILE_MODULE = """
def compile_module(path, names):
    import glob
    jobs = [K.Job(n, sig, [0, 1, 2], 4) for n in names]
    mod = K.load_module(path)
    from_workers = 0
    for j, from_worker in K._as_compiled(path, jobs, tgt, 1):
        K._compile(mod, j, tgt)
        from_workers += from_worker
    cache = os.environ["TRITON_CACHE_DIR"]
    once = all(len(glob.glob(os.path.join(cache, "*", n + ".json"))) == 1 for n in names)
    return from_workers > 0, once, from_workers < len(names)
"""


def _child_env():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in [k for k in env if k.startswith("TRITON_")]:
        env.pop(k)                 # TRITON_INTERPRET (conftest, no GPU) and the cache dir too
    return env


def _module(tmp_path, name, tag=""):
    path = tmp_path / name
    path.write_text("import triton\nimport triton.language as tl\n" + _KERNELS.replace("def k", f"def k{tag}"))
    return str(path)


def test_parent_finds_what_workers_compiled_after_its_triton_environment_changed(tmp_path):
    """Workers start early (prewarm); torch.compile in the same process may then set
    TRITON_PTXAS_PATH (another ptxas build: another backend hash, part of Triton's cache
    key) or another variable Triton keys on. Workers must compile under the parent's
    environment and key, or the parent compiles every kernel again itself."""
    path = _module(tmp_path, "mod.py")
    child = textwrap.dedent(f"""
        import os, stat, sys, time
        os.environ["TEMPA_CACHE_DIR"] = {str(tmp_path / "cache")!r}
        from tempa.backend.gpu import kernels as K
        import triton
        from triton.backends.compiler import GPUTarget
        K.WORKERS = 2
        K.prewarm()                                    # started with the old environment
        real = triton.knobs.nvidia.ptxas.path
        wrapper = {str(tmp_path / "ptxas")!r}          # another "build" of the same ptxas
        with open(wrapper, "w") as f:
            f.write('#!/bin/sh\\nif [ "$1" = "--version" ]; then "' + real + '" --version; echo rebuilt; exit 0; fi\\n'
                    'exec "' + real + '" "$@"\\n')
        os.chmod(wrapper, os.stat(wrapper).st_mode | stat.S_IEXEC)
        os.environ["TRITON_PTXAS_PATH"] = wrapper
        os.environ["TRITON_DEFAULT_FP_FUSION"] = "0"
        time.sleep(3)                                  # the workers have Triton imported
        tgt = GPUTarget("cuda", 90, 32)
        sig = {{"p0": "*fp32", "p1": "*fp32", "p2": "*fp32"}}
    """) + _COMPILE_MODULE + textwrap.dedent(f"""
        print(*compile_module({path!r}, [f"k{{i}}" for i in range(6)])[:2])
    """)
    p = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=_child_env(),
                       timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == "True True", p.stdout + p.stderr[-2000:]


def test_workers_stay_for_the_next_graph_and_take_its_environment(tmp_path):
    """After one module the workers wait, Triton imported, for the next graph's module; the
    next one may come with another Triton environment, which they then compile with."""
    first, second = _module(tmp_path, "mod.py"), _module(tmp_path, "mod2.py", tag="b")
    child = textwrap.dedent(f"""
        import os, sys
        os.environ["TEMPA_CACHE_DIR"] = {str(tmp_path / "cache")!r}
        from tempa.backend.gpu import kernels as K
        from triton.backends.compiler import GPUTarget
        K.WORKERS = 2
        tgt = GPUTarget("cuda", 90, 32)
        sig = {{"p0": "*fp32", "p1": "*fp32", "p2": "*fp32"}}
    """) + _COMPILE_MODULE + textwrap.dedent(f"""
        # new workers take a second to import Triton: meanwhile this process compiles too
        print(*compile_module({first!r}, [f"k{{i}}" for i in range(6)]))
        kept = sorted(p.pid for p in K._WAITING)
        os.environ["TRITON_DEFAULT_FP_FUSION"] = "0"      # Triton keys on it
        print(*compile_module({second!r}, [f"kb{{i}}" for i in range(6)])[:2])
        print(len(kept), sorted(p.pid for p in K._WAITING) == kept)
    """)
    p = subprocess.run([sys.executable, "-W", "always::ResourceWarning", "-c", child], capture_output=True,
                       text=True, env=_child_env(), timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines() == ["True True True", "True True", "2 True"], p.stdout + p.stderr[-2000:]
    assert "ResourceWarning" not in p.stderr


def test_a_forked_process_does_not_take_its_parents_idle_workers():
    child = textwrap.dedent("""
        import os
        from tempa.backend.gpu import kernels as K
        K.WORKERS = 2
        K.prewarm()
        pid = os.fork()
        if pid == 0:                       # a DataLoader-style fork: the pipes are the parent's
            os._exit(0 if K._idle_worker() is None else 1)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status), len(K._WAITING), K._idle_worker() is not None)
    """)
    p = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=_child_env(),
                       timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "0 2 True"
