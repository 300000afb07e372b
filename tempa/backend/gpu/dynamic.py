"""Shape-generic Triton kernels and GPU wrappers for graphs with symbolic sizes (issue 7).

The method is the CPU's (backend/dynamic.py, whose grid, interpolation and per-shape
fallback this reuses through its renderer hooks): render the graph at a small grid of sizes,
require identical text apart from numeric literals, fit each changing literal as a
polynomial in the size symbols. Here the texts are the Triton kernels (joined in launch
order) and the GPU wrapper; the kernels take the symbols as trailing int64 arguments
``ds0, ds1`` and the wrapper reads them from its inputs and passes them to every launch.

What the GPU adds:
  * Launch parameters depend on magnitudes (XBLOCK, RBLOCK, warps, persistent vs looped
    reductions) and are compile-time constants of a kernel. ``_settle`` fixes them once per
    kernel from the axis renderings: as for the largest sample, and a reduction whose
    extent changes with the sizes is looped (a persistent tile would hold only the rows
    that fit it). Every rendering is then re-rendered with those blocks.
  * Grids are ``ceil(xnumel / XBLOCK)``, computed in the wrapper from the fitted xnumel.
  * Indices are int64 (no int32 bound holds for all sizes); the size arguments are never
    value-specialised (``do_not_specialize`` for the JIT, a plain ``i64`` signature for the
    direct compile); a pointer is claimed 16-byte aligned only where its offset is the same
    at every rendering.
  * max-autotune tunes GEMMs for one shape: it stays per shape.
"""
from __future__ import annotations

import re

from ..codegen import triton as tr
from ..dynamic import DynamicTarget, NotGeneric
from . import compile as gc
from . import kernels as K
from . import wrapper as W

# Kernel texts of one rendering are joined with this line (no digits: not a literal).
SEP = "\n# ---- next kernel ----\n"
# Where a Triton kernel needs compile-time constants: a size symbol there is not generic.
_CONSTEXPR = re.compile(r"(tl\.arange\([^)]*\)|tl\.(?:full|zeros)\(\[[^\]]*\]|broadcast_to\([^\[]*\[[^\]]*\])")


class GpuDynamicTarget(DynamicTarget):
    """A ``GraphVariants`` target: GpuTarget's renderer, one shape-generic compile for all sizes."""
    name = "cuda"
    PARTS = ("Triton", "wrapper")

    def __init__(self, dims, gpu_target):
        super().__init__(dims)
        self.gpu = gpu_target
        self.blocks: dict = {}      # id(example plan) -> fixed launch parameters per kernel

    @staticmethod
    def decomps():
        from .backend import gpu_decomps
        return gpu_decomps()

    # -- renderer hooks ----------------------------------------------------------------------
    def _plan(self, gm, num_outputs, mutated, n_in, label, prefix="", nsizes=0, choices=None):
        if self.gpu.autotune is not None:
            raise NotGeneric("max-autotune tunes its GEMMs for one shape")
        params = self.gpu.params if label in ("inference", "forward") else frozenset()
        return gc.plan_graph(gm, num_outputs, mutated, n_in, label, prefix, params, None,
                             nsizes=nsizes, choices=choices)

    def _settle(self, plans, ex_plan):
        every = list(plans) + [ex_plan]
        per_plan = [[it[0] for it in p.items if isinstance(it, tuple)] for p in every]
        if len({len(k) for k in per_plan}) != 1:
            raise NotGeneric("the number of Triton kernels changes with the sizes")
        blocks = []
        for j, kp_ex in enumerate(per_plan[-1]):
            samples = [tr.extents(kps[j]) for kps in per_plan]
            if len({len(e) for _, e in samples}) != 1:
                raise NotGeneric("a kernel's members change with the sizes")
            x_max = max(x for x, _ in samples)
            r_max = max(max(e) if e else 0 for _, e in samples)
            r_symbolic = len({e for _, e in samples}) > 1
            blocks.append(tr.generic_blocks(x_max, r_max, r_symbolic, kp_ex.r_contiguous))
        self.blocks[id(ex_plan)] = blocks
        for p in every:
            self._rerender(p, ex_plan)

    def _rerender(self, plan, ex_plan):
        gc.rerender(plan, self.blocks[id(ex_plan)], len(self.syms))
        plan.settled_for = id(ex_plan)

    def _texts(self, plan, n):
        if getattr(plan, "settled_for", None) is None:
            # a grid point rendered after _settle (off the axes): same blocks
            self._rerender(plan, self._current_ex)
        kernels = SEP.join(it[1].body for it in plan.items if isinstance(it, tuple))
        wsrc, consts = W.render(plan, K.interpret_mode(), n)
        plan.wrapper_consts = consts
        return kernels, wsrc

    def _template(self, plan_at, ex_plan):
        self._current_ex = ex_plan
        return super()._template(plan_at, ex_plan)

    def _literal(self, part, expr, is_float):
        if part == 0 and is_float:           # in a kernel: a Triton float, not a C++ double
            return f"({expr}).to(tl.float32)"
        return super()._literal(part, expr, is_float)

    def _make_dplan(self, ex_plan, texts, n, made):
        kernel_src, wsrc = texts
        kcs = [it[1] for it in ex_plan.items if isinstance(it, tuple)]
        bodies = kernel_src.split(SEP) if kcs else []
        if len(bodies) != len(kcs):
            raise NotGeneric("kernel texts did not split back into kernels")
        for body in bodies:
            for m in _CONSTEXPR.finditer(body):
                if "ds" in m.group(0):
                    raise NotGeneric(f"a block shape depends on the sizes ({m.group(0)})")
        # alignment: claimed only for a pointer whose offset is the same at every rendering
        others = [[it[1] for it in p.items if isinstance(it, tuple)] for p in made.values()]
        for j, (kc, body) in enumerate(zip(kcs, bodies)):
            claims = set(K.aligned(kc))
            for o in others:
                claims &= set(K.aligned(o[j]))
                for i, (b, ob) in enumerate(zip(kc.params, o[j].params)):
                    if _offset(b) != _offset(ob):
                        claims.discard(i)
            kc.aligned_params = sorted(claims)
            kc.body = body
        ex_plan.generic_wrapper = (wsrc, ex_plan.wrapper_consts)
        return ex_plan

    def _finish(self, dplans):
        return gc.finish(dplans)

    def _static_compile(self, gm, num_outputs, mutated, n_in, label):
        return self.gpu.compile_graph(gm, num_outputs, mutated, n_in, label)

    def _static_training(self, joint, n_in, single, plan_fn=None, finish_fn=None):
        if plan_fn is None:
            return self.gpu.build_training(joint, n_in, single)
        from ..autograd import build_training
        # shape-generic: no backward variants for outputs without a gradient (see dynamic.py)
        return build_training(joint, n_in, single, plan_fn, finish_fn, absent_variants=False)


def _offset(b):
    return (b.offset + getattr(b, "base_offset", 0)) * b.dtype.itemsize
