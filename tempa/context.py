"""What one tempa.compile(...) call holds: its settings, the caches of the code objects it
compiled, and the dispatchers that run them.

A call checks the cached entries of its code object; on a miss (no entry's guards pass)
the context captures the call, hands the graph to the backend, and turns capture's
outcomes (an entry, an unsupported construct, the user's own exception) into what the
user sees: a compiled call, an eager run that says why, or eager's error.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
import traceback
import types
import weakref

import torch
from torch.amp import autocast_mode
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode_stack, \
    any_torch_dispatch_mode_on_stack

from . import counters, distributed, logs, stance
from .configuration import config
from .backend.runtime import nativeguards
from .capture import calls, calls_inline, higher_order
from .capture import runtime as capture_runtime
from .capture.breaks import BreakReason, GraphBreakError, InternalError, Unsupported, UserError, \
    fullgraph_error
from .capture.cache import MISS, CodeCache, build_entry, install_invalidation_hooks, \
    with_identifier_names
from .capture.capture import capture
from .optimized_module import OptimizedModule, call_module
from .settings import check_settings, resolve_backend

# every live context, for tempa.reset()
contexts: "weakref.WeakSet[CompileContext]" = weakref.WeakSet()
_GENERATOR_FLAGS = (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR |
                    inspect.CO_ITERABLE_COROUTINE)
_fallback_log = logs.get("fallbacks")


_dispatch_stack_len = torch._C._len_torch_dispatch_stack


def _outside_dispatch_modes():
    """Capture and compile with the torch dispatch modes off when a user's mode is on the
    stack (only modes that ignore compile internals can be: see
    ``_eager_under_dispatch_mode``). Infra modes alone (fake tensors) stay as they are."""
    if _dispatch_stack_len() and not all(m.is_infra_mode()
                                         for m in _get_current_dispatch_mode_stack()):
        return _disable_current_modes()
    return contextlib.nullcontext()


# How many compiles this thread is inside (capture, then the backend): a compiled function
# called meanwhile is run by the compile itself (see CompileContext._eager_inside_trace).
_compiling = threading.local()


@contextlib.contextmanager
def _compiling_here():
    _compiling.depth = getattr(_compiling, "depth", 0) + 1
    try:
        yield
    finally:
        _compiling.depth -= 1


def _has_fake_tensor(args, kwargs) -> bool:
    """Is an argument (or an item of a list/tuple/dict argument) a fake tensor? Asked on a
    miss only; without the fake-tensor module loaded no fake tensor exists (and importing
    it costs seconds)."""
    fake_tensor = sys.modules.get("torch._subclasses.fake_tensor")
    if fake_tensor is None:
        return False
    values = [*args, *kwargs.values()]
    for v in [*values]:
        if isinstance(v, (list, tuple)):
            values += v
        elif isinstance(v, dict):
            values += v.values()
    return any(isinstance(v, torch.Tensor) and fake_tensor.is_fake(v) for v in values)


def _raised_at(fn, exc: BaseException) -> BreakReason:
    """Where ``exc`` left the compiled function ``fn`` (its innermost line there)."""
    where_ = (fn.__code__.co_filename, fn.__code__.co_firstlineno)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is fn.__code__:
            where_ = (tb.tb_frame.f_code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    return BreakReason("user exception", f"{type(exc).__name__}: {exc}", where_[0], where_[1],
                       fn.__qualname__)


class _CaptureRaised:
    """What ``_capture_and_compile`` returns when capture raised an exception of the user's
    code: the call runs eagerly, which raises it again unless it was tempa's own."""
    __slots__ = ("error",)

    def __init__(self, error: BaseException):
        self.error = error


class CompileContext:
    """The settings of one tempa.compile(...) call and the caches built under them."""

    def __init__(self, *, fullgraph, dynamic, backend, mode, options):
        check_settings(fullgraph, dynamic, mode, options)
        # the arguments of tempa.compile, so a copied OptimizedModule can compile afresh
        self.settings = dict(fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode,
                             options=options)
        self.fullgraph = fullgraph
        self.dynamic = dynamic
        self.mode = mode
        self.options = options or {}
        self.backend_name = backend if isinstance(backend, str) else getattr(backend, "__name__", "custom")
        self.backend = resolve_backend(backend, mode, self.options)
        self.caches: dict = {}   # code object -> its entries
        # entries of functions made per call (_made_per_call), dropped with the function
        self._function_caches = weakref.WeakKeyDictionary()
        self._dispatchers = weakref.WeakKeyDictionary()   # function -> its dispatcher
        # module -> its forward's dispatcher, for a module whose hooks run outside it
        self._forward_dispatchers: dict = {}
        self.record = False        # explain(): keep every graph and break seen
        self.graph_log: list = []  # (function, GraphModule)
        self.break_log: list = []  # (function, BreakReason)
        self.fallback_log: list = []  # (function, reason)
        self._mode_eager_noted = weakref.WeakSet()   # caches said to run under a dispatch mode
        self._inside_trace_noted = weakref.WeakSet()   # caches said to run inside a trace
        self.recompile_log: list = []  # (function name, the guard that failed)
        self.auto_trials: dict = {}    # CodeCache -> stance.AutoTrial (stance "auto")
        self.measure_trials: dict = {}  # the same for config.measure_against_eager
        self.stance_log: list = []     # the verdicts of those trials, as sentences
        install_invalidation_hooks()
        nativeguards.prebuild()   # its one-time compiler run overlaps the first capture
        if config.logs:
            logs.enable(config.logs)
        contexts.add(self)

    def cache_for(self, fn) -> CodeCache:
        if _made_per_call(fn):
            caches = self._function_caches
            cache = caches.get(fn)
            if cache is None:
                cache = caches[fn] = CodeCache(fn.__code__, fn.__qualname__)
            return cache
        cache = self.caches.get(fn.__code__)
        if cache is None:
            cache = self.caches.setdefault(fn.__code__, CodeCache(fn.__code__, fn.__qualname__))
        return cache

    def all_caches(self) -> list:
        """Every code cache, functions made per call included (for explain and entries)."""
        return [*self.caches.values(), *self._function_caches.values()]

    def dispatcher(self, fn, eager, cache: CodeCache | None = None):
        cache = cache or self.cache_for(fn)
        cache.module_call = cache.module_call or eager is call_module
        miss = self._miss

        def dispatch(*args, **kwargs):
            if _dispatch_stack_len() and any_torch_dispatch_mode_on_stack():
                return self._eager_under_dispatch_mode(cache, fn, eager, args, kwargs)
            if stance.state.active:
                return self._with_stance(cache, fn, eager, args, kwargs)
            if kwargs:
                for entry in cache.entries:
                    result = entry.fn(*args, **kwargs)
                    if result is not MISS:
                        return result
            else:                   # the common call: no keyword dict to unpack per entry
                for entry in cache.entries:
                    result = entry.fn(*args)
                    if result is not MISS:
                        return result
            return miss(cache, fn, eager, args, kwargs)
        if config.measure_against_eager:
            dispatch = self._measured(dispatch, cache, fn, eager)
        dispatch.__tempa_cache__ = cache
        return dispatch

    def _compiled_call(self, cache, fn, eager, args, kwargs):
        for entry in cache.entries:
            result = entry.fn(*args, **kwargs)
            if result is not MISS:
                return result
        return self._miss(cache, fn, eager, args, kwargs)

    def _with_stance(self, cache, fn, eager, args, kwargs):
        """A call under a stance other than "default" (stance.py says what each does;
        the recompile stances act in ``_capture_and_compile``)."""
        name = stance.state.name
        if name == "force_eager":
            counters.bump("stance_eager_calls")
            return eager(*args, **kwargs)
        if name != "auto":
            return self._compiled_call(cache, fn, eager, args, kwargs)
        trial = self.auto_trials.get(cache)
        if trial is None:
            trial = self.auto_trials.setdefault(cache, stance.AutoTrial())
        return self._trial_call(cache, fn, eager, trial, args, kwargs)

    def _measured(self, dispatch, cache, fn, eager):
        """``dispatch`` after a one-time trial of its compiled code against eager
        (``config.measure_against_eager``): the verdict is said, the compiled code kept."""
        trials = self.measure_trials

        def measured(*args, **kwargs):
            trial = trials.get(cache)
            if trial is None:
                trial = trials.setdefault(cache, stance.AutoTrial(switch=False))
            if trial.choice is not None or stance.state.active:
                return dispatch(*args, **kwargs)
            return self._trial_call(cache, fn, eager, trial, args, kwargs)
        return measured

    def _trial_call(self, cache, fn, eager, trial, args, kwargs):
        """One call of ``fn`` while ``trial`` times its compiled code against eager."""
        path, timed = trial.next_path(), trial.timed()
        if path == "eager":
            counters.bump("stance_eager_calls")
        if not timed:
            if path == "eager":
                return eager(*args, **kwargs)
            result = self._compiled_call(cache, fn, eager, args, kwargs)
            trial.record("compiled", None)
            return result
        start = stance.timer()
        if path == "eager":
            result = eager(*args, **kwargs)
        else:
            result = self._compiled_call(cache, fn, eager, args, kwargs)
        if trial.record(path, stance.timer() - start):
            self._announce_choice(cache, fn, trial)
        return result

    def _announce_choice(self, cache, fn, trial) -> None:
        text = trial.describe(where(fn))
        self.stance_log.append(text)
        logs.get("perf").info("%s", text)
        if trial.choice == "eager":          # the compiled code measured slower than eager
            _fallback_log.warning("tempa: %s", text)

    # -- calls made by graph-break runners ---------------------------------------------------
    def call(self, fn, *args, **kwargs):
        """Call ``fn`` from an entry's Python part: Python callees go through tempa, so a
        function or submodule that broke the caller's graph gets compiled graphs of its own.
        A torch operation written in Python (torch.unique, F.*) is an op, not code to
        compile: it runs as it is."""
        if calls_inline.runs_uncompiled(fn):
            return fn(*args, **kwargs)
        if isinstance(fn, types.FunctionType) and not calls.is_torch_op(fn):
            fn = with_identifier_names(fn)   # a comprehension's code, called after a break
            dispatch = self._dispatchers.get(fn)
            if dispatch is None:
                dispatch = self._dispatchers[fn] = self.dispatcher(fn, fn)
            return dispatch(*args, **kwargs)
        if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
            return self.call(fn.__func__, fn.__self__, *args, **kwargs)
        if isinstance(fn, torch.nn.Module) and not isinstance(fn, OptimizedModule) and \
                "forward" not in fn.__dict__:
            if distributed.has_module_hooks(fn):
                # Hooks (FSDP2's unshard/reshard, user hooks) run eagerly, forward compiled.
                return distributed.call_with_compiled_forward(
                    fn, self.forward_of(fn), args, kwargs)
            forward = type(fn).forward
            dispatch = self._dispatchers.get(forward)
            if dispatch is None:
                dispatch = self._dispatchers[forward] = self.dispatcher(forward, call_module)
            return dispatch(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    def forward_of(self, mod: torch.nn.Module):
        """``mod``'s forward through tempa, for callers that run ``mod``'s hooks themselves:
        where tempa cannot compile it, it falls back to the plain forward (not to
        ``mod(...)``, which would run the hooks a second time). Each such module gets a cache
        of its own, as if compiled on its own: the blocks of an FSDP2 model share one
        ``forward`` code object, and one cache would hit the recompile limit at block 9."""
        dispatch = self._forward_dispatchers.get(mod)
        if dispatch is not None:
            return dispatch
        forward = mod.__dict__.get("forward")
        if isinstance(forward, types.FunctionType):
            fn, bound_self = forward, None
        elif isinstance(forward, types.MethodType):
            fn, bound_self = forward.__func__, forward.__self__
        else:
            fn, bound_self = type(mod).forward, mod
        cache = self.caches.setdefault((fn.__code__, id(mod)),
                                       CodeCache(fn.__code__, fn.__qualname__))
        dispatch = self.dispatcher(fn, fn, cache)
        if bound_self is not None:
            dispatch = functools.partial(dispatch, bound_self)
        self._forward_dispatchers[mod] = dispatch
        return dispatch

    # -- the slow path: no entry matched --------------------------------------------------
    def _miss(self, cache: CodeCache, fn, eager, args, kwargs):
        if getattr(_compiling, "depth", 0) or _has_fake_tensor(args, kwargs):
            return self._eager_inside_trace(cache, fn, eager, args, kwargs)
        entry = None
        with cache.lock:
            for e in cache.entries:  # another thread may have captured meanwhile
                if e.fn(*args, **kwargs) is not MISS:
                    entry = e
                    break
            if entry is None and cache.eager_reason is None:
                # (capture's own saves must not reach activation checkpointing's hooks)
                # (nor reach the dispatch modes that ignore compile internals: capture's
                # ops on fake tensors are such internals; the compiled graph runs under them)
                with distributed.outside_saved_tensors_hooks(), _outside_dispatch_modes(), \
                        logs.compiling_for(logs._compiling_for or logs.user_frame()), _compiling_here():
                    entry = self._capture_and_compile(cache, fn, args, kwargs)
        if type(entry) is _CaptureRaised:
            if self.fullgraph:
                result = self._eager_under_fullgraph(fn, eager, args, kwargs)
            else:
                result = eager(*args, **kwargs)   # the user's error: eager raises it, from their code
            self._capture_error_was_ours(cache, fn, entry.error)   # eager did not raise
            return result
        if entry is None:
            return eager(*args, **kwargs)
        result = entry.fn(*args, **kwargs)
        if result is MISS:  # guards that fail on the very call they were built from: a bug
            _fallback_log.warning("tempa: guards of %s failed on their own capture (%s); running "
                                  "eagerly", cache.name, entry.why(*args, **kwargs))
            return eager(*args, **kwargs)
        return result

    def _eager_inside_trace(self, cache, fn, eager, args, kwargs):
        """A compiled function called by a trace, not by the program: on fake tensors (a
        custom op's kernel run by a backend's fake-tensor trace) or while this thread
        compiles another function (that kernel run by tempa's capture on fakes or by the
        backend's trace on clones). It runs eagerly as part of that trace: capturing it
        would make fakes of another mode's fakes, which fake tensors refuse, and a trace
        nested in the backend's trace crashed. Its calls from the compiled code compile."""
        if cache not in self._inside_trace_noted:
            self._inside_trace_noted.add(cache)
            _fallback_log.info("tempa: %s called by a trace (on fake tensors, or while "
                               "compiling another function): that call runs eagerly", where(fn))
        return eager(*args, **kwargs)

    def _eager_under_fullgraph(self, fn, eager, args, kwargs):
        """Capture found the user's code raising, so there is no graph: the call runs eagerly
        (eager, not capture, decides whether it raises and what), and an exception that
        leaves it is raised as eager's class and GraphBreakError at once (``fullgraph_error``
        says why). Without fullgraph, eager's exception passes through unchanged."""
        try:
            return eager(*args, **kwargs)
        except Exception as exc:
            counters.bump("graph_breaks")
            raise fullgraph_error(exc, _raised_at(fn, exc)) from exc

    def _eager_under_dispatch_mode(self, cache, fn, eager, args, kwargs):
        """A torch dispatch mode on the stack must see each op this call runs, as in eager
        (it may log, count or change them); a compiled graph's kernels bypass it, so the
        call runs eagerly (as torch.compile skips such frames), said once per function.
        Modes whose ``ignore_compile_internals()`` is True, and infra modes (fake tensors),
        do not count: compiled code is opaque to them by their own declaration."""
        if cache not in self._mode_eager_noted:
            self._mode_eager_noted.add(cache)
            counters.bump("eager_fallbacks")
            reason = ("a torch dispatch mode is active that sees every op (its "
                      "ignore_compile_internals() is False)")
            self.fallback_log.append((fn, reason))
            _fallback_log.warning("tempa: running %s eagerly: %s", where(fn), reason)
        return eager(*args, **kwargs)

    def _capture_error_was_ours(self, cache: CodeCache, fn, error: BaseException) -> None:
        """Capture raised ``error`` as if the user's code had, but eager ran the same call
        without it: the error was tempa's. That call ran eagerly; so do the later ones, and
        it is said (a count, explain, the log), never a silent eager run."""
        cache.eager_reason = (f"capturing raised {type(error).__name__}({error}) where eager "
                              "does not (a tempa bug; please report it)")
        counters.bump("eager_fallbacks")
        self.fallback_log.append((fn, cache.eager_reason))
        _fallback_log.warning("tempa: running %s eagerly: %s", where(fn), cache.eager_reason)

    def _internal_error(self, cache: CodeCache, fn, error: Exception) -> None:
        """Capture failed in tempa's own code (a bug): this call and the later ones run
        eagerly, counted, named in explain and logged with the internal traceback."""
        where_ = f" at {error.where}" if isinstance(error, InternalError) else ""
        cause = error.error if isinstance(error, InternalError) else error
        frame = traceback.extract_tb(cause.__traceback__)[-1:]
        inside = f" ({frame[0].filename}:{frame[0].lineno} in {frame[0].name})" if frame else ""
        cache.eager_reason = (f"tempa's capture failed{where_}: {type(cause).__name__}: {cause}"
                              f"{inside} (a tempa bug; please report it)")
        counters.bump("eager_fallbacks")
        self.fallback_log.append((fn, cache.eager_reason))
        _fallback_log.warning("tempa: running %s eagerly: %s\n%s", where(fn), cache.eager_reason,
                              "".join(traceback.format_exception(cause)).rstrip())

    def _capture_and_compile(self, cache: CodeCache, fn, args, kwargs):
        if not config.capture:
            # this call runs eagerly; a later one captures if capture is switched back on
            _fallback_log.info("tempa: capture is off (tempa.config.capture): %s runs eagerly",
                               where(fn))
            return None
        if fn.__code__ in calls_inline.DISABLED_CODES:
            cache.eager_reason = "disabled by tempa.disable"
            return None
        if higher_order.is_disabled(fn):
            cache.eager_reason = "disabled by torch.compiler.disable"
            return None
        if fn.__code__.co_flags & _GENERATOR_FLAGS:
            # Calling it only creates the generator (or coroutine); its body runs later, as
            # the caller iterates it, outside any call tempa could compile.
            cache.eager_reason = "a generator or coroutine function (its body runs as it is iterated)"
            counters.bump("eager_fallbacks")
            self.fallback_log.append((fn, cache.eager_reason))
            _fallback_log.warning("tempa: running %s eagerly: %s", where(fn), cache.eager_reason)
            return None
        if cache.entries and stance.state.name in ("eager_on_recompile", "fail_on_recompile"):
            why = cache.entries[0].why(*args, **kwargs)
            if stance.state.name == "fail_on_recompile":
                raise stance.RecompileError(f"tempa: {where(fn)} would recompile (stance "
                                            f"'fail_on_recompile'); the guard that failed: {why}")
            counters.bump("stance_eager_calls")
            return None    # this call runs eagerly; the entries stay for calls that fit them
        if cache.captures >= config.recompile_limit:
            why = cache.entries[0].why(*args, **kwargs) if cache.entries else "?"
            cache.eager_reason = f"recompile_limit ({config.recompile_limit}) reached"
            counters.bump("eager_fallbacks")
            logs.warn(f"tempa: {where(fn)} was recompiled {cache.captures} times "
                      f"(recompile_limit={config.recompile_limit}); it runs eagerly from now "
                      f"on. The guard that kept failing: {why}. Raise "
                      "tempa.config.recompile_limit, or mark the changing dimension "
                      "dynamic.", UserWarning)
            return None
        why = cache.entries[0].why(*args, **kwargs) if cache.entries else None
        try:
            captured = self._capture(cache, fn, args, kwargs)
        except Unsupported as u:
            counters.bump("graph_breaks")
            if u.location is None:   # raised outside any frame (building the output plan)
                code = fn.__code__
                u.at(code.co_filename, code.co_firstlineno, fn.__qualname__)
            if self.fullgraph:
                raise GraphBreakError(u.location) from None
            cache.eager_reason = str(u)
            counters.bump("eager_fallbacks")
            self.fallback_log.append((fn, str(u)))
            if self.record:
                self.break_log.append((fn, u.location))
            _fallback_log.warning("tempa: running %s eagerly: %s", where(fn), u)
            return None
        except UserError as e:
            return _CaptureRaised(e.exc)   # the user's code raises: eager raises it too
        except Exception as e:   # tempa's own code failed (InternalError, or outside any handler)
            if config.raise_on_failure:
                raise e.error if isinstance(e, InternalError) else e
            self._internal_error(cache, fn, e)
            return None
        try:
            compiled = _restoring_global_state(self._compile_graph(captured, fn), captured.gm)
        except UserError:
            return None  # the graph fails on these inputs (a wrong dtype): eager's error
        # counted once the entry exists: a call that raises eager's error is no recompile
        cache.captures += 1
        cache.last_shapes = captured.input_shapes
        cache.last_ints = captured.input_ints
        cache.replaced_buffers |= captured.replaced_buffers
        counters.bump("captures")
        if why is not None:
            counters.bump("recompiles")
            self.recompile_log.append((fn.__qualname__, why))
            if logs.on("recompiles"):
                logs.get("recompiles").info("recompiling %s: %s", where(fn), why)
        if captured.break_reason is not None:
            counters.bump("graph_breaks")
            if self.record:
                self.break_log.append((fn, captured.break_reason))
            if logs.on("breaks"):
                logs.get("breaks").info("graph break in %s: %s", where(fn), captured.break_reason)
        if self.record:
            self.graph_log.append((fn, captured.gm))
        if logs.on("graphs"):
            logs.get("graphs").info("graph for %s:\n%s", where(fn), captured.gm.code)
        entry = build_entry(fn, captured, compiled, nativeguards)
        # A call with bad arguments fails in the entry: its TypeError names the user's function.
        entry.fn.__name__, entry.fn.__qualname__ = fn.__name__, fn.__qualname__
        if logs.on("guards"):
            logs.get("guards").info("guards for %s:\n%s", where(fn),
                                    "\n".join(f"  {d}" for _, d in entry.guards))
        cache.add(entry)
        return entry

    def _capture(self, cache, fn, args, kwargs):
        dynamic = self._dynamic_for(cache, fn, args, kwargs)
        ints = self._symbolic_ints(cache, fn, args, kwargs)
        replaced = frozenset(cache.replaced_buffers)
        try:
            return capture(fn, args, kwargs, runtime=self, allow_breaks=not self.fullgraph,
                           dynamic=dynamic, symbolic_ints=ints, module_call=cache.module_call,
                           replaced_buffers=replaced)
        except UserError as e:
            if ints:
                # An int that cannot be a symbol where the code uses it (a dict key: a SymInt
                # has no hash): this function keeps its ints by value from now on.
                cache.static_ints = f"{type(e.exc).__name__}: {(str(e.exc).splitlines() or [''])[0][:160]}"
                if logs.on("recompiles"):
                    logs.get("recompiles").info("%s: symbolic ints failed (%s); guarding them "
                                                "by value instead", where(fn), cache.static_ints)
                return self._capture(cache, fn, args, kwargs)
            if not dynamic:
                raise
            # An operator whose fake kernel cannot take symbolic sizes (nn.Bilinear's
            # aten._trilinear asserts) looks like an error of the user's code. Capture this
            # call with its real sizes; if that fails too, it is the user's error. This function
            # then compiles per shape (it had been silently eager, recapturing on every call).
            captured = capture(fn, args, kwargs, runtime=self, allow_breaks=not self.fullgraph,
                               dynamic=False, module_call=cache.module_call,
                               replaced_buffers=replaced)
            first_line = (str(e.exc).splitlines() or [""])[0][:160]
            cache.static_only = f"symbolic sizes failed ({type(e.exc).__name__}: {first_line})"
            _fallback_log.warning("tempa: %s: %s; compiling it per shape instead", where(fn),
                                  cache.static_only)
            return captured

    def _dynamic_for(self, cache, fn, args, kwargs):
        """Automatic dynamic shapes, as torch.compile's: the first capture is static; when a
        recompile happens because an input's sizes changed, the dimensions that changed
        become symbolic from then on (added up over recompiles), so the next graph serves
        every size there. Only those: a CNN whose batch changes keeps its image sizes static,
        and its kernels stay shape-generic in the batch alone (with the height and width
        symbolic too, they were compiled once per batch size)."""
        if cache.static_only:
            return False
        if self.dynamic is not None:
            return self.dynamic
        if not config.automatic_dynamic_shapes or not cache.last_shapes:
            return cache.dynamic_inputs or None
        for expr, shape, value in self._read_again(cache, fn, args, kwargs, cache.last_shapes):
            if isinstance(value, torch.Tensor) and value.dim() == len(shape) and \
                    tuple(value.shape) != shape:
                changed = {d for d in range(len(shape)) if value.shape[d] != shape[d]}
                known = cache.dynamic_inputs.get(expr, set())
                if not changed <= known and logs.on("recompiles"):
                    logs.get("recompiles").info(
                        "%s: the size of %s changed in dim(s) %s (%s -> %s); the next graph "
                        "takes any size there", where(fn), expr, sorted(changed), shape,
                        tuple(value.shape))
                cache.dynamic_inputs[expr] = known | changed
        return cache.dynamic_inputs or None

    def _symbolic_ints(self, cache, fn, args, kwargs):
        """Automatic dynamic for Python ints, as torch.compile's: an int read from outside
        (an argument, an attribute of the caller's object or of a global one, a cell, a dict
        item) is guarded by value at first; when a recompile happens and it changed, only in
        value, it is a symbol from then on (``shapes.int_input``), so a counter that moves on
        every call (a KV cache's ``cumulative_length``) finds one graph for all its values.
        Under ``dynamic=True`` every int read from the arguments is a symbol from the first
        capture on (True), as in torch.compile."""
        if cache.static_only or cache.static_ints or self.dynamic is False:
            return frozenset()
        if self.dynamic is True:
            return True
        if not config.automatic_dynamic_shapes:
            return frozenset()
        for expr, last, value in self._read_again(cache, fn, args, kwargs, cache.last_ints):
            if type(value) is int and value != last and expr not in cache.dynamic_ints:
                if logs.on("recompiles"):
                    logs.get("recompiles").info(
                        "%s: the int %s changed (%s -> %s); the next graph takes any value "
                        "there", where(fn), expr, last, value)
                cache.dynamic_ints.add(expr)
        return frozenset(cache.dynamic_ints)

    @staticmethod
    def _read_again(cache, fn, args, kwargs, last: dict):
        """(expression, what the last capture saw, its value in this call) for each
        expression of ``last`` that can be read in this call."""
        if not last:
            return
        from .capture.calls_inline import bind_arguments
        try:
            scope = bind_arguments(fn, args, kwargs)
        except Exception:
            return
        # an input read through an outside object (``___O3.keys``, a cache's tensor) names
        # that object by the last capture's constants
        consts = dict(cache.entries[0].captured.guards.consts) if cache.entries else {}
        for expr, seen in last.items():
            try:
                value = eval(expr, consts, scope)  # noqa: S307 - expressions tempa generated
            except Exception:
                continue
            yield expr, seen, value

    def _compile_graph(self, captured, fn):
        if captured.empty:
            return captured.gm   # nothing to compute: run as it is, as torch.compile does
        counters.bump("graphs_compiled")
        backend = self.backend
        if captured.dynamic and not getattr(backend, "supports_dynamic", False):
            backend = _per_shape(backend)
        try:
            compiled = backend(captured.gm, captured.example_inputs)
        except Exception as e:
            from .backend.entry import raises_in_eager
            if raises_in_eager(captured.gm, captured.example_inputs):
                raise UserError(e) from None
            if config.raise_on_failure:
                raise
            counters.bump("eager_fallbacks")
            _fallback_log.warning("tempa: backend %r failed on the graph of %s (%s: %s); running "
                                  "that graph with ATen ops instead", self.backend_name,
                                  where(fn), type(e).__name__, e)
            return captured.gm
        return compiled

    def clear(self):
        for cache in [*self.caches.values(), *self._function_caches.values()]:
            cache.clear()
        self.caches.clear()
        self._function_caches.clear()
        self.auto_trials.clear()
        self.measure_trials.clear()


def _made_per_call(fn) -> bool:
    """The functions of one code object share entries, except one made by a ``def`` or
    lambda that runs on every call with cells or defaults of its own (an entry reads the
    cells and binds the defaults of the function it was captured from, as constants): each
    such function gets entries of its own, else a callee ``g`` made anew per call would run
    with the first call's ``k`` (``def g(y): return y + k``)."""
    return "<locals>" in getattr(fn, "__qualname__", "") and bool(
        getattr(fn, "__closure__", None) or getattr(fn, "__defaults__", None) or
        getattr(fn, "__kwdefaults__", None))


_STATE_TARGETS = (torch._C._set_grad_enabled, autocast_mode._enter_autocast)


def _restoring_global_state(compiled, gm):
    """A graph that switches grad mode or autocast (``with torch.no_grad():`` inside it)
    restores both when it raises, as the ``with`` block's exit would in eager."""
    nodes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in _STATE_TARGETS]
    if not nodes:
        return compiled
    devices = tuple(sorted({n.args[0] for n in nodes if n.target is autocast_mode._enter_autocast}))
    save, restore = capture_runtime.global_state, capture_runtime.restore_global_state

    def run(*args):
        state = save(devices)
        try:
            return compiled(*args)
        except BaseException:
            restore(state)
            raise
    if not isinstance(compiled, torch.nn.Module):
        run.__dict__.update(getattr(compiled, "__dict__", {}))   # tempa_info & co stay readable
    return run


def _per_shape(backend):
    """For a backend that bakes sizes into its code: compile the graph once per concrete
    input-shape signature (the graph itself stays shape-generic)."""
    def compile_per_shape(gm, example_inputs):
        compiled = {}

        def run(*inputs):
            key = tuple(t.shape if isinstance(t, torch.Tensor) else t for t in inputs)
            fn = compiled.get(key)
            if fn is None:
                fn = compiled[key] = backend(gm, list(inputs))
            return fn(*inputs)
        run.per_shape = compiled
        return run
    return compile_per_shape


def where(fn) -> str:
    code = fn.__code__
    return f"{fn.__qualname__} ({code.co_filename}:{code.co_firstlineno})"


def calling(target):
    """A small Python function that calls ``target`` (a builtin, a partial, an object with
    ``__call__``): what tempa compiles in its place."""
    def call(*args, **kwargs):
        return target(*args, **kwargs)
    call.__qualname__ = call.__name__ = getattr(target, "__name__", type(target).__name__)
    return call
