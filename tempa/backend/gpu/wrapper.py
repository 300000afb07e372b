"""The per-call Python of a GPU graph: allocate outputs, launch kernels, call externs.

Rendered once as source text and exec'd, so a call does no graph walking: a straight line of
``torch.empty`` calls, one direct launcher call per kernel (``_R3(grid, 1, 1, stream,
function, metadata, None, None, None, *tensors)``, Triton's compiled launcher without the
JIT's per-call specialization), ATen calls for externs, and the return. The current stream is
read once per call, so the same wrapper can be captured into a CUDA graph (captures run on
a side stream).
"""
from __future__ import annotations

import os

import torch

from ..codegen.wrapper import (WrapperGen, _DTYPE_NAMES, _contig, _opname, alloc_layout,
                               reshape_outputs_at_allocation)
from ..ir import LoopValue, ExternCall
from ...sourcefiles import source_file


def render(plan, interp: bool, nsizes: int = 0):
    """The wrapper's source and its constants. ``nsizes`` > 0 (a shape-generic rendering,
    gpu/dynamic.py): every launch also passes the size symbols ``ds0..`` (read from the inputs
    in a prologue dynamic.py inserts), and grids are computed from the outer extent, so that
    they are polynomials in the sizes like every other literal."""
    # TEMPA_GPU_CHECK=1: after every launch and extern call, report the first non-finite
    # value (a debugging aid; synchronises after every step)
    check = bool(os.environ.get("TEMPA_GPU_CHECK"))
    lowered = plan.lowered
    w = WrapperGen(plan.num_inputs)
    L = w.lines
    args = ", ".join(f"a{i}" for i in range(plan.num_inputs))
    L.append(f"def call({args}):")
    if not interp:
        L.append("    _s = _stream(_di)")
    allocated = set()
    alloc_shape = reshape_outputs_at_allocation(lowered, w)
    # inputs a kernel reads through a pointer it assumes 16-byte aligned: nn.Parameters are
    # (the caching allocator's blocks are), anything else is checked per call
    checked = set()
    for it in plan.items:
        if isinstance(it, tuple):
            for b in it[1].params:
                if b.kind == "input" and b.input_index not in plan.param_inputs \
                        and not getattr(b, "_mutated", False) and b.input_index not in checked:
                    checked.add(b.input_index)
                    L.append(f"    if a{b.input_index}.data_ptr() & 15: a{b.input_index} = _realign(a{b.input_index})")
    launches = {}
    # buffer reuse (not for shape-generic renderings: their sizes are only known per call)
    dying, pinned = ({}, set()) if nsizes else _last_uses(plan)
    free: dict = {}                    # (shape, strides, dtype) -> names of dead buffers
    alloc_key: dict = {}               # buffer the wrapper allocated -> its layout

    def alloc(b):
        allocated.add(b)
        dt = _DTYPE_NAMES[b.dtype]
        # empty_strided for contiguous buffers too: cheaper argument parsing than
        # torch.empty(shape, dtype=..., device=...) (as in the C++ wrapper)
        shape, strides = alloc_layout(b, alloc_shape)
        key = (shape, strides, b.dtype)
        if b not in pinned and free.get(key):
            # a dead buffer of the same layout: its last reader was launched earlier on this
            # stream, so a kernel writing it now runs after that read
            L.append(f"    {b.name} = {free[key].pop()}")
        else:
            L.append(f"    {b.name} = _empty_strided({shape!r}, {strides!r}, dtype=torch.{dt}, device=_dev)")
        alloc_key[b] = key

    for pos, it in enumerate(plan.items):
        for b in dying.get(pos - 1, ()):
            if b in alloc_key:         # ATen's own results are not recycled
                free.setdefault(alloc_key[b], []).append(b.name)
        if isinstance(it, ExternCall):
            call_args = ", ".join([w.tensor(a) for a in it.args] +
                                  [f"{k}={w.tensor(v)}" for k, v in it.kwargs.items()])
            opname = _opname(it.op, w)
            out = it.outputs[0] if len(it.outputs) == 1 else None
            if (it.op in _OUT_VARIANT and not it.fallback and out is not None and not nsizes
                    and tuple(out.strides) == _contig(out.sizes) and out not in alloc_shape):
                # mm/bmm into a buffer the wrapper provides (a recycled one when possible):
                # the out= variant skips ATen's allocation, ~5 µs of host time per call
                alloc(out)
                L.append(f"    {opname}({call_args}, out={out.name})")
                if check:
                    L.append(f"    _chk({it.name!r}, {out.name})")
                continue
            allocated.update(b for b in it.outputs if b is not None)
            if it.multi:
                L.append(f"    _r = {opname}({call_args})")
                for i, b in enumerate(it.outputs):
                    if b is not None:
                        L.append(f"    {b.name} = _r[{i}]")
            else:
                L.append(f"    {it.outputs[0].name} = {opname}({call_args})")
            if it.op not in _FRESH_CONTIGUOUS:
                # ATen picks an output's layout from its inputs' layouts, and an argument may
                # reach the op in another layout than at trace time (lowering materialises
                # some views): kernels index outputs with the traced strides, so restore them
                for b in it.outputs:
                    if b is not None and b.numel > 1:
                        st = tuple(b.strides)
                        L.append(f"    if {b.name}.stride() != {st!r}: {b.name} = _restride({b.name}, {st!r})")
            if check:
                outs_ = [b.name for b in it.outputs if b is not None]
                L.append(f"    _chk({it.name!r}, {', '.join(outs_)})")
            continue
        kp, kc = it
        for b in kc.params:
            if b.kind == "py" and b not in allocated:
                alloc(b)
        ptrs = ", ".join([w.bufname(b) for b in kc.params] + [f"ds{i}" for i in range(getattr(kc, "nsizes", 0))])
        launches[kc.name] = True
        grid = f"-(-{kc.xnumel} // {kc.xblock})" if nsizes else kc.grid
        if interp:
            L.append(f"    _K_{kc.name}[({grid},)]({ptrs})")
        else:
            n = kc.name
            L.append(f"    _L_{n}({grid}, 1, 1, _s, _F_{n}, _CO_{n}, _PDL_{n}, None, None, _M_{n}, None, None, None, {ptrs})")
        if check:
            written = [w.bufname(m.target if m.kind == "alias" else m) for m in kp.members if m.kind in ("py", "alias")]
            L.append(f"    _chk({kc.name + ': ' + kc.summary[:80]!r}, {', '.join(written)})")
    outs = [w.tensor(v) for v in lowered.outputs]
    L.append(f"    return ({', '.join(outs)}{',' if len(outs) == 1 else ''})")
    head = ["import torch", "", "def make(_KS, _C, _K, _dev, _di, _stream, _realign, _chk=None, _restride=None):",
            "    _empty = torch.empty", "    _empty_strided = torch.empty_strided",
            "    _as_strided = torch.as_strided"]
    for name in launches:
        if interp:
            head.append(f"    _K_{name} = _KS[{name!r}]")
        else:
            head += [f"    _L_{name} = _KS[{name!r}].launch", f"    _F_{name} = _KS[{name!r}].function",
                     f"    _M_{name} = _KS[{name!r}].meta", f"    _CO_{name} = _KS[{name!r}].cooperative",
                     f"    _PDL_{name} = _KS[{name!r}].pdl"]
    head += [f"    {name} = {expr}" for expr, name in w.ops.items()]
    body = ["    " + x for x in L]
    return "\n".join(head + body + ["    return call"]) + "\n", w.consts


def _last_uses(plan):
    """({item position: [buffers whose last use it is]}, pinned buffers).

    A buffer the wrapper allocates may be handed to a later allocation of the same layout
    once its last reader has been launched. Never reused: graph outputs (the caller holds
    them) and anything an ATen fallback read (its result may be a view of it). Why: a GPT
    at batch 1 allocated ~220 buffers per call, ~2-3 µs of host time each, while the GPU
    waits on the host."""
    from ..schedule import _extern_buffers
    last: dict = {}
    pinned: set = set()
    for v in plan.lowered.outputs:
        if isinstance(v, LoopValue) and v.strided is not None:
            pinned.add(v.strided[0])
    for pos, it in enumerate(plan.items):
        if isinstance(it, ExternCall):
            used = _extern_buffers(it.args, it.kwargs)
            if it.fallback:
                pinned.update(used)
        else:
            used = [getattr(b, "target", None) or b for b in it[1].params]
        for b in used:
            last[b] = pos
    dying: dict = {}
    for b, pos in last.items():
        if b.kind == "py" and b not in pinned:
            dying.setdefault(pos, []).append(b)
    return dying, pinned


def _stream_fn():
    f = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if f is not None:
        return f
    return lambda i: torch.cuda.current_stream(i).cuda_stream


def _poison_empty(*a, **k):
    t = torch.empty(*a, **k)
    return t.fill_(float("nan") if t.is_floating_point() else -1)


def _poison_empty_strided(*a, **k):
    t = torch.empty_strided(*a, **k)
    return t.fill_(float("nan") if t.is_floating_point() else -1)


_reported: set = set()


def _check(what, *ts):
    for t in ts:
        if isinstance(t, torch.Tensor) and t.is_floating_point() and t.numel() and not bool(torch.isfinite(t).all()):
            if what not in _reported:
                _reported.add(what)
                print(f"TEMPA_GPU_CHECK: non-finite output after {what}: shape {tuple(t.shape)} "
                      f"{t.dtype} nan={int(torch.isnan(t).sum())} inf={int(torch.isinf(t).sum())}", flush=True)
            return


aten = torch.ops.aten
_FRESH_CONTIGUOUS = {aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default}
_OUT_VARIANT = {aten.mm.default, aten.bmm.default}


def _restride(t, stride):
    return torch.empty_strided(t.shape, stride, dtype=t.dtype, device=t.device).copy_(t)


def _realign(t):
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)


def build(plan, mod, compiled: dict, interp: bool, rendered=None):
    """``rendered``: (source, constants) made elsewhere (a shape-generic template)."""
    from .kernels import Launcher
    src, consts = rendered or render(plan, interp)
    ns: dict = {}
    exec(compile(src, source_file(src, f"gpu wrapper {plan.label}"), "exec"), ns)
    if interp:
        ks = {name: getattr(mod, name) for name in {it[1].name for it in plan.items if isinstance(it, tuple)}}
        dev, di = torch.device("cpu"), 0
    else:
        ks = {name: Launcher(ck) for name, ck in compiled.items()}
        dev = torch.device("cuda", torch.cuda.current_device())
        di = dev.index
    call = ns["make"](ks, plan.lowered.constants, consts, dev, di, _stream_fn(), _realign, _check, _restride)
    if os.environ.get("TEMPA_POISON"):
        # debugging aid: every buffer the wrapper allocates starts as NaN (or -1), so a kernel
        # that reads an element nothing wrote shows up as a wrong result
        ns2: dict = {}
        exec(compile(src.replace("_empty = torch.empty\n", "_empty = _poison_empty\n")
                     .replace("_empty_strided = torch.empty_strided\n", "_empty_strided = _poison_empty_strided\n"),
                     f"<tempa gpu wrapper {plan.label}>", "exec"), ns2)
        ns2["_poison_empty"] = _poison_empty
        ns2["_poison_empty_strided"] = _poison_empty_strided
        ns2["make"].__globals__.update(ns2)
        call = ns2["make"](ks, plan.lowered.constants, consts, dev, di, _stream_fn(), _realign, _check, _restride)
    call._keepalive = (mod, plan.lowered.constants, ks)
    return call, src
