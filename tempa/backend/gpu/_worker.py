"""Compile Triton kernels into Triton's disk cache (run as a plain script by kernels.py).

Imports Triton first (kernels.prewarm starts workers before their module exists, so that
this import overlaps the parent's tracing), then reads one JSON line {"path", "target",
"env", "backend_hash"} (the parent's Triton environment variables, which replace the
worker's own, and its backend hash, under which results are filed),
answers "ready", then takes one JSON job per line, answering each with a line "ok NAME" or
"err NAME ..." once it is compiled, until a line "end"; then waits for the next module's
line (kernels.py keeps idle workers for the next graph); exits at the end of its input. Why
one job at a time: kernels.py hands the next job to whichever worker is free, so a worker
that drew slow kernels does not keep the others waiting. Imports only Triton and the
generated module file, so it starts fast and never touches CUDA or the user's program.
"""
import importlib.util
import json
import os
import sys


def main():
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend
    modules = 0
    own_hash = {}                 # backend class -> its own hash method
    while True:
        line = sys.stdin.readline()
        if not line.strip():
            return                # end of input (or a prewarmed worker told to exit)
        spec = json.loads(line)
        # compile with the parent's Triton environment as it is now (kernels.triton_environment)
        env = spec.get("env")
        if env is not None:
            # (kernels.TRITON_ENV_PREFIXES: this script imports nothing of tempa)
            for key in [k for k in os.environ if k.startswith(("TRITON_", "MLIR_", "LLVM_"))]:
                if key not in env:
                    del os.environ[key]
            os.environ.update(env)
        modules += 1
        s = importlib.util.spec_from_file_location(f"tempa_worker_mod{modules}", spec["path"])
        mod = importlib.util.module_from_spec(s)
        s.loader.exec_module(mod)
        tgt = GPUTarget(*spec["target"])
        # file results under the parent's cache key (kernels._backend_hash says why)
        backend = type(make_backend(tgt))
        own_hash.setdefault(backend, backend.hash)
        parent_hash = spec.get("backend_hash")
        backend.hash = (lambda self, h=parent_hash: h) if parent_hash else own_hash[backend]
        print("ready", flush=True)
        while True:
            line = sys.stdin.readline()
            if not line:
                return
            if line.strip() == "end":
                break             # this module is done: wait for the next one
            if not line.strip():
                continue
            j = json.loads(line)
            try:
                fn = getattr(mod, j["name"])
                attrs = {(i,): [["tt.divisibility", 16]] for i in j["aligned"]}
                src = ASTSource(fn, j["signature"], None, attrs)
                triton.compile(src, target=tgt, options={"num_warps": j["num_warps"],
                                                         "num_stages": j["num_stages"]})
                print("ok", j["name"], flush=True)
            except Exception as e:  # noqa: BLE001 - the parent compiles it again and reports
                print("err", j["name"], repr(e)[:500].replace("\n", " "), flush=True)


if __name__ == "__main__":
    main()
