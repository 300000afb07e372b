"""Capture one call of a Python function: bytecode -> FX graph + guards + output plan."""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field

import torch
import torch.fx as fx

from .breaks import Unsupported, UserError
from .graph import GraphBuilder
from .guards import GuardSet
from .interpreter import Frame, _PyException
from .output import OutputPlan
from .tracer import Tracer
from .calls import bind_arguments


@dataclass
class Captured:
    gm: fx.GraphModule
    guards: GuardSet
    user_input_exprs: list[str]
    example_inputs: list[torch.Tensor]   # the real tensors of this call, in placeholder order
    attr_tensors: list[torch.Tensor]     # parameters/buffers passed after the user inputs
    output_expr: str
    replay: list[str]                    # statements run after the graph: outside writes
    modules: list[torch.nn.Module]
    instructions: int = 0
    op_count: int = 0
    notes: list[str] = field(default_factory=list)


def capture(fn, args: tuple, kwargs: dict, *, root_name: str | None = None) -> Captured:
    """Interpret ``fn(*args, **kwargs)`` symbolically. Raises Unsupported or UserError."""
    builder = GraphBuilder()
    tracer = Tracer(builder)
    guards = builder.guards
    arguments = bind_arguments(fn, args, kwargs)
    varkw = fn.__code__.co_varnames[fn.__code__.co_argcount + fn.__code__.co_kwonlyargcount +
                                     bool(fn.__code__.co_flags & 0x04)] \
        if fn.__code__.co_flags & 0x08 else None
    bound = {}
    for name, value in arguments.items():
        if isinstance(value, torch.nn.Module):
            tracer.paths[id(value)] = name
        bound[name] = tracer.external(value, name, user=True)
        if name == varkw:
            # **kwargs is a new dict on every call: the code may change it freely.
            tracer.external_copies.pop(id(bound[name]), None)

    # Global state every graph depends on.
    grad = torch.is_grad_enabled()
    guards.add("global", f"{guards.const(torch.is_grad_enabled, 'F')}() is {grad}",
               f"grad mode is {'enabled' if grad else 'disabled'}")
    autocast = torch._C._is_any_autocast_enabled()
    guards.add("global", f"{guards.const(torch._C._is_any_autocast_enabled, 'F')}() is {autocast}",
               f"autocast is {'on' if autocast else 'off'}")
    if autocast:
        raise Unsupported("unsupported construct", "calling a compiled function inside an "
                          "outer autocast region")
    dtype = torch.get_default_dtype()
    guards.add("global", f"{guards.const(torch.get_default_dtype, 'F')}() is {guards.const(dtype, 'D')}",
               f"default dtype is {dtype}")

    tracer.active_contexts = []
    try:
        frame = Frame(tracer, fn.__code__, fn.__globals__, bound, fn.__closure__,
                      name=fn.__qualname__)
        try:
            result = frame.run()
        except _PyException as e:
            raise UserError(e.exc) from None
        plan = OutputPlan(guards, tracer.is_internal)
        output_expr = plan.expr(result)
        replay = [f"___setattr({guards.const(obj)}, {name!r}, {plan.expr(value)})"
                  for obj, name, value in tracer.attr_writes.values()]
    finally:
        for ctx in reversed(tracer.active_contexts):
            ctx.autocast.__exit__(None, None, None)
        torch._C._set_grad_enabled(grad)

    gm = builder.finish(plan.outputs)
    op_count = sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method",
                                                           "call_module"))
    return Captured(
        gm=gm, guards=guards,
        user_input_exprs=[expr for _, expr, _ in builder.user_inputs],
        example_inputs=[t for _, _, t in builder.user_inputs] + [t for _, t in builder.attr_inputs],
        attr_tensors=[t for _, t in builder.attr_inputs],
        output_expr=output_expr,
        replay=replay,
        modules=list(builder.modules.values()),
        instructions=tracer.instructions_run,
        op_count=op_count,
    )
