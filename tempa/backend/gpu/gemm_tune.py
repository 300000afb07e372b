"""mode="max-autotune" for matmuls: each GEMM site's template configurations against cuBLAS.

For every site (gemm.find_sites) the candidates are

  "aten"              the extern call as the default mode makes it (cuBLAS), followed by the
                      epilogue kernel on its own: what the site costs without the template
  "triton <config>"   the template (gemm_template.py) with the epilogue fused, one per block
                      configuration in the search space below (shrunk to small problems)

They are compiled together (in parallel, a failing one skipped), run on random tensors with
the site's real shapes, strides and dtypes, and timed by runtime/autotune.py, which keeps the
fastest and remembers it on disk. The winner replaces the site in the plan's item list:
either the original (ExternCall, epilogue kernel) pair or one (GemmSite, GemmCode) kernel.

Options (``tempa.compile(..., mode="max-autotune", options={...})``):
  "max_autotune_gemm_backends"  "triton,aten" (default), "triton" or "aten"
  "max_autotune_gemm_configs"   a list of [BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages]
                                replacing the search space
"""
from __future__ import annotations

import functools
import hashlib
from dataclasses import replace

import torch

from ..codegen.triton_emit import PRELUDE
from ..ir import LoopValue
from ..runtime.autotune import cuda_timer
from . import kernels as K
from .gemm import GemmSite, find_sites
from .gemm_template import HALF, GemmConfig, allow_tf32, render

ATEN = "aten"

# Block shapes that do well on Hopper/Ampere-class GPUs for large, medium and skinny problems.
# Half types: 64-deep K steps (128 bytes per row of a tile); fp32: 32-deep (the same bytes).
CONFIGS_HALF = [
    GemmConfig(128, 128, 64, 8, 8, 3), GemmConfig(128, 256, 64, 8, 8, 3),
    GemmConfig(256, 128, 64, 8, 8, 3), GemmConfig(64, 128, 64, 8, 4, 4),
    GemmConfig(128, 64, 64, 8, 4, 4), GemmConfig(64, 64, 64, 8, 4, 4),
    GemmConfig(128, 128, 32, 8, 4, 4), GemmConfig(64, 256, 32, 8, 4, 4),
]
CONFIGS_FP32 = [
    GemmConfig(128, 128, 32, 8, 8, 3), GemmConfig(128, 64, 32, 8, 4, 4),
    GemmConfig(64, 128, 32, 8, 4, 4), GemmConfig(64, 64, 32, 8, 4, 4),
    GemmConfig(128, 256, 32, 8, 8, 3), GemmConfig(64, 32, 32, 8, 4, 5),
]


def _np2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def configs_for(site: GemmSite, options: dict) -> list:
    """The search space for ``site``: tiles no bigger than the problem (at least 16, tl.dot's
    minimum), duplicates after shrinking dropped."""
    given = options.get("max_autotune_gemm_configs")
    if given:
        return [GemmConfig(*map(int, c)) for c in given]
    base = CONFIGS_HALF if site.dtype in HALF else CONFIGS_FP32
    out = []
    for c in base:
        bm = min(c.block_m, max(16, _np2(site.m)))
        bn = min(c.block_n, max(16, _np2(site.n)))
        bk = min(c.block_k, max(16, _np2(site.k)))
        warps = c.num_warps if bm * bn >= 128 * 128 else min(c.num_warps, 4)
        c2 = replace(c, block_m=bm, block_n=bn, block_k=bk, num_warps=warps)
        if c2 not in out:
            out.append(c2)
    return out


def tune(items: list, lowered, tuner, interpret: bool) -> list:
    """``items`` with each GEMM site replaced by its fastest implementation."""
    backends = {b.strip() for b in str(tuner.options.get("max_autotune_gemm_backends", "triton,aten")).split(",")}
    if "triton" not in backends:
        return items
    out = []
    for it in find_sites(items, lowered):
        if not isinstance(it, GemmSite):
            out.append(it)
            continue
        code = _tune_site(it, tuner, interpret, ATEN in backends)
        if code is None:
            out.append(it.call)
            if it.epilogue is not None:
                out.append((it.epilogue, it.epilogue_code))
        else:
            out.append((it, code))
    return out


def _tune_site(site: GemmSite, tuner, interpret: bool, with_aten: bool):
    """The chosen GemmCode, or None for the library call."""
    codes = {}
    for cfg in configs_for(site, tuner.options):
        codes[f"triton {cfg.label}"] = render(site, cfg, interpret)
    names = ([ATEN] if with_aten else []) + list(codes)
    # on a GPU the library is the safe default (every candidate failed); the interpreter
    # cannot time anything and takes the template, so the template is what gets checked
    default = next(iter(codes)) if (interpret or not with_aten) else ATEN
    timer = None if interpret else cuda_timer
    d = tuner.pick(site.describe(), site_key(site, codes, names), names,
                   lambda: _prepare(site, codes, with_aten), timer, default)
    return codes.get(d.choice)


def site_key(site: GemmSite, codes: dict, names: list) -> dict:
    """What a measurement of this site depends on (the tuner adds the GPU and versions)."""
    def layout(tv):
        if tv is None:
            return None
        buf, st, off = tv.strided
        align = ((buf.offset + getattr(buf, "base_offset", 0)) * buf.dtype.itemsize) % 16 == 0
        return {"sizes": list(tv.sizes), "strides": list(st), "offset": off - buf.offset,
                "dtype": str(buf.dtype), "aligned": align}
    epi = site.epilogue_code.body if site.epilogue_code is not None else ""
    first = next(iter(codes.values()))
    return {
        "op": site.op, "shape": [site.batch, site.m, site.n, site.k], "dtype": str(site.dtype),
        "a": layout(site.a), "b": layout(site.b), "bias": layout(site.bias),
        "alpha": site.alpha, "beta": site.beta, "out_strides": list(site.out.strides),
        "store_out": site.store_out, "tf32": allow_tf32(),
        "epilogue": hashlib.sha256(epi.encode()).hexdigest(),
        "template": hashlib.sha256(first.body.encode()).hexdigest(),
        "candidates": names,
    }


# --- running candidates on the GPU ----------------------------------------------------------

def _prepare(site: GemmSite, codes: dict, with_aten: bool) -> dict:
    """name -> a no-argument runner on random tensors (or the exception that stopped it)."""
    from .wrapper import _stream_fn
    kernel_of = {name: K.content_name(c.body, "gemm") for name, c in codes.items()}
    bodies = [c.body.replace("KERNEL_NAME", kernel_of[n]) for n, c in codes.items()]
    epi = site.epilogue_code
    if with_aten and epi is not None:
        bodies.append(epi.body.replace("KERNEL_NAME", "tune_epilogue"))
    path = K.write_module(PRELUDE + "\n\n" + "\n\n".join(bodies))
    jobs = [K.Job(kernel_of[n], K.signature(c), K.aligned(c), c.num_warps, c.num_stages) for n, c in codes.items()]
    if with_aten and epi is not None:
        jobs.append(K.Job("tune_epilogue", K.signature(epi), K.aligned(epi), epi.num_warps))
    compiled = K.compile_each(path, jobs)
    dev = torch.device("cuda", torch.cuda.current_device())
    stream = _stream_fn()(dev.index)
    tensors = _RandomTensors(dev)
    runners = {}
    for name, code in codes.items():
        runners[name] = _kernel_runner(compiled[kernel_of[name]], code, tensors, stream)
    if with_aten:
        epi_run = None
        if epi is not None:
            epi_run = _kernel_runner(compiled["tune_epilogue"], epi, tensors, stream)
        if isinstance(epi_run, BaseException):
            runners[ATEN] = epi_run
        else:
            runners[ATEN] = _aten_runner(site, tensors, epi_run)
    return runners


def _kernel_runner(ck, code, tensors, stream):
    if isinstance(ck, BaseException):
        return ck
    try:
        launcher = K.Launcher(ck)        # loads the binary: too much shared memory fails here
    except Exception as e:  # noqa: BLE001
        return e
    args = [tensors.of(b) for b in code.params]
    return functools.partial(launcher.run, code.grid, 1, 1, stream, launcher.function, launcher.meta,
                             None, None, None, *args)


def _aten_runner(site: GemmSite, tensors, epilogue_run):
    call = site.call

    def arg(a):
        return tensors.view(a) if isinstance(a, LoopValue) else a
    args = [arg(a) for a in call.args]
    kwargs = {k: arg(v) for k, v in call.kwargs.items()}
    op = call.op

    def run():
        op(*args, **kwargs)
        if epilogue_run is not None:
            epilogue_run()
    return run


class _RandomTensors:
    """One random tensor per buffer, laid out as the buffer is (values do not matter for
    speed; normal values keep the math away from denormals and infinities)."""

    def __init__(self, device):
        self.device = device
        self.made: dict = {}

    def of(self, buf):
        t = self.made.get(buf)
        if t is None:
            span = 1 + sum((s - 1) * abs(st) for s, st in zip(buf.sizes, buf.strides) if s > 0)
            if buf.dtype.is_floating_point:
                # a generator of its own: tuning never moves the user's CUDA RNG
                g = torch.Generator(device=self.device).manual_seed(0)
                base = torch.randn(span, device=self.device, dtype=buf.dtype, generator=g)
            else:
                base = torch.zeros(span, device=self.device, dtype=buf.dtype)
            t = self.made[buf] = base.as_strided(tuple(buf.sizes), tuple(buf.strides))
        return t

    def view(self, tv: LoopValue):
        buf, st, off = tv.strided
        t = self.of(buf)
        return t.as_strided(tv.sizes, st, t.storage_offset() + off - buf.offset)
