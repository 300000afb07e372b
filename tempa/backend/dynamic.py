"""Shape-generic CPU code for graphs captured with symbolic sizes (issue 7).

The frontend hands over a graph whose placeholders carry fake tensors with ``SymInt`` sizes
(a batch or sequence dimension that changed between calls). We compile it once for every
size: the C++ segments take the size symbols as ``int64_t`` arguments, and the wrapper reads
them from its inputs' shapes (one ``a.shape[d]`` per symbol) on each call.

How: specialise, then generalise. The graph is traced, lowered, scheduled and rendered (C++
and wrapper text) at a small grid of concrete values of its symbols (3 per symbol, so 3 or 9
renderings for one or two symbols). The renderings must be identical except for numeric
literals; each literal that changes is interpolated as a polynomial in the symbols (degree
at most 2 in each, integer coefficients: sizes, strides, numels, offsets, loop bounds), and
the rendering at the size the graph was captured at, which is not on the grid, must equal
the template evaluated there. The template is the code. It holds no concrete dynamic size,
so the disk cache keys one artifact for all sizes.

Why not symbolic sizes throughout the IR: every lowering, the index algebra and the
scheduler's fusion proofs would need symbolic arithmetic and a guard per decision. This
leaves them untouched, and a decision that depended on the concrete values (a fusion, a
simplification, a library-vs-loop choice) shows up as renderings that differ in structure or
a literal that is not a polynomial; the graph is then compiled per shape (correct, one gcc
run per size) and ``tempa_info.dynamic`` says why. Choices driven by magnitudes are made
size-independent in generic renderings (cpp.render_segment's ``nsizes``): OpenMP decides at
run time, arenas live on the heap, and lowering thresholds assume sizes may grow.
"""
from __future__ import annotations

import itertools
import re
from fractions import Fraction

import torch

from .. import counters, logs
from ..configuration import config
from .codegen import cpp, wrapper
from .compile_graph import instantiate, plan_graph
from .lower.decomps import table
from .lower.lowerings import SizeChoices
from .lower.joint import trace_training
from .lower.trace import UntraceableGraph, trace_forward, with_output_views
from .runtime import build as _build
from .variant_target import VariantTarget

# More symbols than this: compile per shape (3**n renderings would cost more than they save).
MAX_SYMBOLS = 2

# A numeric literal in C++ or Python source: not part of an identifier, optional ``LL``.
_NUM = re.compile(r"(?<![\w.])(\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)(LL)?(?![\w.])")


# The names torch's ShapeEnv gives unbacked symbols (sizes and numbers only the run knows:
# ``u0`` for an int, ``zuf0`` for a float), as against ``s0`` for a size read from an input.
_UNBACKED = re.compile(r"\b(u|zuf)\d+\b")


def from_values(symbol: str) -> bool:
    """Is ``symbol`` (a size or int's expression) computed from tensor values (an unbacked
    symbol: the length of ``x[mask]``, a captured ``.item()``)?"""
    return bool(_UNBACKED.search(symbol))


class NotGeneric(Exception):
    """This graph cannot be made shape-generic; it is compiled per shape instead."""


class SizeMismatch(Exception):
    """Raised by a generic wrapper when dims it tied together differ on this call."""


def _with_fallback(generic, fallback):
    def call(*args):
        try:
            return generic(*args)
        except SizeMismatch:
            return fallback(*args)
    return call


def dynamic_dims(gm: torch.fx.GraphModule):
    """[(input index, dim, symbol)] for every symbolic size of the graph's inputs ([] if none);
    dim is None for a symbolic integer input (a Python int made a symbol, or a number
    computed from tensor values that a piece of a segmented graph is given)."""
    out = []
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, n in enumerate(phs):
        ev = n.meta.get("example_value")
        if isinstance(ev, torch.SymInt):
            if not ev.node.expr.is_number:
                out.append((i, None, str(ev.node.expr)))
            continue
        if not isinstance(ev, torch.Tensor):
            continue
        for d, s in enumerate(ev.shape):
            if isinstance(s, torch.SymInt) and not s.node.expr.is_number:
                out.append((i, d, str(s.node.expr)))
    return out


def per_shape(compile_one, reason: str = ""):
    """``compile_one(inputs) -> callable`` once per input-shape signature."""
    compiled = {}

    def run(*inputs):
        key = tuple(t.shape if isinstance(t, torch.Tensor) else t for t in inputs)
        fn = compiled.get(key)
        if fn is None:
            fn = compiled[key] = compile_one(list(inputs))
        return fn(*inputs)
    run.per_shape = compiled
    run.reason = reason
    return run


def _dense(t: torch.Tensor) -> bool:
    """Contiguous in some order of its dims (``nonzero``'s result is column-major)."""
    expected = 1
    for size, stride in sorted(((n, st) for n, st in zip(t.shape, t.stride()) if n != 1),
                               key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= size
    return True


def _dim_order(t: torch.Tensor) -> list:
    """``t``'s dims from the outermost in memory to the innermost (its strides' order; a
    size-1 dim by its stride too, as eager lays one out)."""
    return sorted(range(t.dim()), key=lambda d: (-t.stride(d), d))


def _resize(t: torch.Tensor, dims: dict) -> torch.Tensor:
    """``t`` with sizes ``dims`` (dim -> size), built from its own values (so token ids stay
    valid ids): repeated along a dim to grow, narrowed to shrink; zeros where it is empty
    (an empty ``x[mask]``: zeros are valid ids wherever one is). Its dims keep their order
    in memory (dense)."""
    r = t.detach()
    for d, n in dims.items():
        cur = r.shape[d]
        if cur == 0:
            shape = list(r.shape)
            shape[d] = n
            r = torch.zeros(shape, dtype=r.dtype, device=r.device)
        elif n > cur:
            reps = [1] * r.dim()
            reps[d] = -(-n // cur)
            r = r.repeat(*reps)
        r = r.narrow(d, 0, n)
    order = _dim_order(t)
    if order != list(range(t.dim())):
        dense = torch.empty([r.shape[d] for d in order], dtype=r.dtype, device=r.device)
        r = dense.permute([order.index(d) for d in range(t.dim())]).copy_(r)
    else:
        r = r.contiguous()
    if t.requires_grad:
        r.requires_grad_(True)
    return r


class DynamicTarget(VariantTarget):
    """A VariantTarget (variant_target.py) that compiles each variant shape-generically.

    ``bind`` receives the prepared graph and the example inputs; ``compile_graph`` and
    ``build_training`` get the variant traced at the example sizes (the check point) and
    trace the grid themselves.

    The renderer is behind a few hooks (``_plan``, ``_texts``, ``_literal``, ``_settle``,
    ``_make_dplan``, ``_finish``, ``_static_*``): this class renders C++, and
    gpu/dynamic.py's subclass renders Triton with the same grid, solver and fallback."""
    name = "cpu"
    shape_generic = True
    decomps = staticmethod(table)
    PARTS = ("C++", "wrapper")          # what the two texts of a rendering are called

    def __init__(self, dims):
        self.dims = dims
        # sizes computed from tensor values (a segmented graph's pieces, split_at_values.py): one
        # compile per shape would be one per value, so where no generic code can be made the
        # graph runs as ATen calls instead
        self.from_values = any(from_values(s) for _, _, s in dims)

    # -- the renderer's hooks (C++ here) -----------------------------------------------------
    def _plan(self, gm, num_outputs, mutated, n_in, label, prefix="", nsizes=0, choices=None):
        return plan_graph(gm, num_outputs, mutated, n_in, label, prefix, nsizes=nsizes, choices=choices)

    def _texts(self, plan, n):
        """(kernel text, wrapper text) of one rendering."""
        return _texts(plan, n)

    def _settle(self, plans, ex_plan):
        """Called once the axis renderings exist, before any text is taken: a renderer may
        fix size-driven choices (block sizes) from them. Nothing to do for C++."""

    def _literal(self, part, expr, is_float):
        if part == 0:
            return f"(static_cast<double>({expr}))" if is_float else f"({expr})"
        return f"float({expr})" if is_float else f"({expr})"

    def _make_dplan(self, ex_plan, texts, n, made):
        return _DynPlan(ex_plan, texts[0], texts[1], n)

    def _finish(self, dplans):
        return finish(dplans)

    def _static_compile(self, gm, num_outputs, mutated, n_in, label):
        from .compile_graph import compile_graph as static_compile
        return static_compile(gm, num_outputs, mutated, n_in, label)

    def _static_training(self, joint, n_in, single, plan_fn=None, finish_fn=None):
        from .autograd import build_training
        if plan_fn is None:
            return build_training(joint, n_in, single, native_node=True, saved_layouts=True)
        # shape-generic: no backward variants for outputs without a gradient (autograd.py
        # _AbsentTangents): one would need the grid traced again; autograd gives zeros
        return build_training(joint, n_in, single, plan_fn, finish_fn, native_node=True,
                              absent_variants=False)

    def bind(self, pgm, examples, info):

        self.pgm, self.examples, self.info = pgm, examples, info
        self.ranges = symbol_ranges(pgm)
        self.reason = None
        self.example_views = {}         # "inference" / "training" -> the examples' OutputAliases
        self.traced: dict = {}          # (grid index, joint?) -> trace
        self.used_points: set = set()
        try:
            self._setup()
        except NotGeneric as e:
            self.reason = str(e)
        return self

    def keep_output_views(self, aliases, variant):
        """Outputs that eager returns as views of inputs or of other outputs: their sizes,
        strides and offsets hold at one size only, so the graph is compiled per shape, each
        shape's call handing out the views traced at its sizes (trace.with_output_views)."""
        if any(a is not None and not a.same for a in aliases or ()):
            self.reason = self.reason or "outputs are views of inputs or of other outputs"
            self.example_views[variant] = aliases

    # -- the grid --------------------------------------------------------------------------
    def _setup(self):
        # Tie symbols that have the same example value at the same dim (input_ids and
        # attention_mask batch sizes: the frontend names them apart when no guard relates
        # them). A tied dim is checked on each call; a call where they differ raises
        # SizeMismatch inside the wrapper and runs per-shape code instead.
        canon: dict = {}
        self.ties = []
        for i, d, s in self.dims:
            if d is None or s in canon or from_values(s):   # (unbacked ones never coincide)
                continue
            v = self.examples[i].shape[d]
            twin = next((c for (i2, d2, c) in self.dims if c in canon.values() and d2 == d
                         and self.examples[i2].shape[d2] == v), None)
            canon[s] = twin or s
        self.ties = [(i, d, canon[s]) for i, d, s in self.dims if d is not None and canon.get(s, s) != s]
        self.dims = [(i, d, canon.get(s, s)) for i, d, s in self.dims]
        syms: dict = {}
        for i, d, s in self.dims:
            t = self.examples[i]
            if d is None:                      # a symbolic int input: its value is the size
                value = int(t)
            else:
                if not _dense(t):
                    raise NotGeneric(f"input {i} with a dynamic size is not dense")
                value = int(t.shape[d])
            syms.setdefault(s, value)
            if syms[s] != value:
                raise NotGeneric(f"symbol {s} has two example values")
        if len(syms) > MAX_SYMBOLS:
            raise NotGeneric(f"it has {len(syms)} dynamic sizes; shape-generic code takes at most "
                             f"{MAX_SYMBOLS}")
        self.syms = list(syms)
        self.example_point = tuple(syms[s] for s in self.syms)
        # Values to avoid: every static size of the inputs and the example values, so that
        # no grid value coincides with another size (a coincidence can change a rendering).
        # Divisors too: a head dim is n_embd / n_head and appears in no input's shape.
        static = {int(x) for t in self.examples if isinstance(t, torch.Tensor) for x in t.shape}
        used = {d for x in static for d in range(2, min(x, 4096) + 1) if x % d == 0}
        used |= set(self.example_point)
        self.axes = []
        ints = {s for _, d, s in self.dims if d is None}
        for s, v in zip(self.syms, self.example_point):
            win = _grid_near(v, used, self.ranges.get(s, (None, None)), s in ints)
            if win is None:
                raise NotGeneric(f"no grid of sizes near {v} within {s}'s range "
                                 f"{self.ranges.get(s, (None, None))}")
            used |= set(win)
            self.axes.append(win)

    def _trace_at(self, ix, joint: bool):
        """The graph traced at grid index ``ix`` (forward, or the joint forward/backward)."""
        key = (ix, joint)
        if key not in self.traced:
            # Why one thread: the traces run real (small) tensors, and on a busy 2-core
            # machine ATen's intra-op threads wait on descheduled peers (10x slower, measured).
            old = torch.get_num_threads()
            torch.set_num_threads(1)
            try:
                inputs = self._inputs_at(tuple(ax[k] for ax, k in zip(self.axes, ix)))
                self.traced[key] = (trace_training(self.pgm, inputs, self.decomps()) if joint
                                    else trace_forward(self.pgm, inputs, self.decomps(), differentiable=False))
            finally:
                torch.set_num_threads(old)
            self.used_points.add(ix)
        return self.traced[key]

    def _inputs_at(self, point):
        val = dict(zip(self.syms, point))
        per_input: dict = {}
        for i, d, s in self.dims:
            per_input.setdefault(i, {})[d] = val[s]
        return [(per_input[i][None] if None in per_input[i] else _resize(t, per_input[i]))
                if i in per_input else t for i, t in enumerate(self.examples)]

    # -- the variants ----------------------------------------------------------------------
    def compile_graph(self, gm, num_outputs, mutated, n_in, label):
        try:
            if self.reason:
                raise NotGeneric(self.reason)
            n = len(self.syms)
            choices = SizeChoices()
            ex_plan = self._plan(gm, num_outputs, mutated, n_in, label, nsizes=n, choices=choices)
            choices.replay = True

            def plan_at(ix):
                tr = self._trace_at(ix, False)
                if tr.num_outputs != num_outputs or tr.mutated != mutated:
                    raise NotGeneric("the graph's outputs change with the sizes")
                choices.pos = 0
                return self._plan(tr.gm, tr.num_outputs, tr.mutated, n_in, label, nsizes=n, choices=choices)
            call, gi = self._finish([self._template(plan_at, ex_plan)])[0]
            self.traced.clear()            # the traces were only needed to make the template
            self._generic(label)
            if self.ties:
                def one(inputs):
                    tr = trace_forward(self.pgm, inputs, self.decomps(), differentiable=False)
                    return self._static_compile(tr.gm, tr.num_outputs, tr.mutated, n_in, label)[0]
                call = _with_fallback(call, per_shape(one, "tied sizes differ"))
            return call, gi
        except Exception as e:  # noqa: BLE001 - any failure here: per-shape code is correct
            self.traced.clear()
            self._refuse_per_value(e)
            self._per_shape_note(label, e)
            def one(inputs):
                tr = trace_forward(self.pgm, inputs, self.decomps(), differentiable=False)
                call = self._static_compile(tr.gm, tr.num_outputs, tr.mutated, n_in, label)[0]
                return with_output_views(call, tr.aliases)
            call, gi = self._static_compile(gm, num_outputs, mutated, n_in, label)
            run = per_shape(one, str(e))
            run.per_shape[_key(self.examples)] = with_output_views(call, self.example_views.get("inference"))
            return run, gi

    def build_training(self, joint, n_in, single):
        try:
            if self.reason:
                raise NotGeneric(self.reason)
            n = len(self.syms)
            which = {id(joint.fw): "fw", id(joint.bw): "bw"}
            shape = (joint.num_outputs, joint.mutated, joint.num_saved, joint.saved_inputs,
                     joint.grad_inputs, joint.diff_outputs)

            def plan_fn(g, num_outputs, mutated, n_in2, label, prefix=""):
                part = which[id(g)]

                def plan_at(ix):
                    j = self._trace_at(ix, True)
                    if (j.num_outputs, j.mutated, j.num_saved, j.saved_inputs, j.grad_inputs,
                            j.diff_outputs) != shape:
                        raise NotGeneric("the forward/backward split changes with the sizes")
                    choices.pos = 0
                    return self._plan(getattr(j, part), num_outputs, mutated, n_in2, label, prefix,
                                      nsizes=n, choices=choices)
                choices = SizeChoices()
                ex_plan = self._plan(g, num_outputs, mutated, n_in2, label, prefix, nsizes=n, choices=choices)
                choices.replay = True
                return self._template(plan_at, ex_plan)
            fn, fw_info, bw_info = self._static_training(joint, n_in, single, plan_fn, self._finish)
            self.traced.clear()
            self._generic("training")
            if self.ties:
                def one(inputs):
                    j = trace_training(self.pgm, inputs, self.decomps())
                    return self._static_training(j, n_in, single)[0]
                fn = _with_fallback(fn, per_shape(one, "tied sizes differ"))
            return fn, fw_info, bw_info
        except Exception as e:  # noqa: BLE001
            self.traced.clear()
            self._refuse_per_value(e)
            self._per_shape_note("training", e)

            def one(inputs):
                j = trace_training(self.pgm, inputs, self.decomps())
                return with_output_views(self._static_training(j, n_in, single)[0], j.aliases, single)
            fn, fw_info, bw_info = self._static_training(joint, n_in, single)
            run = per_shape(one, str(e))
            run.per_shape[_key(self.examples)] = with_output_views(fn, self.example_views.get("training"), single)
            return run, fw_info, bw_info

    def _refuse_per_value(self, e):
        """Where the sizes come from tensor values, per-shape code would be compiled once
        per value: the graph runs as ATen calls instead (entry.GraphVariants says so)."""
        if self.from_values:
            why = str(e) if isinstance(e, NotGeneric) else f"{type(e).__name__}: {e}"
            self.info.dynamic = f"not generic: {why}"
            raise UntraceableGraph(f"sizes computed from tensor values, and no shape-generic "
                                   f"code ({why})") from e

    def _generic(self, label):
        desc = ", ".join(f"{s}={self._source_desc(s)}" for s in self.syms)
        self.info.dynamic = self.info.dynamic or f"generic in {desc}"
        self.info.notes.append(f"{label}: shape-generic code over {desc} "
                               f"({len(self.used_points)} sizes traced and interpolated)")

    def _source_desc(self, s):
        i, d = next((i, d) for i, d, s2 in self.dims if s2 == s)
        return f"input{i}" if d is None else f"input{i}.shape[{d}]"

    def _per_shape_note(self, label, e):
        if isinstance(e, NotGeneric):
            why = str(e)
        else:
            why = f"{type(e).__name__}: {e}"
            if config.raise_on_failure and not isinstance(e, NotGeneric):
                raise e
        self.info.dynamic = f"per-shape: {why}"
        self.info.notes.append(f"{label}: compiled once per shape ({why})")
        logs.get("recompiles").info("tempa backend: the %s graph could not be made shape-generic "
                                    "(%s); it is compiled again (gcc runs) for each new input "
                                    "shape", label, why)

    # -- the template ----------------------------------------------------------------------
    def _template(self, plan_at, ex_plan):
        """One rendering per grid point needed -> the code as a template over the symbols.

        First the base point and two steps along each axis (1 + 2n renderings): they give
        each literal's degree in each symbol. A literal of degree (d_0, d_1) is then fitted on
        the sub-grid {0..d_0} x {0..d_1} (so B*T*T needs (B, T), (B, T+1), (B, T+2) and the same
        at B+1: points off the axes are rendered only when some literal needs them), and
        checked against every rendering made, including the example's own."""
        n = len(self.syms)
        made: dict = {}

        def render_at(ix):
            made[ix] = plan_at(ix)
            return self._texts(made[ix], n)
        base = (0,) * n
        axis_pts = [base] + [tuple(k if j == i else 0 for j in range(n)) for i in range(n) for k in (1, 2)]
        for ix in axis_pts:
            made[ix] = plan_at(ix)
        self._settle([made[ix] for ix in axis_pts], ex_plan)
        texts = {ix: self._texts(made[ix], n) for ix in axis_pts}
        ex_texts = self._texts(ex_plan, n)
        skel = {}

        def split(ix, t):
            parts = [_NUM.split(x) for x in t]
            for part in range(2):
                mine, ref = parts[part], skel[base][part] if base in skel else parts[part]
                if len(mine) != len(ref) or mine[0::3] != ref[0::3] or mine[2::3] != ref[2::3]:
                    raise NotGeneric("the generated code's structure depends on the sizes "
                                     f"({self.PARTS[part]}: {_first_diff(ref, mine)})")
            return parts
        skel[base] = split(base, texts[base])
        for ix in axis_pts[1:]:
            skel[ix] = split(ix, texts[ix])
        ex_skel = split(None, ex_texts)
        # each varying literal: (part, position) -> degree per symbol
        degs = {}
        for part in range(2):
            for k in range(1, len(skel[base][part]), 3):
                vals = {ix: skel[ix][part][k] for ix in axis_pts}
                if all(v == vals[base] for v in vals.values()) and ex_skel[part][k] == vals[base]:
                    continue
                deg = []
                for i in range(n):
                    v0, v1, v2 = (_num(vals[tuple(kk if j == i else 0 for j in range(n))]) for kk in (0, 1, 2))
                    deg.append(2 if v2 - 2 * v1 + v0 else (1 if v1 != v0 else 0))
                degs[(part, k)] = tuple(deg)
        need = set()
        for deg in set(degs.values()):
            need |= set(itertools.product(*[range(d + 1) for d in deg]))
        for ix in sorted(need - set(skel)):
            skel[ix] = split(ix, render_at(ix))
        out = []
        used_syms: set = set()
        solvers: dict = {}
        for part in range(2):
            res = list(skel[base][part])
            for k in range(len(res)):
                if k % 3 != 1:
                    res[k] = res[k] or ""
                    continue
                deg = degs.get((part, k))
                if deg is None:
                    continue
                if deg not in solvers:
                    solvers[deg] = _Solver([[ax[kk] for kk in range(d + 1)] for ax, d in zip(self.axes, deg)])
                grid = list(itertools.product(*[range(d + 1) for d in deg]))
                text = skel[base][part][k]
                poly = solvers[deg].fit([_num(skel[ix][part][k]) for ix in grid])
                checks = [(tuple(ax[kk] for ax, kk in zip(self.axes, ix)), skel[ix][part][k]) for ix in skel]
                checks.append((self.example_point, ex_skel[part][k]))
                if poly is None or any(_eval(poly, pt) != _num(v) for pt, v in checks):
                    raise NotGeneric(f"a literal ({', '.join(str(v) for _, v in checks[:4])}, ...) "
                                     "is not a polynomial in the sizes")
                expr = _render(poly)
                used_syms |= {i for mono in poly for i, e in enumerate(mono) if e}
                is_float = any(c in text for c in ".eE")
                res[k] = self._literal(part, expr, is_float)
                res[k + 1] = ""        # a C++ ``LL`` suffix: the expression is int64_t already
            out.append("".join(res))
        cpp_src, wsrc = out
        # tensors baked into the artifact must not depend on the sizes (the example's are used)
        for name, t in ex_plan.lowered.constants.items():
            for p in made.values():
                o = p.lowered.constants.get(name)
                if o is None or o.shape != t.shape or o.dtype != t.dtype or not torch.equal(o, t):
                    raise NotGeneric(f"constant {name} changes with the sizes")
        # where each symbol comes from in this graph's inputs: a dim equal to it everywhere
        all_inputs = [made[ix].lowered.inputs for ix in made]
        points = [tuple(ax[k] for ax, k in zip(self.axes, ix)) for ix in made]
        prologue = []
        user_inputs = ex_plan.label in ("inference", "forward")     # its inputs are the user's
        for si in range(n):
            int_input = next((i for i, d, s in self.dims if d is None and s == self.syms[si]), None)
            if int_input is not None and user_inputs:
                prologue.append(f"        ds{si} = a{int_input}")
                continue
            src = next(((j, d) for j, b in enumerate(ex_plan.lowered.inputs) if b is not None
                        for d in range(len(b.sizes))
                        if b.sizes[d] == self.example_point[si] and all(
                            ins[j] is not None and len(ins[j].sizes) == len(b.sizes)
                            and ins[j].sizes[d] == pt[si] for ins, pt in zip(all_inputs, points))),
                       None)
            if src is None and si in used_syms:
                raise NotGeneric(f"size {self.syms[si]} is not a dimension of any input of the "
                                 f"{ex_plan.label} graph")
            prologue.append(f"        ds{si} = a{src[0]}.shape[{src[1]}]" if src else f"        ds{si} = 0")
        if user_inputs:
            for i, d, sym in self.ties:
                prologue.append(f"        if a{i}.shape[{d}] != ds{self.syms.index(sym)}: raise _SizeMismatch()")
        lines = wsrc.split("\n")
        at = next(i for i, l in enumerate(lines) if l.startswith("    def call(")) + 1
        wsrc = "\n".join(lines[:at] + prologue + lines[at:])
        if self.ties:
            wsrc = "from tempa.backend.dynamic import SizeMismatch as _SizeMismatch\n" + wsrc
        return self._make_dplan(ex_plan, (cpp_src, wsrc), n, made)


def symbol_ranges(gm) -> dict:
    """symbol -> (lowest, highest), None where unbounded: the values it may take, as the
    capture's ShapeEnv knows them (``torch._check(0 <= n <= x.shape[0])`` bounds a captured
    ``n``; a size read from an input is at least 2)."""
    out = {}
    for n in gm.graph.nodes:
        ev = n.meta.get("example_value") if n.op == "placeholder" else None
        values = [ev] if isinstance(ev, torch.SymInt) else \
            list(ev.shape) if isinstance(ev, torch.Tensor) else []
        for v in values:
            if not isinstance(v, torch.SymInt) or v.node.expr.is_number:
                continue
            try:
                r = v.node.shape_env.bound_sympy(v.node.expr)
                lo = int(r.lower) if r.lower.is_finite else None
                hi = int(r.upper) if r.upper.is_finite else None
            except Exception:  # noqa: BLE001 - no range known: any size
                lo, hi = None, None
            out[str(v.node.expr)] = (lo, hi)
    return out


def _grid_near(v: int, used: set, bounds, index_like: bool = False) -> list | None:
    """Three consecutive values near ``v``, none of them ``v`` itself (the example is a
    check point of its own: the fit on the grid must hold there too), preferably none in
    ``used`` (other sizes of the graph: a coincidence can change a rendering), from 2 up
    (0 and 1 are special sizes) and within ``bounds`` (lowest, highest; None: unbounded).
    Where the range has no room: an int input (``index_like``) stays in it, at other sizes
    or at 0 and 1 (a captured index: ``a[i]`` of a 4-row ``a``); a size may pass the bound
    (one computed from values, ``x[mask]``, is bounded by its input's numel, which its
    pieces' code need not be) rather than coincide with another size. A grid where the code
    fails or is not a polynomial costs only the generic code, never a right one: every
    rendering is checked."""
    lo, hi = bounds
    low = max(2, lo) if lo is not None else 2

    def windows(first, top, avoid):
        starts = sorted(range(first, (top if top is not None else max(v, first) + 64) - 1),
                        key=lambda st: abs(st + 1 - v))
        return next(([st, st + 1, st + 2] for st in starts
                     if not avoid & {st, st + 1, st + 2}), None)
    for k in range(80):
        start = v - 3 - 4 * (k // 2) if k % 2 == 0 else v + 1 + 4 * (k // 2)
        win = [start, start + 1, start + 2]
        if start >= low and (hi is None or start + 2 <= hi) and not used & set(win):
            return win
    if index_like:        # an int input: within its range, whatever it coincides with
        tries = [(low, hi, {v})] + ([(lo, hi, {v})] if lo is not None and lo < low else [])
        tries.append((low, None, used))
    else:                 # a size: past the bound rather than at another size
        tries = [(low, None, used), (low, hi, {v}), (low, None, {v})]
    for first, top, avoid in tries:
        win = windows(first, top, avoid)
        if win is not None:
            return win
    return None


def _key(inputs):
    return tuple(t.shape if isinstance(t, torch.Tensor) else t for t in inputs)


def _texts(plan, n):
    cpp_text = "\n\n".join(c.text for c in plan.seg_codes.values())
    wsrc, consts, _ = wrapper.render_wrapper(plan.sched, plan.lowered, plan.seg_codes, plan.num_inputs, n)
    plan.wrapper_rendered = (wsrc, consts)
    return cpp_text, wsrc


def _first_diff(a, b):
    for x, y in zip(a[0::3], b[0::3]):
        if x != y:
            i = next((i for i, (c, d) in enumerate(zip(x, y)) if c != d), min(len(x), len(y)))
            return f"{x[max(0, i - 50):i + 30]!r} vs {y[max(0, i - 50):i + 30]!r}"
    return "a different number of literals"


def _num(s):
    f = Fraction(s)
    return f


class _Solver:
    """Interpolation on the tensor grid: values at ``product(axes)`` -> coefficients of the
    monomials prod(s_i ** e_i), e_i in {0, 1, 2} (exact, in fractions)."""

    def __init__(self, axes):
        self.monos = list(itertools.product(*[range(len(a)) for a in axes]))
        pts = list(itertools.product(*axes))
        m = [[_mono(p, e) for e in self.monos] for p in pts]
        self.inv = _inverse(m)

    def fit(self, vals):
        coefs = [sum(r * v for r, v in zip(row, vals)) for row in self.inv]
        if any(c.denominator != 1 for c in coefs):
            return None
        return {e: int(c) for e, c in zip(self.monos, coefs) if c}


def _mono(p, e):
    r = Fraction(1)
    for x, k in zip(p, e):
        r *= Fraction(x) ** k
    return r


def _inverse(m):
    n = len(m)
    a = [row[:] + [Fraction(int(i == j)) for j in range(n)] for i, row in enumerate(m)]
    for c in range(n):
        piv = next(r for r in range(c, n) if a[r][c] != 0)
        a[c], a[piv] = a[piv], a[c]
        pv = a[c][c]
        a[c] = [x / pv for x in a[c]]
        for r in range(n):
            if r != c and a[r][c] != 0:
                f = a[r][c]
                a[r] = [x - f * y for x, y in zip(a[r], a[c])]
    return [row[n:] for row in a]


def _eval(poly, point):
    return sum(Fraction(c) * _mono(point, e) for e, c in poly.items())


def _render(poly) -> str:
    if not poly:
        return "0"
    terms = []
    for e, c in sorted(poly.items(), key=lambda t: (-sum(t[0]), t[0])):
        factors = [f"ds{i}" for i, k in enumerate(e) for _ in range(k)]
        if not factors:
            terms.append(str(c))
        elif c == 1:
            terms.append("*".join(factors))
        elif c == -1:
            terms.append("-" + "*".join(factors))
        else:
            terms.append(f"{c}*" + "*".join(factors))
    return " + ".join(terms).replace("+ -", "- ")


class _DynPlan:
    """A plan whose code is a template over the size symbols (see ``_template``)."""

    def __init__(self, ex_plan, cpp_src, wsrc, nsizes):
        self.ex = ex_plan
        self.cpp_src = cpp_src
        self.wsrc = wsrc
        self.nsizes = nsizes
        self.info = ex_plan.info
        self.label = ex_plan.label


def finish(dplans: list) -> list:
    """Build every template's C++ as one library (one gcc run), then make each wrapper."""
    parts = [p.cpp_src for p in dplans if p.ex.seg_codes]
    lib = so = None
    cached = False
    if parts:
        prelude = cpp.prelude()
        lib, so, cached = _build.build(prelude + "\n\n" + "\n\n".join(parts) + "\n", prelude, parts)
    out = []
    for p in dplans:
        info = p.info
        info.cpp_source = p.cpp_src
        info.wrapper_source = p.wsrc
        if p.ex.seg_codes:
            info.so_path = so
            info.from_disk_cache = cached
            info.used_gcc = not cached
            counters.bump("kernels_compiled", info.kernel_count)
        counters.bump("aten_fallbacks", len(info.aten_fallbacks))
        consts = p.ex.wrapper_rendered[1]
        call = instantiate(p.wsrc, lib, p.ex.seg_codes, p.ex.lowered.constants, consts)
        log = logs.get("code")
        if log.isEnabledFor(20):
            log.info("%s (shape-generic): %s\n--- wrapper ---\n%s\n--- C++ ---\n%s\n--- fusion ---\n%s",
                     p.label, info.summary(), p.wsrc, p.cpp_src, info.fusion_report)
        out.append((call, info))
    return out
