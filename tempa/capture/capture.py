"""Capture one call of a Python function: bytecode -> FX graph + guards + output plan."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch
import torch.fx as fx
from torch.amp import autocast_mode

from .breaks import Unsupported, UserError
from .graph import GraphBuilder, _is_impure
from .guards import GuardSet, storage_groups
from .frame_exits import _PyException
from .interpreter import Frame
from .output import OutputPlan, input_exprs
from .tracer import Tracer
from .values import TensorVar
from .breakplan import plan_break
from . import module_guards
from .calls_inline import bind_arguments


@dataclass
class Captured:
    gm: fx.GraphModule
    guards: GuardSet
    user_input_exprs: list[str]
    example_inputs: list[torch.Tensor]   # the real tensors of this call, in placeholder order
    attr_tensors: list[torch.Tensor]     # parameters/buffers passed after the user inputs
    body: list[str]                      # statements after the graph call, ending in return
    modules: list[torch.nn.Module]
    break_reason: object = None          # BreakReason when the frame broke
    input_shapes: dict = field(default_factory=dict)   # expression -> shape at capture
    input_ints: dict = field(default_factory=dict)     # expression -> a Python int read there
    int_locals: list = field(default_factory=list)     # (local, expression) of int inputs
    dynamic: bool = False                # the graph has symbolic sizes
    break_mode: str | None = None
    instructions: int = 0
    op_count: int = 0
    empty: bool = False                  # no operation recorded, no output: nothing to compile
    notes: list[str] = field(default_factory=list)
    # (id(module), name) of the outside modules' buffers the replayed writes assign anew,
    # and of those the graph reads by source (a new tensor there is no reason to drop it)
    replaced_buffers: set = field(default_factory=set)
    buffers_by_source: set = field(default_factory=set)


def capture(fn, args: tuple, kwargs: dict, *, runtime=None, allow_breaks: bool = False,
            dynamic=None, symbolic_ints=frozenset(), module_call: bool = False,
            replaced_buffers=frozenset(), _stop: Unsupported | None = None) -> Captured:
    """Interpret ``fn(*args, **kwargs)`` symbolically. Raises Unsupported or UserError.

    With ``allow_breaks``, an unsupported instruction of ``fn`` itself (or a call whose
    callee is unsupported) becomes a graph break: capture runs again, stops right before
    that instruction, and the entry continues in Python from there (``breakplan.py``).
    ``runtime`` supplies ``dispatcher(fn, eager)`` and ``call(fn, *a, **k)`` for that.
    ``module_call``: ``fn`` is ``type(args[0]).forward`` called as the module is called
    (hooks, an overridden ``forward`` or ``__call__`` then make capture give up).
    ``symbolic_ints``: the expressions whose Python ints become symbols (automatic dynamic),
    or True: every int read from the arguments (``dynamic=True``).
    ``replaced_buffers``: (id(module), name) of buffers an earlier capture (or pass) assigned
    anew: read by source (``Tracer.module_attr``)."""
    if dynamic is False:
        symbolic_ints = frozenset()
    symbolic = dynamic is True or bool(dynamic) or bool(symbolic_ints) or \
        _any_marked_dynamic(args, kwargs)
    builder = GraphBuilder(symbolic=symbolic and dynamic is not False)
    tracer = Tracer(builder, fullgraph=not allow_breaks, dynamic=dynamic,
                    symbolic_ints=symbolic_ints, replaced_buffers=replaced_buffers)
    guards = builder.guards
    arguments = bind_arguments(fn, args, kwargs)
    for name, value in arguments.items():
        if isinstance(value, torch.nn.Module):
            tracer.paths[id(value)] = name
    _name_stack_arguments(guards, fn, arguments)
    module_guards.guard_function(guards, fn, defaults=True)
    if module_call:
        module_guards.guard_root_module_call(tracer, args[0], fn)
    varkw = fn.__code__.co_varnames[fn.__code__.co_argcount + fn.__code__.co_kwonlyargcount +
                                     bool(fn.__code__.co_flags & 0x04)] \
        if fn.__code__.co_flags & 0x08 else None
    bound = {}
    for name, value in arguments.items():
        bound[name] = tracer.external(value, name, user=True)
        if name == varkw:
            # **kwargs is a new dict on every call: the code may change it freely.
            tracer.external_copies.pop(id(bound[name]), None)

    # Global state every graph depends on.
    grad = torch.is_grad_enabled()
    guards.add("mode", f"{guards.const(torch.is_grad_enabled, 'F')}() is {grad}",
               f"grad mode is {'enabled' if grad else 'disabled'}")
    autocast = torch._C._is_any_autocast_enabled()
    guards.add("mode", f"{guards.const(torch._C._is_any_autocast_enabled, 'F')}() is {autocast}",
               f"autocast is {'on' if autocast else 'off'}")
    outer_autocast = _outer_autocast(guards) if autocast else []
    dtype = torch.get_default_dtype()
    guards.add("mode", f"{guards.const(torch.get_default_dtype, 'F')}() is {guards.const(dtype, 'D')}",
               f"default dtype is {dtype}")

    tracer.active_contexts = []
    # Called inside `with torch.autocast(...)`: the graph enters the same autocast state
    # first and leaves it last, so a backend sees where autocast applies.
    entered = [builder.graph.call_function(autocast_mode._enter_autocast, args)
               for args in outer_autocast]
    try:
        frame = Frame(tracer, fn.__code__, fn.__globals__, bound, fn.__closure__,
                      name=fn.__qualname__,
                      stop_before=_stop.root_count if _stop is not None else None)
        try:
            result = frame.run()
        except _PyException as e:
            raise UserError(e.exc) from None
        except Unsupported as u:
            if allow_breaks and _stop is None and u.root_count is not None:
                retry, first_break = True, u
            else:
                raise
        else:
            retry = False
        if retry:
            pass  # leave the finally below first: it restores grad mode and autocast
        else:
            # the caller's objects guarded by type are handed on as read at their source,
            # its containers read as themselves (a registry, the dicts in it) as themselves
            handed_on = {**tracer.sourced, **tracer.outside_containers, **tracer.external_copies}
            plan = OutputPlan(guards, tracer.is_internal, handed_on, builder.size_nodes,
                              inputs=input_exprs(builder), recipes=tracer.recipes)
            body = tracer.side_effects.replay_lines(plan)
            break_plan = None
            if frame.stopped_at is not None:
                if frame.stopped_at.offset != _stop.root_offset:
                    raise _stop  # the second pass took another path: give up on this frame
                break_grad = torch.is_grad_enabled()
                _leave_contexts(tracer, grad)
                break_plan = plan_break(fn, frame, plan, runtime, data_dependent=_stop.break_type
                                        in ("data-dependent value", "data-dependent branch"))
                if break_grad != grad:
                    # A plain torch.set_grad_enabled(m) before the break (no `with` object
                    # whose re-entry sets it, e.g. the optimizers' _use_grad_for_differentiable):
                    # the graph ended in the entry's mode; the rest runs in m, as in eager.
                    body.append(f"{guards.const(torch._C._set_grad_enabled, 'F')}({break_grad})")
                body += break_plan.lines
            else:
                body.append(f"return {plan.expr(result)}")
            unsound = tracer.selections.first_unsound(builder, plan.outputs)
            if unsound is not None:   # max()/min() whose chosen object the code can see
                if not (allow_breaks and _stop is None):
                    raise unsound
                retry, first_break = True, unsound
    finally:
        for ctx in reversed(tracer.active_contexts):
            ctx.autocast.__exit__(None, None, None)
        torch._C._set_grad_enabled(grad)

    if retry:
        return capture(fn, args, kwargs, runtime=runtime, allow_breaks=True, dynamic=dynamic,
                       symbolic_ints=symbolic_ints, module_call=module_call,
                       replaced_buffers=replaced_buffers, _stop=first_break)
    replaced = tracer.side_effects.replaced_buffers()
    if not replaced <= replaced_buffers:
        # The code assigns buffers anew (`self.ema = ...`) that this pass read by identity:
        # the next call finds new tensors there, so capture once more reading them by source
        return capture(fn, args, kwargs, runtime=runtime, allow_breaks=allow_breaks,
                       dynamic=dynamic, symbolic_ints=symbolic_ints, module_call=module_call,
                       replaced_buffers=frozenset(replaced_buffers | replaced), _stop=_stop)
    _guard_input_aliasing(builder, guards)
    tracer.guard_distinct_objects()
    for node in reversed(entered):
        builder.graph.call_function(autocast_mode._exit_autocast, (node,))
    if builder.sizes is not None:
        for expr, desc in builder.sizes.guard_expressions():
            guards.add("shape", expr, desc)
    # Nothing recorded and nothing to hand back: no graph for a backend (torch.compile
    # does not call its backend either), counted before dead code goes. Under fullgraph a
    # function that returns one tensor and writes nothing outside is a graph even when that
    # tensor is an input (`return x`): torch.compile hands its backend that graph too.
    returns_tensor = not allow_breaks and frame.stopped_at is None and \
        isinstance(result, TensorVar) and not tracer.side_effects
    empty = not plan.outputs and not returns_tensor and \
        not any(n.op.startswith("call") for n in builder.graph.nodes)
    input_shapes = {expr: tuple(t.shape) for _, expr, t in builder.user_inputs}
    ints = builder.int_inputs
    gm = builder.finish(plan.outputs)
    op_count = sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method",
                                                           "call_module"))
    return Captured(
        gm=gm, guards=guards,
        user_input_exprs=[expr for _, expr, _ in builder.user_inputs] +
        [local for _, local, *_ in ints.values()],
        example_inputs=[t for _, _, t in builder.user_inputs] +
        [value for *_, value in ints.values()] + [t for _, t in builder.attr_inputs],
        attr_tensors=[t for _, t in builder.attr_inputs],
        body=body,
        break_reason=_stop.location if _stop is not None else None,
        input_shapes=input_shapes,
        input_ints=tracer.input_ints,
        int_locals=[(local, expr) for expr, (_, local, *_) in ints.items()],
        dynamic=builder.sizes is not None and builder.sizes.active,
        break_mode=break_plan.mode if break_plan is not None else None,
        modules=list(builder.modules.values()),
        instructions=tracer.instructions_run,
        op_count=op_count,
        empty=empty,
        replaced_buffers=tracer.side_effects.replaced_buffers(),
        buffers_by_source=tracer.buffers_by_source,
    )


def _guard_input_aliasing(builder, guards) -> None:
    """Which tensor arguments share storage is part of what the graph assumed: traced as
    distinct, ``a.add_(1); return b * 2`` must not run on ``f(z, z[:])``. Capture traces
    aliased arguments as independent tensors, which is right only if nothing writes them."""
    tensors = [t for _, _, t in builder.user_inputs]
    if len(tensors) < 2:
        return
    groups = storage_groups(*tensors)
    if groups != tuple(range(len(tensors))) and any(
            _is_impure(n) and n.op not in ("placeholder", "output") for n in builder.graph.nodes):
        raise Unsupported("aliased inputs written in place", "tensor arguments that share storage, "
                                                             "written in place")
    exprs = [expr for _, expr, _ in builder.user_inputs]
    shared = [f"{exprs[i]} shares storage with {exprs[g]}" for i, g in enumerate(groups) if g != i]
    guards.shared_storage(exprs, groups, "; ".join(shared) if shared else
                          f"{', '.join(exprs)} do not share storage")


def _name_stack_arguments(guards, fn, arguments: dict) -> None:
    """A resume function's stack arguments (``___stack2``) are values the interrupted code
    had computed but not yet stored; guards name them by type and line, as the user can
    find them: ``ndarray on the stack at line 22``."""
    line = re.search(r"<resume at line (\d+)>$", fn.__qualname__)
    for name, value in arguments.items():
        if name.startswith("___stack") and line is not None:
            what = getattr(value, "__qualname__", None) if callable(value) else \
                "the value" if value is None else None
            guards.name(name, f"{what or type(value).__name__} on the stack at line {line.group(1)}")


def _leave_contexts(tracer, entry_grad: bool) -> None:
    """The graph before a break ends with global state as it found it; the entry re-enters
    the contexts that were active at the break (``runtime.enter_grad``/``enter_autocast``)."""
    graph = tracer.builder.graph
    from torch.amp import autocast_mode
    for ctx in reversed(tracer.active_contexts):
        graph.call_function(autocast_mode._exit_autocast, (ctx.node,))
    if torch.is_grad_enabled() != entry_grad:
        graph.call_function(torch._C._set_grad_enabled, (entry_grad,))


def _any_marked_dynamic(args, kwargs) -> bool:
    values = list(args) + list(kwargs.values())
    for v in values:
        items = v if isinstance(v, (list, tuple)) else v.values() if isinstance(v, dict) else (v,)
        for item in items:
            if isinstance(item, torch.Tensor) and getattr(item, "_tempa_dynamic_dims", None):
                return True
    return False


def _outer_autocast(guards) -> list[tuple]:
    """The autocast regions active around the call, guarded by device and dtype."""
    regions = []
    for device in ("cpu", "cuda"):
        if device == "cuda" and not torch.cuda.is_available():
            continue
        enabled = torch.is_autocast_enabled(device)
        fn = guards.const(torch.is_autocast_enabled, "F")
        guards.add("global", f"{fn}({device!r}) is {enabled}",
                   f"autocast on {device} is {'on' if enabled else 'off'}")
        if enabled:
            dtype = torch.get_autocast_dtype(device)
            guards.add("global", f"{guards.const(torch.get_autocast_dtype, 'F')}({device!r}) is "
                       f"{guards.const(dtype, 'D')}", f"autocast dtype on {device} is {dtype}")
            regions.append((device, dtype, True, torch.is_autocast_cache_enabled()))
    return regions
