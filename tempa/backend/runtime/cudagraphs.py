"""mode="reduce-overhead": replay a compiled graph as a CUDA graph.

Why: on small inputs a GPU graph's time is the CPU's time to launch its kernels (a few
microseconds each); a CUDA graph launches all of them with one call.

How (one ``CudaGraphRunner`` per compiled graph and input shape: a CUDA graph holds fixed
addresses and sizes, so a new shape records a new graph; a graph with symbolic sizes shares
its shape-generic kernels between the recordings, gpu/dynamic.py):

  * static inputs: arguments that are ``nn.Parameter``s are used in place (their addresses
    are fixed; if a different tensor object arrives in a parameter slot the graph is
    recorded again); every other tensor argument is copied into a static buffer per call.
    Arguments the graph never reads are not copied.
  * memory: each recording has a private memory pool, so nothing else reuses its buffers.
  * outputs: the graph writes into the same output buffers on every replay. What the caller
    gets (``options={"cudagraph_outputs": ...}``):
      - "protect" (default): fresh tensor objects aliasing the static outputs. Before the
        next replay, every such output the caller still holds is given its own copy of its
        values (``Tensor.set_``), so results of earlier calls never change under the caller
        and nothing is copied when the caller has dropped them. Views the caller made of an
        earlier output cannot be redirected: they are overwritten, and tempa warns once
        (torch.compile overwrites every earlier output and errors when one is read).
      - "clone": a copy of every output on every call (one device copy each).
      - "overwrite": torch.compile's contract: outputs are overwritten by the next call;
        tempa warns once when it overwrites an output the caller still holds.
  * no graph (the compiled code runs as is, and the reason is given once, as a warning and
    in ``tempa_info.notes``): CPU tensors among the inputs, a graph that mutates its inputs,
    a graph that fell back to eager, calls that need autograd (training runs the compiled
    forward and backward without CUDA graphs), or a capture that failed.
"""
from __future__ import annotations

import importlib
import warnings
import weakref

import torch

stats = importlib.import_module("tempa.stats")
_use_count = getattr(torch._C, "_storage_Use_Count", None)


def _warn(msg):
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out], True
    return list(out), False


class _Recording:
    def __init__(self):
        self.graph = None
        self.static_in = {}        # arg index -> static buffer
        self.static_ids = []       # (arg index, tensor) used in place
        self.outs = []             # static output tensors (or non-tensors)
        self.single = False
        self.base = []             # storage use count of each output right after recording
        self.given = []            # weakrefs to what the last call returned


class CudaGraphRunner:
    def __init__(self, fn, example_inputs, info, options, used=None):
        self.fn = fn
        self.info = info
        self.policy = (options or {}).get("cudagraph_outputs", "protect")
        if self.policy not in ("protect", "clone", "overwrite"):
            raise ValueError(f"cudagraph_outputs must be 'protect', 'clone' or 'overwrite', not {self.policy!r}")
        n = len(example_inputs)
        used = used if used is not None else [True] * n
        self.param_idx = [i for i, t in enumerate(example_inputs)
                          if isinstance(t, torch.nn.Parameter) and used[i]]
        self.dyn_idx = [i for i, t in enumerate(example_inputs)
                        if isinstance(t, torch.Tensor) and not isinstance(t, torch.nn.Parameter) and used[i]]
        self.needs_grad = any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)
        self.recs = {}
        self.disabled = None
        self.warned = set()
        reason = self._uncapturable(example_inputs)
        if reason:
            self._disable(reason)

    # -- why not -----------------------------------------------------------------------
    def _uncapturable(self, examples):
        for t in examples:
            if isinstance(t, torch.Tensor) and not t.is_cuda:
                return "an input is a CPU tensor"
        if not torch.cuda.is_available():
            return "CUDA is not available"
        inf = self.info
        if inf.fallback_reason:
            return f"the graph runs eagerly ({inf.fallback_reason})"
        gi = inf.inference
        if gi is not None and getattr(gi, "mutated_inputs", None):
            return "the graph mutates its inputs"
        return None

    def _disable(self, reason):
        self.disabled = reason
        self._note(f"reduce-overhead: running without CUDA graphs: {reason}")

    def _note(self, msg):
        if msg in self.warned:
            return
        self.warned.add(msg)
        self.info.notes.append(msg)
        _warn("tempa: " + msg)

    # -- recording -----------------------------------------------------------------------
    def _key(self, args):
        return tuple((tuple(args[i].shape), tuple(args[i].stride()), args[i].dtype) for i in self.dyn_idx)

    def _record(self, args):
        rec = _Recording()
        call_args = list(args)
        for i in self.dyn_idx:
            a = args[i]
            buf = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
            buf.copy_(a)
            rec.static_in[i] = buf
            call_args[i] = buf
        rec.static_ids = [(i, args[i]) for i in self.param_idx]
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            with torch.no_grad():
                self.fn(*call_args)          # warm-up: module loads, library handles
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        pool = torch.cuda.graph_pool_handle()
        with torch.no_grad():
            with torch.cuda.graph(g, pool=pool):
                out = self.fn(*call_args)
        rec.graph = g
        rec.outs, rec.single = _flat(out)
        rec.base = [(_use_count(o.untyped_storage()._cdata) if isinstance(o, torch.Tensor) and _use_count else 0)
                    for o in rec.outs]
        return rec

    # -- calling -------------------------------------------------------------------------
    def __call__(self, *args):
        if self.disabled is not None:
            return self.fn(*args)
        if self.needs_grad and torch.is_grad_enabled():
            self._note("reduce-overhead: calls that need autograd run the compiled forward/backward "
                       "without CUDA graphs")
            return self.fn(*args)
        key = self._key(args) if self.dyn_idx else ()
        rec = self.recs.get(key)
        if rec is not None:
            for i, t in rec.static_ids:
                if args[i] is not t:
                    rec = None             # a parameter slot holds another tensor: record again
                    break
        if rec is None:
            for i in self.dyn_idx + self.param_idx:
                if not args[i].is_cuda:
                    return self.fn(*args)
            try:
                rec = self._record(args)
            except Exception as e:  # noqa: BLE001 - capture is an optimisation: run as is
                self._disable(f"capture failed ({type(e).__name__}: {str(e)[:200]})")
                torch.cuda.synchronize()
                return self.fn(*args)
            self.recs[key] = rec
        else:
            for i, buf in rec.static_in.items():
                buf.copy_(args[i])
        self._protect(rec)
        rec.graph.replay()
        return self._give(rec)

    def _protect(self, rec):
        if self.policy == "clone":
            return
        for k, ref in enumerate(rec.given):
            t = ref() if ref is not None else None
            if t is None:
                continue
            if self.policy == "protect":
                t.set_(t.clone())           # the caller keeps its values; the graph its buffer
            else:
                self._note("reduce-overhead: an output of an earlier call is still referenced and is "
                           "overwritten by this call (cudagraph_outputs='overwrite'); copy it with "
                           ".clone() to keep it")
        if _use_count is not None and self.policy == "protect":
            for o, base in zip(rec.outs, rec.base):
                if isinstance(o, torch.Tensor) and _use_count(o.untyped_storage()._cdata) > base:
                    self._note("reduce-overhead: a view of an earlier call's output is still referenced and "
                               "is overwritten by this call; take .clone() of outputs you keep, or pass "
                               "options={'cudagraph_outputs': 'clone'}")
                    break

    def _give(self, rec):
        outs = []
        refs = []
        for o in rec.outs:
            if not isinstance(o, torch.Tensor):
                outs.append(o)
                refs.append(None)
                continue
            if self.policy == "clone":
                outs.append(o.clone())
                refs.append(None)
            else:
                a = o.detach()
                outs.append(a)
                refs.append(weakref.ref(a))
        rec.given = refs
        return outs[0] if rec.single else tuple(outs)


def wrap(compiled, example_inputs, info, options=None, used=None):
    runner = CudaGraphRunner(compiled, example_inputs, info, options, used)

    def call(*args):
        return runner(*args)
    call.tempa_info = info
    call.tempa_cudagraphs = runner
    return call
