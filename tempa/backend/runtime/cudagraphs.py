"""mode="reduce-overhead": replay a compiled graph as a CUDA graph.

Why: on small inputs a GPU graph's time is the CPU's time to launch its kernels (a few
microseconds each); a CUDA graph launches all of them with one call.

How (one ``CudaGraphRunner`` per compiled graph; one recording per input layout: a CUDA
graph holds fixed addresses and sizes, so a new shape records a new graph; a graph with
symbolic sizes shares its shape-generic kernels between the recordings, gpu/dynamic.py):

  * inputs: a tensor argument is read in place, at its own address, while every call passes
    the tensor the graph was recorded with (parameters, buffers, a static KV cache, an input
    the caller passes again). A slot that once holds another tensor (another object, or the
    same object at another address) is copied from then on into a static buffer before each
    replay, and the graph is recorded again for that. Arguments the graph never reads are
    not copied. Why not copy every non-parameter argument, as before: a BatchNorm net has
    two buffers per layer, and ResNet-50's 107 small copies were 107 launches before every
    replay (its reduce-overhead was slower than its mode="default" on the H200). An output
    in the memory of an input read in place (the input, a view of it) is handed out as is:
    only that input's writes change it, as in eager.
  * inputs the graph writes to (BatchNorm's running statistics, a KV cache's index_copy_):
    replayed in place, so the write reaches the caller's tensor, and its version counter is
    bumped once per call as the compiled code does. The recording's warm-up runs on copies
    of them, so the call that records writes them once. A written slot that holds another
    tensor, or a copied argument sharing memory with a written one, runs without its graph.
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
  * training (calls that need autograd): the compiled forward and the compiled backward of
    the ``autograd.Function`` (backend/autograd.py) each replay as CUDA graphs of their own
    (``AutogradPartRunner``). Their outputs are protected as above, with one difference:
    an output buffer something still holds that cannot be redirected (autograd's copy of a
    saved output whose backward has not run yet, a gradient autograd keeps in ``.grad``
    while gradients accumulate, a view) is never overwritten; that call runs the compiled
    code without its graph, said once. The backward reads the forward's saved tensors in
    place when they are still the forward's buffers, so a step copies only its inputs.
  * no graph (the compiled code runs as is, and the reason is given once, as a warning and
    in ``tempa_info.notes``): CPU tensors among the inputs, a written input that is not read
    in place (above), a graph that fell back to eager, training with shape-generic kernels,
    or a capture that failed. The call that compiles the inference variant (after training
    calls) runs as is too: what the graph writes is known once it is compiled.
"""
from __future__ import annotations

import operator
import warnings
import weakref

import torch

_use_count = getattr(torch._C, "_storage_Use_Count", None)
# Giving an earlier output its own copy (set_) bumps its version counter; autograd would then
# refuse it as a saved tensor ("modified by an inplace operation"). The values are the same,
# so the version is put back.
_set_versions = getattr(torch._C._autograd, "_unsafe_set_version_counter", None)


_NO_TRAINING_GRAPHS = "reduce-overhead: training runs without CUDA graphs"


def _warn(msg):
    warnings.warn(msg, RuntimeWarning, stacklevel=3)


def _flat(out):
    if isinstance(out, torch.Tensor):
        return [out], True
    return list(out), False


# Indirections a test replaces to run the bookkeeping on the CPU (tests/backend/test_cudagraph_runner.py)
def _on_gpu(t):
    return t.is_cuda


def _cuda_available():
    return torch.cuda.is_available()


def _storage_ptr(t):
    return t.untyped_storage().data_ptr()


_data_ptr = torch.Tensor.data_ptr
_bump_versions = torch._C._increment_version


def _picker(idx):
    """``args -> tuple(args[i] for i in idx)``, in C where there are several."""
    if len(idx) > 1:
        return operator.itemgetter(*idx)
    if idx:
        i = idx[0]
        return lambda args: (args[i],)
    return lambda args: ()


def _layout(t):
    return t.shape, t.stride(), t.dtype, t.device


def _same_strided_copy(t):
    """A copy in ``t``'s own strides (``clone`` makes a non-dense view contiguous): the
    compiled kernels address their inputs with the strides they were compiled for."""
    buf = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
    buf.copy_(t)
    return buf


class _Changed(Exception):
    """A recording cannot replay: the reason is said and the graph runs as is."""


class _Recording:
    def __init__(self):
        self.graph = None
        self.static_in = {}        # arg index -> static buffer the argument is copied into
        self.in_place = []         # (arg index, tensor) read in place, at the tensor's address
        self.bumped = ()           # arg indices written in place whose version a call bumps
        self.outs = []             # static output tensors (or non-tensors)
        self.single = False
        self.watched = []          # (storage handle, use count right after recording) per owned output
        self.given = []            # weakrefs to what the last call returned
        self.input_aliases = frozenset()   # indices of outputs in the memory of an in-place input
        self.returned_inputs = {}  # output index -> the in-place arg index it is (the object)
        self.pick = self.objs = self.ptrs = self.layouts = None
        self.check_layout = False  # symbolic sizes: every call compares the layouts too

    def read_in_place(self, in_place, check_layout=False):
        self.in_place = in_place
        self.pick = _picker([i for i, _ in in_place])
        self.objs = tuple(t for _, t in in_place)
        self.ptrs = tuple(_data_ptr(t) for t in self.objs)
        self.layouts = tuple(map(_layout, self.objs))
        self.check_layout = check_layout

    def same_in_place(self, args) -> bool:
        """Whether every slot read in place holds the recorded tensor at its address (the
        common case, checked in C: one call's arguments are often hundreds of tensors).
        With static sizes the guards have checked every input's layout; with symbolic ones
        the same object could have been resized in place, so its layout is compared too."""
        got = self.pick(args)
        return all(map(operator.is_, got, self.objs)) and tuple(map(_data_ptr, got)) == self.ptrs \
            and (not self.check_layout or tuple(map(_layout, got)) == self.layouts)

    def changed_slots(self, args) -> list:
        """The in-place slots that hold another tensor now. A different object at the same
        address with the same layout (a view, a saved tensor unpacked again) still reads
        right in place: it is taken as the slot's tensor."""
        changed, kept = [], []
        for (i, _), ptr, layout in zip(self.in_place, self.ptrs, self.layouts):
            a = args[i]
            if _data_ptr(a) == ptr and _layout(a) == layout:
                kept.append((i, a))
            else:
                changed.append(i)
        if not changed:
            self.read_in_place(kept, self.check_layout)
        return changed


class CudaGraphRunner:
    capture_error_mode = "global"
    bumps_written_inputs = True    # the compiled inference bumps the versions of what it writes

    def __init__(self, fn, example_inputs, info, options, used=None, written=None):
        self.fn = fn
        self.info = info
        self.policy = (options or {}).get("cudagraph_outputs", "protect")
        if self.policy not in ("protect", "clone", "overwrite"):
            raise ValueError(f"cudagraph_outputs must be 'protect', 'clone' or 'overwrite', not {self.policy!r}")
        self.recs = {}
        self.disabled = None
        self.replays = 0
        self.training_said = False
        self.needs_grad = False
        self.slots = None          # indices of the tensor arguments the graph reads
        self.copied = ()           # slots copied into static buffers (they held other tensors)
        self.copied_set = frozenset()
        self.written = written     # slots the graph writes to (None: not known yet)
        if example_inputs is not None:
            self._slots(example_inputs, used)
            self.needs_grad = any(isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)
            reason = self._uncapturable(example_inputs)
            if reason:
                self._disable(reason)

    def _slots(self, examples, used=None):
        used = used if used is not None else [True] * len(examples)
        self.slots = [i for i, t in enumerate(examples) if isinstance(t, torch.Tensor) and used[i]]

    # -- why not -----------------------------------------------------------------------
    def _uncapturable(self, examples):
        for t in examples:
            if isinstance(t, torch.Tensor) and not _on_gpu(t):
                return "an input is a CPU tensor"
        if not _cuda_available():
            return "CUDA is not available"
        inf = self.info
        if inf.fallback_reason:
            return f"the graph runs eagerly ({inf.fallback_reason})"
        return None

    def _written(self):
        """The slots the graph writes to, once its inference variant is compiled (else None)."""
        if self.written is None:
            gi = self.info.inference
            if gi is not None:
                self.written = frozenset(getattr(gi, "mutated_inputs", None) or ())
        return self.written

    def _disable(self, reason):
        self.disabled = reason
        self._note(f"reduce-overhead: running without CUDA graphs: {reason}")

    def _note(self, msg):
        note_once(self.info, msg)

    # -- recording -----------------------------------------------------------------------
    def _key(self, args):
        return tuple((tuple(args[i].shape), tuple(args[i].stride()), args[i].dtype) for i in self.copied)

    def _borrowed(self, t) -> bool:
        """Whether argument ``t`` is read in place (AutogradPartRunner: the forward's buffers)."""
        return False

    def _record(self, args):
        rec = _Recording()
        call_args = list(args)
        in_place = []
        for i in self.slots:
            a = args[i]
            if self._borrowed(a):
                continue
            if i not in self.copied_set:
                in_place.append((i, a))
                continue
            rec.static_in[i] = call_args[i] = _same_strided_copy(a)
        rec.read_in_place(in_place, check_layout=bool(self.info.dynamic))
        written = sorted(self.written)
        self._check_written(args, rec, written)
        rec.bumped = tuple(written) if self.bumps_written_inputs else ()
        # the warm-up executes: on copies of what the graph writes, so this call writes once
        # (its replay below); the capture executes nothing, but the compiled code's version
        # bumps run: they are put back, the replay's own bump follows
        warm_args = [_same_strided_copy(a) if i in self.written else a for i, a in enumerate(call_args)]
        versions = [args[i]._version for i in written]
        rec.graph, out = self._capture(call_args, warm_args)
        if written and _set_versions is not None:
            _set_versions(tuple(args[i] for i in written), tuple(versions))
        rec.outs, rec.single = _flat(out)
        # an output in an input's memory read in place (the input itself, a view of it) is
        # never written by a replay but through that input, as in eager: handed out as is
        inputs = {_storage_ptr(t) for _, t in in_place}
        rec.input_aliases = frozenset(k for k, o in enumerate(rec.outs)
                                      if isinstance(o, torch.Tensor) and _storage_ptr(o) in inputs)
        rec.returned_inputs = {k: i for k in rec.input_aliases for i, t in in_place if rec.outs[k] is t}
        if _use_count is not None:
            # Outputs that alias an input (a parameter, a static input buffer) are watched by
            # nobody: their storage is the input's, held wherever the input is.
            seen = {_storage_ptr(t) for t in call_args if isinstance(t, torch.Tensor)}
            for o in rec.outs:
                if isinstance(o, torch.Tensor) and _storage_ptr(o) not in seen:
                    seen.add(_storage_ptr(o))
                    c = o.untyped_storage()._cdata
                    rec.watched.append((c, _use_count(c)))
        return rec

    def _check_written(self, args, rec, written):
        """A written input must be read in place (a write into its static copy would be lost),
        and no copied input may share its memory (the copy would not see the write)."""
        if not written:
            return
        if any(i in rec.static_in for i in written):
            raise _Changed("an input the graph writes to is another tensor than at its recording")
        memory = {_storage_ptr(args[i]) for i in written}
        if any(_storage_ptr(args[i]) in memory for i in rec.static_in):
            raise _Changed("an input copied to a static buffer shares memory with one the graph writes to")

    def _capture(self, call_args, warm_args):
        """(CUDA graph, its outputs) of one call of ``fn`` on ``call_args``."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            with torch.no_grad():
                self.fn(*warm_args)          # warm-up: module loads, library handles
        torch.cuda.current_stream().wait_stream(side)
        g = torch.cuda.CUDAGraph()
        pool = torch.cuda.graph_pool_handle()
        with torch.no_grad():
            with torch.cuda.graph(g, pool=pool, capture_error_mode=self.capture_error_mode):
                out = self.fn(*call_args)
        return g, out

    def _copy_from_now_on(self, rec, args) -> bool:
        """``rec``'s in-place slots that hold other tensors now are copied from this call on
        (every recording read them in place: all are dropped and recorded again). False when
        one of them is written by the graph."""
        changed = rec.changed_slots(args)
        if not changed:
            return True
        if any(i in self.written for i in changed):
            self._disable("an input the graph writes to is another tensor than at its recording")
            return False
        self.copied_set = self.copied_set | set(changed)
        self.copied = tuple(sorted(self.copied_set))
        self.recs.clear()
        self._dropped()
        return True

    # -- calling -------------------------------------------------------------------------
    def __call__(self, *args):
        if self.disabled is not None:
            return self.fn(*args)
        if self.needs_grad and torch.is_grad_enabled():
            out = self.fn(*args)         # the forward and backward replay their own graphs
            if not self.training_said:   # built by the first training call: known from now on
                self.training_said = True
                if not self.info.training_cudagraphs and not any(
                        n.startswith(_NO_TRAINING_GRAPHS) for n in self.info.notes):
                    self._note(f"{_NO_TRAINING_GRAPHS}: the training graph was compiled "
                               "shape-generically or fell back")
            return out
        return self._replay(args)

    def _replay(self, args):
        rec = self.recs.get(self._key(args))
        if rec is not None:
            if not self._protect(rec):
                return self.fn(*args)
            if not rec.same_in_place(args):
                if not self._copy_from_now_on(rec, args):
                    return self.fn(*args)
                rec = self.recs.get(self._key(args))
        if rec is None:
            if self._written() is None:
                return self.fn(*args)      # this call compiles the variant: recorded next time
            for i in self.slots:
                if not _on_gpu(args[i]):
                    return self.fn(*args)
            try:
                rec = self._record(args)
            except _Changed as e:
                self._disable(str(e))
                return self.fn(*args)
            except Exception as e:  # noqa: BLE001 - capture is an optimisation: run as is
                self._disable(f"capture failed ({type(e).__name__}: {str(e)[:200]})")
                torch.cuda.synchronize()
                return self.fn(*args)
            self.recs[self._key(args)] = rec
            self._recorded(rec)
        else:
            for i, buf in rec.static_in.items():
                buf.copy_(args[i])
        rec.graph.replay()
        if rec.bumped:
            _bump_versions(tuple(args[i] for i in rec.bumped))
        self.replays += 1
        return self._give(rec, args)

    def _recorded(self, rec):
        """Hook: a new recording exists (AutogradPartRunner lends its buffers)."""

    def _dropped(self):
        """Hook: every recording was dropped."""

    def _protect(self, rec) -> bool:
        """Before a replay: give earlier outputs the caller holds their own copy. False when
        something that cannot be redirected still holds an output buffer."""
        if self.policy == "clone":
            return True
        copies = {}
        for ref in rec.given:
            t = ref() if ref is not None else None
            if t is None:
                continue
            if self.policy == "protect":
                # The caller keeps its values, the graph its buffer. The copy keeps the
                # layout (a saved tensor may be a strided view into a wider buffer, and the
                # backward was compiled for those strides); outputs sharing a buffer share
                # one copy of it.
                storage = t.untyped_storage()
                new = copies.get(storage.data_ptr())
                if new is None:
                    new = copies[storage.data_ptr()] = storage.clone()
                version = t._version
                with torch.no_grad():
                    t.set_(new, t.storage_offset(), t.size(), t.stride())
                if _set_versions is not None:
                    _set_versions((t,), (version,))
            else:
                self._note("reduce-overhead: an output of an earlier call is still referenced and is "
                           "overwritten by this call (cudagraph_outputs='overwrite'); copy it with "
                           ".clone() to keep it")
        if _use_count is not None and self.policy == "protect":
            for c, base in rec.watched:
                if _use_count(c) > base:
                    return self._held()
        return True

    def _held(self) -> bool:
        self._note("reduce-overhead: a view of an earlier call's output is still referenced and "
                   "is overwritten by this call; take .clone() of outputs you keep, or pass "
                   "options={'cudagraph_outputs': 'clone'}")
        return True

    def _give(self, rec, args):
        outs = []
        refs = []
        for k, o in enumerate(rec.outs):
            if not isinstance(o, torch.Tensor):
                outs.append(o)
                refs.append(None)
                continue
            if k in rec.input_aliases and self.policy != "clone":
                i = rec.returned_inputs.get(k)
                outs.append(args[i] if i is not None else o.detach())   # an input returned: itself
                refs.append(None)
            elif self.policy == "clone":
                outs.append(o.clone())
                refs.append(None)
            else:
                a = o.detach()
                outs.append(a)
                refs.append(weakref.ref(a))
        rec.given = refs
        return outs[0] if rec.single else tuple(outs)


class AutogradPartRunner(CudaGraphRunner):
    """The compiled forward or backward of a training graph (the ``autograd.Function``'s
    ``fw_call`` / ``bw_call``) replayed as a CUDA graph.

    Differences from the inference runner:
      * slots are found on the first call;
      * the forward's writes (BatchNorm's running statistics) bump no version counter: the
        compiled forward bumps none either (autograd does not save those inputs);
      * an output buffer still held where it cannot be redirected is never overwritten:
        the call runs the compiled code as is (``_held``);
      * the backward (``lender`` = the forward's runner) reads a saved tensor in place when
        it is one of the forward's output buffers: the protection above guarantees such a
        buffer holds the values of the forward call that saved it;
      * capture is thread-local: autograd runs the backward on its own device thread.
    """
    capture_error_mode = "thread_local"
    bumps_written_inputs = False

    def __init__(self, fn, info, options, part, lender=None, written=()):
        options = dict(options or {})
        options["cudagraph_outputs"] = "protect"   # autograd keeps outputs: they must stay right
        super().__init__(fn, None, info, options, written=frozenset(written))
        self.part = part
        self.lender = lender
        self.lent = set()          # storage addresses of this runner's output buffers
        self.borrower = None       # the runner reading them in place (the forward's: the backward)
        if lender is not None:
            lender.borrower = self

    def __call__(self, *args):
        if self.disabled is not None:
            return self.fn(*args)
        if self.slots is None:
            self._slots(args)
            if any(isinstance(t, torch.Tensor) and not _on_gpu(t) for t in args):
                self._disable(f"the {self.part} graph has a CPU tensor among its inputs")
                return self.fn(*args)
        return self._replay(args)

    def _key(self, args):
        """The backward's recordings differ by where the forward's buffers it reads in place
        are (one per forward recording), and by the layout of what it copies."""
        if self.lender is None:
            return super()._key(args)
        lent = self.lender.lent
        copied = self.copied_set
        key = []
        for i in self.slots:
            t = args[i]
            if _storage_ptr(t) in lent:
                key.append((t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype))
            elif i in copied:
                key.append((tuple(t.shape), tuple(t.stride()), t.dtype))
            else:
                key.append(None)           # read in place: checked by identity
        return tuple(key)

    def _borrowed(self, t) -> bool:
        return self.lender is not None and _storage_ptr(t) in self.lender.lent

    def _recorded(self, rec):
        for o in rec.outs:
            if isinstance(o, torch.Tensor):
                self.lent.add(_storage_ptr(o))

    def _dropped(self):
        # the dropped buffers' memory can hold anything next: a tensor there is no longer
        # one of this runner's outputs (keyed by its address, it would record again and again);
        # the backward's recordings that read them in place can never replay again
        self.lent = set()
        if self.borrower is not None:
            self.borrower.recs.clear()

    def _held(self) -> bool:
        self._note(f"reduce-overhead: a buffer of the {self.part} graph is still held where it cannot "
                   "be given its own copy (a saved tensor whose backward has not run, gradients "
                   "accumulating in .grad, or a view of an output); such calls run without the CUDA "
                   "graph")
        return False


def note_once(info, msg):
    """Say ``msg`` in ``info.notes`` and as a warning, once per compiled graph."""
    if msg in info.notes:
        return
    info.notes.append(msg)
    _warn("tempa: " + msg)


def training_graphs(info, options, joint):
    """``graph_calls`` for autograd.build_training ((fw_call, bw_call) -> runners), or None
    (said once) on a PyTorch without the two functions that keep saved tensors right. What
    the forward writes to (BatchNorm's running statistics) it writes in place (the runner's
    inputs)."""
    if _use_count is None or _set_versions is None:
        reason = ("this PyTorch lacks torch._C._storage_Use_Count or "
                  "torch._C._autograd._unsafe_set_version_counter")
    else:
        def graph_calls(fw_call, bw_call):
            fw = AutogradPartRunner(fw_call, info, options, "forward", written=joint.mutated)
            bw = AutogradPartRunner(bw_call, info, options, "backward", lender=fw)
            info.training_cudagraphs = (fw, bw)
            return fw, bw
        return graph_calls
    note_once(info, f"{_NO_TRAINING_GRAPHS}: {reason}")
    return None


def wrap(compiled, example_inputs, info, options=None, used=None):
    runner = CudaGraphRunner(compiled, example_inputs, info, options, used)

    def call(*args):
        return runner(*args)
    call.tempa_info = info
    call.tempa_cudagraphs = runner
    return call
