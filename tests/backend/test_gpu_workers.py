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
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TRITON_INTERPRET", None)         # conftest sets it where there is no GPU: compile for real
    env.pop("TRITON_CACHE_DIR", None)         # the child's cache is its own
    p = subprocess.run([sys.executable, "-W", "always::ResourceWarning", "-c", child], capture_output=True,
                       text=True, env=env, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == "['k_add', 'k_mul']", p.stderr[-3000:]   # k_bad: reported failed
    assert "ResourceWarning" not in p.stderr, p.stderr[-2000:]


def test_parent_finds_what_workers_compiled_after_its_triton_environment_changed(tmp_path):
    """Workers start early (prewarm); torch.compile in the same process may then set
    TRITON_PTXAS_PATH (another ptxas build: another backend hash, part of Triton's cache
    key) or another variable Triton keys on. Workers must compile under the parent's
    environment and key, or the parent compiles every kernel again itself."""
    (tmp_path / "mod.py").write_text(_MODULE)
    child = textwrap.dedent(f"""
        import os, queue, stat, sys
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
        tgt = GPUTarget("cuda", 90, 32)
        sig = {{"p0": "*fp32", "p1": "*fp32", "p2": "*fp32"}}
        jobs = [K.Job(n, sig, [0, 1, 2], 4) for n in ("k_add", "k_mul")]
        path = {str(tmp_path / "mod.py")!r}
        mod = K.load_module(path)
        cache = os.environ["TRITON_CACHE_DIR"]
        from_workers = list(K._as_compiled(path, jobs, tgt, 1))
        before = sorted(os.listdir(cache))
        for j in from_workers:
            K._compile(mod, j, tgt)
        print(len(from_workers), sorted(os.listdir(cache)) == before)
    """)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TRITON_INTERPRET", None)
    for k in [k for k in env if k.startswith(("TRITON_PTXAS", "TRITON_DEFAULT_FP_FUSION", "TRITON_CACHE_DIR"))]:
        env.pop(k)                                   # the child's cache is its own
    p = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip() == "2 True", p.stdout + p.stderr[-2000:]   # no compile in the parent


def test_workers_stay_for_the_next_graph_and_take_its_environment(tmp_path):
    """After one module the workers wait, Triton imported, for the next graph's module; the
    next one may come with another Triton environment, which they then compile with."""
    (tmp_path / "mod.py").write_text(_MODULE)
    (tmp_path / "mod2.py").write_text(_MODULE.replace("k_add", "k_add2").replace("k_mul", "k_mul2"))
    child = textwrap.dedent(f"""
        import os, queue, sys
        os.environ["TEMPA_CACHE_DIR"] = {str(tmp_path / "cache")!r}
        from tempa.backend.gpu import kernels as K
        from triton.backends.compiler import GPUTarget
        K.WORKERS = 2
        tgt = GPUTarget("cuda", 90, 32)
        sig = {{"p0": "*fp32", "p1": "*fp32", "p2": "*fp32"}}

        def compile_module(name, kernels):
            path = os.path.join({str(tmp_path)!r}, name)
            jobs = [K.Job(n, sig, [0, 1, 2], 4) for n in kernels]
            from_workers = [j.name for j in K._as_compiled(path, jobs, tgt, 1)]
            cache = os.environ["TRITON_CACHE_DIR"]
            before = sorted(os.listdir(cache))
            mod = K.load_module(path)
            for n in from_workers:
                K._compile(mod, [j for j in jobs if j.name == n][0], tgt)
            return sorted(from_workers), sorted(os.listdir(cache)) == before

        print(compile_module("mod.py", ["k_add", "k_mul"]))
        first = sorted(p.pid for p in K._WAITING)
        os.environ["TRITON_DEFAULT_FP_FUSION"] = "0"      # Triton keys on it
        print(compile_module("mod2.py", ["k_add2", "k_mul2"]))
        print(len(first), sorted(p.pid for p in K._WAITING) == first)
    """)
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for k in [k for k in env if k.startswith(("TRITON_",))]:
        env.pop(k)
    p = subprocess.run([sys.executable, "-W", "always::ResourceWarning", "-c", child], capture_output=True,
                       text=True, env=env, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines() == ["(['k_add', 'k_mul'], True)", "(['k_add2', 'k_mul2'], True)",
                                             "2 True"], p.stdout + p.stderr[-2000:]
    assert "ResourceWarning" not in p.stderr
