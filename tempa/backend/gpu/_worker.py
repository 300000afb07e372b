"""Compile Triton kernels into Triton's disk cache (run as a plain script by kernels.py).

Reads {"path", "target", "jobs"} as JSON on stdin. Imports only Triton and the generated
module file, so it starts fast and never touches CUDA or the user's program.
"""
import importlib.util
import json
import sys


def main():
    spec = json.loads(sys.stdin.read())
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource
    s = importlib.util.spec_from_file_location("tempa_worker_mod", spec["path"])
    mod = importlib.util.module_from_spec(s)
    s.loader.exec_module(mod)
    tgt = GPUTarget(*spec["target"])
    for j in spec["jobs"]:
        try:
            fn = getattr(mod, j["name"])
            attrs = {(i,): [["tt.divisibility", 16]] for i in j["aligned"]}
            src = ASTSource(fn, j["signature"], None, attrs)
            triton.compile(src, target=tgt, options={"num_warps": j["num_warps"], "num_stages": j["num_stages"]})
            print("ok", j["name"], flush=True)
        except Exception as e:  # noqa: BLE001 - the parent compiles it again and reports
            print("err", j["name"], repr(e)[:500], flush=True)


if __name__ == "__main__":
    main()
