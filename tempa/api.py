"""The public surface: compile(), OptimizedModule, disable(), reset(), stats().

The only layer that knows all the others: it hands capture a backend callable and turns
capture's outcomes (an entry, an unsupported construct, the user's own exception) into
what the user sees.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass
import types
import weakref

import torch
from torch.amp import autocast_mode
from torch.nn.modules.lazy import LazyModuleMixin
from torch.utils._python_dispatch import _disable_current_modes, _get_current_dispatch_mode_stack, \
    any_torch_dispatch_mode_on_stack

from . import distributed, logs, stance, stats as _stats
from .config import config
from .backend.runtime import nativeguards
from .capture import calls, higher_order
from .capture import runtime as capture_runtime
from .capture.breaks import BreakReason, GraphBreakError, Unsupported, UserError, fullgraph_error
from .capture.cache import MISS, CodeCache, build_entry, install_invalidation_hooks, clear_watchers
from .capture.capture import capture
from .capture.explain import ExplainOutput, has_ops

_contexts: "weakref.WeakSet[CompileContext]" = weakref.WeakSet()
_GENERATOR_FLAGS = (inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR |
                    inspect.CO_ITERABLE_COROUTINE)
_fallback_log = logs.get("fallbacks")


def _resolve_backend(backend, mode, options):
    if callable(backend):
        return backend
    if backend == "eager":
        def eager_backend(gm, example_inputs):
            return gm.forward   # skips nn.Module.__call__: ~3 µs a call on small graphs
        eager_backend.supports_dynamic = True
        return eager_backend
    if backend == "tempa":
        def tempa_backend(gm, example_inputs):
            try:
                from .backend import tempa_backend as compile_graph
            except ImportError as e:
                _fallback_log.warning("tempa backend unavailable (%s); running the captured "
                                      "graph with ATen ops", e)
                return gm
            return compile_graph(gm, example_inputs, mode=mode, options=options)
        tempa_backend.supports_dynamic = True   # shape-generic code, or per shape inside
        return tempa_backend
    hint = " (torch.compile's backends are not tempa's; tempa's compiler is 'tempa', the " \
        "default)" if backend in _TORCH_BACKENDS else ""
    raise ValueError(f"tempa.compile: unknown backend {backend!r}{hint}; the backends are "
                     "'tempa', 'eager' or a callable (gm, example_inputs) -> callable")


_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_TORCH_BACKENDS = ("inductor", "aot_eager", "aot_eager_decomp_partition", "cudagraphs",
                   "onnxrt", "tvm", "openxla")
# options= keys the tempa backend reads (what they do: the modules named)
OPTIONS = {
    "cudagraph_outputs": "'protect', 'clone' or 'overwrite' (runtime/cudagraphs.py)",
    "max_autotune_gemm_backends": "'triton,aten', 'triton' or 'aten' (gpu/gemm_tune.py)",
    "max_autotune_gemm_configs": "a list of [BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages]",
}


def _check_settings(fullgraph, dynamic, mode, options) -> None:
    """tempa.compile's arguments, refused at once with the valid values (a typo accepted
    silently would compile something other than what the user asked for)."""
    if not isinstance(fullgraph, bool):
        raise TypeError(f"tempa.compile: fullgraph must be True or False, not {fullgraph!r}")
    if not isinstance(dynamic, (bool, type(None))):
        raise ValueError(f"tempa.compile: dynamic must be None (automatic), True or False, "
                         f"not {dynamic!r}")
    if mode not in (None, *_MODES):
        raise ValueError(f"tempa.compile: unknown mode {mode!r}; the modes are "
                         f"{', '.join(map(repr, _MODES))}")
    if options is None:
        return
    if not isinstance(options, dict):
        raise TypeError(f"tempa.compile: options must be a dict, not {type(options).__name__}")
    unknown = [k for k in options if k not in OPTIONS]
    if unknown:
        raise ValueError(f"tempa.compile: unknown option(s) {', '.join(map(repr, unknown))}; "
                         "the options are " + "; ".join(f"{k}: {v}" for k, v in OPTIONS.items()))


_dispatch_stack_len = torch._C._len_torch_dispatch_stack


def _outside_dispatch_modes():
    """Capture and compile with the torch dispatch modes off when a user's mode is on the
    stack (only modes that ignore compile internals can be: see
    ``_eager_under_dispatch_mode``). Infra modes alone (fake tensors) stay as they are."""
    if _dispatch_stack_len() and not all(m.is_infra_mode()
                                         for m in _get_current_dispatch_mode_stack()):
        return _disable_current_modes()
    return contextlib.nullcontext()


def _raised_at(fn, exc: BaseException) -> BreakReason:
    """Where ``exc`` left the compiled function ``fn`` (its innermost line there)."""
    where = (fn.__code__.co_filename, fn.__code__.co_firstlineno)
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code is fn.__code__:
            where = (tb.tb_frame.f_code.co_filename, tb.tb_lineno)
        tb = tb.tb_next
    return BreakReason("user exception", f"{type(exc).__name__}: {exc}", where[0], where[1],
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
        _check_settings(fullgraph, dynamic, mode, options)
        # the arguments of tempa.compile, so a copied OptimizedModule can compile afresh
        self.settings = dict(fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode,
                             options=options)
        self.fullgraph = fullgraph
        self.dynamic = dynamic
        self.mode = mode
        self.options = options or {}
        self.backend_name = backend if isinstance(backend, str) else getattr(backend, "__name__", "custom")
        self.backend = _resolve_backend(backend, mode, self.options)
        self.caches: dict = {}
        self._dispatchers = weakref.WeakKeyDictionary()   # function -> its dispatcher
        # module -> its forward's dispatcher, for a module whose hooks run outside it
        self._forward_dispatchers: dict = {}
        self.record = False        # explain(): keep every graph and break seen
        self.graph_log: list = []  # (function, GraphModule)
        self.break_log: list = []  # (function, BreakReason)
        self.fallback_log: list = []  # (function, reason)
        self._mode_eager_noted = weakref.WeakSet()   # caches said to run under a dispatch mode
        self.recompile_log: list = []  # (function name, the guard that failed)
        self.auto_trials: dict = {}    # CodeCache -> stance.AutoTrial (stance "auto")
        self.stance_log: list = []     # the choices stance "auto" made, as sentences
        install_invalidation_hooks()
        nativeguards.prebuild()   # its one-time compiler run overlaps the first capture
        if config.logs:
            logs.enable(config.logs)
        _contexts.add(self)

    def cache_for(self, fn) -> CodeCache:
        cache = self.caches.get(fn.__code__)
        if cache is None:
            cache = self.caches.setdefault(fn.__code__, CodeCache(fn.__code__, fn.__qualname__))
        return cache

    def dispatcher(self, fn, eager, cache: CodeCache | None = None):
        cache = cache or self.cache_for(fn)
        cache.module_call = cache.module_call or eager is _call_module
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
        dispatch.__tempa_cache__ = cache
        return dispatch

    def _eager_under_dispatch_mode(self, cache, fn, eager, args, kwargs):
        """A torch dispatch mode on the stack must see each op this call runs, as in eager
        (it may log, count or change them); a compiled graph's kernels bypass it, so the
        call runs eagerly (as torch.compile skips such frames), said once per function.
        Modes whose ``ignore_compile_internals()`` is True, and infra modes (fake tensors),
        do not count: compiled code is opaque to them by their own declaration."""
        if cache not in self._mode_eager_noted:
            self._mode_eager_noted.add(cache)
            _stats.bump("eager_fallbacks")
            reason = "a torch dispatch mode is active that sees every op (its ignore_compile_internals() is False)"
            self.fallback_log.append((fn, reason))
            _fallback_log.warning("tempa: running %s eagerly: %s", _where(fn), reason)
        return eager(*args, **kwargs)

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
            _stats.bump("stance_eager_calls")
            return eager(*args, **kwargs)
        if name != "auto":
            return self._compiled_call(cache, fn, eager, args, kwargs)
        trial = self.auto_trials.get(cache)
        if trial is None:
            trial = self.auto_trials.setdefault(cache, stance.AutoTrial())
        path, timed = trial.next_path(), trial.timed()
        if path == "eager":
            _stats.bump("stance_eager_calls")
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
        text = trial.describe(_where(fn))
        self.stance_log.append(text)
        logs.get("perf").info("%s", text)
        if trial.choice == "eager":
            _fallback_log.warning("tempa: %s", text)

    # -- calls made by graph-break runners ---------------------------------------------------
    def call(self, fn, *args, **kwargs):
        """Call ``fn`` from an entry's Python part: Python callees go through tempa, so a
        function or submodule that broke the caller's graph gets compiled graphs of its own.
        A torch operation written in Python (torch.unique, F.*) is an op, not code to
        compile: it runs as it is."""
        if calls.runs_uncompiled(fn):
            return fn(*args, **kwargs)
        if isinstance(fn, types.FunctionType) and not calls.is_torch_op(fn):
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
                dispatch = self._dispatchers[forward] = self.dispatcher(forward, _call_module)
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
                        logs.compiling_for(logs._compiling_for or logs.user_frame()):
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

    def _eager_under_fullgraph(self, fn, eager, args, kwargs):
        """Capture found the user's code raising, so there is no graph: the call runs eagerly
        (eager, not capture, decides whether it raises and what), and an exception that
        leaves it is raised as eager's class and GraphBreakError at once (``fullgraph_error``
        says why). Without fullgraph, eager's exception passes through unchanged."""
        try:
            return eager(*args, **kwargs)
        except Exception as exc:
            _stats.bump("graph_breaks")
            raise fullgraph_error(exc, _raised_at(fn, exc)) from exc

    def _capture_error_was_ours(self, cache: CodeCache, fn, error: BaseException) -> None:
        """Capture raised ``error`` as if the user's code had, but eager ran the same call
        without it: the error was tempa's. That call ran eagerly; so do the later ones, and
        it is said (a count, explain, the log), never a silent eager run."""
        cache.eager_reason = (f"capturing raised {type(error).__name__}({error}) where eager "
                              "does not (a tempa bug; please report it)")
        _stats.bump("eager_fallbacks")
        self.fallback_log.append((fn, cache.eager_reason))
        _fallback_log.warning("tempa: running %s eagerly: %s", _where(fn), cache.eager_reason)

    def _capture_and_compile(self, cache: CodeCache, fn, args, kwargs):
        if fn.__code__ in calls.DISABLED_CODES:
            cache.eager_reason = "disabled by tempa.disable"
            return None
        if higher_order.is_disabled(fn):
            cache.eager_reason = "disabled by torch.compiler.disable"
            return None
        if fn.__code__.co_flags & _GENERATOR_FLAGS:
            # Calling it only creates the generator (or coroutine); its body runs later, as
            # the caller iterates it, outside any call tempa could compile.
            cache.eager_reason = "a generator or coroutine function (its body runs as it is iterated)"
            _stats.bump("eager_fallbacks")
            self.fallback_log.append((fn, cache.eager_reason))
            _fallback_log.warning("tempa: running %s eagerly: %s", _where(fn), cache.eager_reason)
            return None
        if cache.entries and stance.state.name in ("eager_on_recompile", "fail_on_recompile"):
            why = cache.entries[0].why(*args, **kwargs)
            if stance.state.name == "fail_on_recompile":
                raise stance.RecompileError(f"tempa: {_where(fn)} would recompile (stance "
                                            f"'fail_on_recompile'); the guard that failed: {why}")
            _stats.bump("stance_eager_calls")
            return None    # this call runs eagerly; the entries stay for calls that fit them
        if cache.captures >= config.recompile_limit:
            why = cache.entries[0].why(*args, **kwargs) if cache.entries else "?"
            cache.eager_reason = f"recompile_limit ({config.recompile_limit}) reached"
            _stats.bump("eager_fallbacks")
            logs.warn(f"tempa: {_where(fn)} was recompiled {cache.captures} times "
                      f"(recompile_limit={config.recompile_limit}); it runs eagerly from now "
                      f"on. The guard that kept failing: {why}. Raise "
                      "tempa.config.recompile_limit, or mark the changing dimension "
                      "dynamic.", UserWarning)
            return None
        why = cache.entries[0].why(*args, **kwargs) if cache.entries else None
        try:
            captured = self._capture(cache, fn, args, kwargs)
        except Unsupported as u:
            _stats.bump("graph_breaks")
            if u.location is None:   # raised outside any frame (building the output plan)
                code = fn.__code__
                u.at(code.co_filename, code.co_firstlineno, fn.__qualname__)
            if self.fullgraph:
                raise GraphBreakError(u.location) from None
            cache.eager_reason = str(u)
            _stats.bump("eager_fallbacks")
            self.fallback_log.append((fn, str(u)))
            if self.record:
                self.break_log.append((fn, u.location))
            _fallback_log.warning("tempa: running %s eagerly: %s", _where(fn), u)
            return None
        except UserError as e:
            return _CaptureRaised(e.exc)   # the user's code raises: eager raises it too
        try:
            compiled = _restoring_global_state(self._compile_graph(captured, fn), captured.gm)
        except UserError:
            return None  # the graph fails on these inputs (a wrong dtype): eager's error
        # counted once the entry exists: a call that raises eager's error is no recompile
        cache.captures += 1
        cache.last_shapes = captured.input_shapes
        _stats.bump("captures")
        if why is not None:
            _stats.bump("recompiles")
            self.recompile_log.append((fn.__qualname__, why))
            if logs.on("recompiles"):
                logs.get("recompiles").info("recompiling %s: %s", _where(fn), why)
        if captured.break_reason is not None:
            _stats.bump("graph_breaks")
            if self.record:
                self.break_log.append((fn, captured.break_reason))
            if logs.on("breaks"):
                logs.get("breaks").info("graph break in %s: %s", _where(fn), captured.break_reason)
        if self.record:
            self.graph_log.append((fn, captured.gm))
        if logs.on("graphs"):
            logs.get("graphs").info("graph for %s:\n%s", _where(fn), captured.gm.code)
        entry = build_entry(fn, captured, compiled, nativeguards)
        # A call with bad arguments fails in the entry: its TypeError names the user's function.
        entry.fn.__name__, entry.fn.__qualname__ = fn.__name__, fn.__qualname__
        if logs.on("guards"):
            logs.get("guards").info("guards for %s:\n%s", _where(fn),
                                    "\n".join(f"  {d}" for _, d in entry.guards))
        cache.add(entry)
        return entry

    def _capture(self, cache, fn, args, kwargs):
        dynamic = self._dynamic_for(cache, fn, args, kwargs)
        try:
            return capture(fn, args, kwargs, runtime=self, allow_breaks=not self.fullgraph,
                           dynamic=dynamic, module_call=cache.module_call)
        except UserError as e:
            if not dynamic:
                raise
            # An operator whose fake kernel cannot take symbolic sizes (nn.Bilinear's
            # aten._trilinear asserts) looks like an error of the user's code. Capture this
            # call with its real sizes; if that fails too, it is the user's error. This function
            # then compiles per shape (it had been silently eager, recapturing on every call).
            captured = capture(fn, args, kwargs, runtime=self, allow_breaks=not self.fullgraph,
                               dynamic=False, module_call=cache.module_call)
            first_line = (str(e.exc).splitlines() or [""])[0][:160]
            cache.static_only = f"symbolic sizes failed ({type(e.exc).__name__}: {first_line})"
            _fallback_log.warning("tempa: %s: %s; compiling it per shape instead", _where(fn),
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
        from .capture.calls import bind_arguments
        try:
            scope = bind_arguments(fn, args, kwargs)
        except Exception:
            return cache.dynamic_inputs or None
        # an input read through an outside object (``___O3.keys``, a cache's tensor) names
        # that object by the last capture's constants
        consts = dict(cache.entries[0].captured.guards.consts) if cache.entries else {}
        for expr, shape in cache.last_shapes.items():
            try:
                value = eval(expr, consts, scope)  # noqa: S307 - expressions tempa generated
            except Exception:
                continue
            if isinstance(value, torch.Tensor) and value.dim() == len(shape) and \
                    tuple(value.shape) != shape:
                changed = {d for d in range(len(shape)) if value.shape[d] != shape[d]}
                known = cache.dynamic_inputs.get(expr, set())
                if not changed <= known and logs.on("recompiles"):
                    logs.get("recompiles").info(
                        "%s: the size of %s changed in dim(s) %s (%s -> %s); the next graph "
                        "takes any size there", _where(fn), expr, sorted(changed), shape,
                        tuple(value.shape))
                cache.dynamic_inputs[expr] = known | changed
        return cache.dynamic_inputs or None

    def _compile_graph(self, captured, fn):
        if captured.empty:
            return captured.gm   # nothing to compute: run as it is, as torch.compile does
        _stats.bump("graphs_compiled")
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
            _stats.bump("eager_fallbacks")
            _fallback_log.warning("tempa: backend %r failed on the graph of %s (%s: %s); running "
                                  "that graph with ATen ops instead", self.backend_name,
                                  _where(fn), type(e).__name__, e)
            return captured.gm
        return compiled

    def clear(self):
        for cache in list(self.caches.values()):
            cache.clear()
        self.caches.clear()
        self.auto_trials.clear()


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


def _where(fn) -> str:
    code = fn.__code__
    return f"{fn.__qualname__} ({code.co_filename}:{code.co_firstlineno})"


class OptimizedModule(torch.nn.Module):
    """What tempa.compile returns for an nn.Module: shares the original's parameters and
    buffers (it is registered as ``_orig_mod``), leaves it untouched, and calls the compiled
    code of its forward."""

    def __init__(self, mod: torch.nn.Module, context: CompileContext):
        super().__init__()
        self.__dict__["_tempa_mod"] = mod
        self._orig_mod = mod
        self.__dict__["_tempa_context"] = context
        # state_dict() keys are the module's own (no "_orig_mod." prefix): a checkpoint moves
        # freely between the eager and the compiled model
        self._register_state_dict_hook(_drop_orig_mod_prefix)
        self.register_load_state_dict_pre_hook(_add_orig_mod_prefix)
        forward = mod.__dict__.get("forward")
        call_override = type(mod).__call__
        if forward is None and call_override is not torch.nn.Module.__call__ and \
                isinstance(call_override, types.FunctionType):
            # a class that overrides __call__: calling the module runs that, so it is what
            # gets compiled (its super().__call__ reaches forward inside the capture)
            fn, eager = call_override, _call_module
        elif forward is None:
            fn = type(mod).forward
            eager = _call_module
        elif isinstance(forward, types.MethodType):
            fn, eager = forward.__func__, _call_module
        else:
            fn = forward
            eager = lambda *a, **k: forward(*a, **k)  # noqa: E731
        self.__dict__["_tempa_ddp"] = distributed.is_ddp(mod)
        # Submodules with hooks (FSDP2's fully_shard puts its collectives there) run their
        # hooks eagerly around a compiled forward; see __call__.
        self.__dict__["_tempa_hooked"] = [m for m in mod.modules()
                                          if m is not mod and distributed.has_module_hooks(m)]
        if self._tempa_ddp:
            # DDP's forward (reducer, hooks, no_sync) runs eagerly around its compiled
            # inner module, whose graphs are split at DDP's bucket boundaries.
            context.backend = distributed.split_backend(context.backend, mod)
            self.__dict__["_tempa_call"] = distributed.ddp_forward_runner(
                mod, context.forward_of(mod.module))
        elif isinstance(forward, types.FunctionType):
            dispatch = context.dispatcher(fn, eager)
            self.__dict__["_tempa_call"] = lambda *a, **k: dispatch(*a, **k)
        else:
            dispatch = context.dispatcher(fn, eager)
            self.__dict__["_tempa_call"] = functools.partial(dispatch, mod)

    def __call__(self, *args, **kwargs):
        # Instance state is read from __dict__: a module's attribute reads go through the
        # __getattr__ hook (not specialised by CPython), ~35 ns each on every call.
        d = self.__dict__
        if d["_forward_hooks"] or d["_forward_pre_hooks"]:
            return super().__call__(*args, **kwargs)
        mod = d["_tempa_mod"]
        m = mod.__dict__
        own_hooks = (m["_forward_hooks"] or m["_forward_pre_hooks"] or m["_backward_hooks"] or
                     m["_backward_pre_hooks"]) and not d["_tempa_ddp"]
        if not own_hooks and not d["_tempa_hooked"]:
            return d["_tempa_call"](*args, **kwargs)
        if isinstance(mod, LazyModuleMixin) and mod.has_uninitialized_params():
            mod._infer_parameters(mod, args, kwargs)   # its first call creates its parameters
            own_hooks = distributed.has_module_hooks(mod) and not d["_tempa_ddp"]
            if not own_hooks and not d["_tempa_hooked"]:
                return d["_tempa_call"](*args, **kwargs)
        # A hooked submodule reached from eagerly run code (the rest of a loop after a graph
        # break) still runs its compiled forward: each is installed for this call.
        context = self._tempa_context
        with distributed.forwards_replaced([(m, context.forward_of(m)) for m in self._tempa_hooked]):
            if own_hooks:
                # The module's own hooks (FSDP2's root unshard, user hooks) run as eager runs
                # them, around its compiled forward.
                return distributed.call_with_compiled_forward(mod, context.forward_of(mod),
                                                              args, kwargs)
            return self._tempa_call(*args, **kwargs)

    def forward(self, *args, **kwargs):
        return self._tempa_call(*args, **kwargs)

    @property
    def training(self):
        return self.__dict__["_tempa_mod"].training

    @training.setter
    def training(self, mode):
        # the wrapper's mode is the module's: tempa.compile(model.eval()).training is False,
        # and model.train() later shows through (Module.__init__'s default is ignored)
        mod = self.__dict__.get("_tempa_mod")
        if mod is not None:
            mod.training = mode

    def __getattr__(self, name):
        if name == "_orig_mod":
            return self._modules["_orig_mod"]
        return getattr(self._modules["_orig_mod"], name)

    def __setattr__(self, name, value):
        # Writes go where reads come from: `fast.flag = x` changes the module (eager code
        # reading model.flag sees it), unless the name is the wrapper's own.
        if self._owns(name):
            super().__setattr__(name, value)
        else:
            setattr(self._orig_mod, name, value)

    def __delattr__(self, name):
        if self._owns(name):
            super().__delattr__(name)
        else:
            delattr(self._orig_mod, name)

    def _owns(self, name) -> bool:
        return name == "_orig_mod" or name in self.__dict__ or hasattr(type(self), name) or \
            "_tempa_mod" not in self.__dict__

    def __dir__(self):
        return sorted(set(super().__dir__()) | set(dir(self._orig_mod)))

    def __bool__(self):
        # the wrapper is truthy like the module it stands for (an empty ModuleList is not)
        return bool(self._orig_mod)

    def __reduce__(self):
        """copy.copy, copy.deepcopy and pickle, as for torch's OptimizedModule: the copy wraps
        a copy of the module (deepcopy: a deep copy) and compiles it afresh under the same
        settings. The compiled entries, guards and kernels stay with the original (they read
        its module). The wrapper's own hooks and attributes travel as the state."""
        state = {k: v for k, v in self.__dict__.items() if not k.startswith("_tempa_")}
        return _rebuild_optimized_module, (self._orig_mod, self._tempa_context.settings), state


def _rebuild_optimized_module(mod, settings):
    return compile(mod, **settings)


_ORIG_MOD = "_orig_mod"


def _drop_orig_mod_prefix(wrapper, state_dict, prefix, local_metadata):
    """state_dict hook: ``prefix + "_orig_mod.fc.weight"`` becomes ``prefix + "fc.weight"``
    (the wrapper has no state of its own, so nothing can collide). torch.compile keeps the
    prefix, which makes its checkpoints fail to load into the eager model."""
    inner = prefix + _ORIG_MOD + "."
    for key in [k for k in state_dict if k.startswith(inner)]:
        state_dict[prefix + key[len(inner):]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:   # per-module versions, keyed by module path without the dot
        for key in [k for k in metadata if k == inner[:-1] or k.startswith(inner)]:
            metadata[(prefix + key[len(inner):]).rstrip(".") if key != inner[:-1]
                     else prefix[:-1]] = metadata.pop(key)


def _add_orig_mod_prefix(wrapper, state_dict, prefix, local_metadata, strict, missing_keys,
                         unexpected_keys, error_msgs):
    """load_state_dict pre-hook: every key under ``prefix`` belongs to the module, so a
    plain (eager) checkpoint gets the ``_orig_mod.`` the module tree needs; one saved from
    torch.compile, which has it already, loads as it is."""
    inner = prefix + _ORIG_MOD + "."
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        state_dict[inner + key[len(prefix):]] = state_dict.pop(key)


def _call_module(mod, *args, **kwargs):
    # The eager path runs the module as the user would: its __call__, hooks, forward.
    return mod(*args, **kwargs)


def compile(model=None, *, fullgraph: bool = False, dynamic: bool | None = None,
            backend="tempa", mode: str | None = None, options: dict | None = None):
    """Compile an nn.Module or a function. Nothing happens until the first call."""
    if model is None:
        return lambda m: compile(m, fullgraph=fullgraph, dynamic=dynamic, backend=backend,
                                 mode=mode, options=options)
    context = CompileContext(fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode,
                             options=options)
    if isinstance(model, torch.nn.Module):
        return OptimizedModule(model, context)
    if isinstance(model, types.MethodType):
        dispatch = context.dispatcher(model.__func__, model.__func__)
        bound = functools.partial(dispatch, model.__self__)
        functools.update_wrapper(bound, model)
        bound.__tempa_context__ = context
        return bound
    if isinstance(model, types.FunctionType):
        dispatch = context.dispatcher(model, model)
        functools.update_wrapper(dispatch, model)
        dispatch.__tempa_context__ = context
        return dispatch
    if callable(model):
        # A builtin, an op overload, a functools.partial, an lru_cache wrapper, an object
        # with __call__: a small Python function that calls it is compiled instead, and
        # capture treats the call as it would inside any compiled code.
        call = _calling(model)
        dispatch = context.dispatcher(call, call)
        functools.update_wrapper(dispatch, model, updated=())
        dispatch.__tempa_context__ = context
        return dispatch
    raise TypeError(f"tempa.compile expects an nn.Module or a function, got {type(model).__name__}")


def _calling(target):
    def call(*args, **kwargs):
        return target(*args, **kwargs)
    call.__qualname__ = call.__name__ = getattr(target, "__name__", type(target).__name__)
    return call


def disable(fn=None, recursive: bool = True):
    """Mark ``fn`` to always run eagerly; inside a compiled function a call to it is a graph
    break with reason "disabled by tempa.disable"."""
    if fn is None:
        return lambda f: disable(f, recursive)
    target = fn.__func__ if isinstance(fn, types.MethodType) else fn
    if isinstance(target, torch.nn.Module):
        target = type(target).forward
    code = getattr(target, "__code__", None)
    if code is not None:
        calls.DISABLED_CODES.add(code)
    return fn


def explain(fn_or_module):
    """``tempa.explain(model)(*args, **kwargs)``: run once, capturing graphs (run through FX,
    no kernels compiled) and report graphs, breaks with their places, ops and guards."""
    if not (isinstance(fn_or_module, (torch.nn.Module, types.FunctionType, types.MethodType))
            or hasattr(fn_or_module, "__tempa_context__")):
        raise TypeError(f"tempa.explain expects an nn.Module or a Python function, got "
                        f"{type(fn_or_module).__name__}: tempa.explain(model)(*inputs)")

    def run(*args, **kwargs):
        context = CompileContext(fullgraph=False, dynamic=None, backend="eager", mode=None,
                                 options=None)
        context.record = True
        target = fn_or_module
        if isinstance(target, OptimizedModule):
            target = target._orig_mod
        if isinstance(target, torch.nn.Module):
            OptimizedModule(target, context)(*args, **kwargs)
        else:
            compile_target = target.__wrapped__ if hasattr(target, "__tempa_context__") else target
            if not hasattr(compile_target, "__code__"):
                compile_target = _calling(compile_target)
            context.dispatcher(compile_target, compile_target)(*args, **kwargs)
        guards = [[d for _, d in e.guards] for c in context.caches.values() for e in c.entries]
        out = ExplainOutput(
            graphs=[gm for _, gm in context.graph_log if has_ops(gm)],
            graph_functions=[f.__qualname__ for f, gm in context.graph_log if has_ops(gm)],
            recompile_reasons=list(context.recompile_log),
            graph_break_count=len(context.break_log),
            break_reasons=[r for _, r in context.break_log],
            guards=guards,
            eager_fallbacks=[f"{_where(f)}: {r}" for f, r in context.fallback_log],
        )
        context.clear()
        return out
    return run


@dataclass
class EntryInfo:
    """One compiled cache entry, for users and tools (`tempa explain`, reports)."""
    function: str
    guards: list[str]
    graph: torch.fx.GraphModule
    graph_code: str
    compiled: object            # the backend's callable (tempa's carries .tempa_info)
    break_reason: object        # BreakReason, or None when the whole function is one graph
    entry_source: str           # the generated guard + runner function

    @property
    def kernels(self):
        return getattr(self.compiled, "tempa_info", None)


def entries(compiled) -> list[EntryInfo]:
    """The cache entries behind a compiled module or function, across every code object
    compiled under it (resume functions and separately compiled callees included)."""
    context = _context_of(compiled)
    out = []
    for cache in context.caches.values():
        for e in cache.entries:
            out.append(EntryInfo(cache.name, [d for _, d in e.guards], e.captured.gm,
                                 e.captured.gm.code, e.compiled, e.captured.break_reason,
                                 e.source))
    return out


def stance_decisions(compiled) -> list[str]:
    """What stance "auto" chose for each code object under ``compiled`` so far, and why."""
    return list(_context_of(compiled).stance_log)


def recompile_reasons(compiled) -> list[tuple[str, str]]:
    """(function, the guard that failed) for every recompile under ``compiled`` so far."""
    return list(_context_of(compiled).recompile_log)


def eager_reasons(compiled) -> list[str]:
    """Why code under ``compiled`` runs eagerly (one line per code object), if it does."""
    context = _context_of(compiled)
    return [f"{c.name}: {c.eager_reason}" for c in context.caches.values() if c.eager_reason]


def _context_of(compiled) -> "CompileContext":
    if isinstance(compiled, OptimizedModule):
        return compiled.__dict__["_tempa_context"]
    context = getattr(compiled, "__tempa_context__", None)
    if context is None:
        raise TypeError("tempa.entries: pass what tempa.compile returned")
    return context


def mark_dynamic(tensor: torch.Tensor, dim) -> None:
    """Capture ``dim`` (an int or a list of them) of this tensor as a symbolic size."""
    dims = {dim} if isinstance(dim, int) else set(dim)
    tensor._tempa_dynamic_dims = set(getattr(tensor, "_tempa_dynamic_dims", ())) | dims


def mark_static(tensor: torch.Tensor, dim=None) -> None:
    """Never make ``dim`` (default: every dim) of this tensor symbolic."""
    dims = set(range(tensor.dim())) if dim is None else ({dim} if isinstance(dim, int) else set(dim))
    tensor._tempa_static_dims = set(getattr(tensor, "_tempa_static_dims", ())) | dims


def reset() -> None:
    """Forget every compiled entry and counter (the disk cache stays: see `tempa cache`)."""
    for ctx in list(_contexts):
        ctx.clear()
    clear_watchers()
    _stats.clear()


def stats() -> _stats.Stats:
    return _stats.snapshot()
