"""explain(): what capture made of a function, without compiling kernels.

Counts follow the convention of PyTorch's own explain() output, which the seed
shows: ``op_count`` is the number of ``call_function`` nodes over all graphs (tensor
methods such as ``y.sum()`` are ``call_method`` nodes and are not counted).
"""
from __future__ import annotations

import linecache
from dataclasses import dataclass, field

import torch.fx as fx


def ops_of(gm: fx.GraphModule) -> list:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def has_ops(gm: fx.GraphModule) -> bool:
    return any(n.op in ("call_function", "call_method", "call_module") for n in gm.graph.nodes)


@dataclass
class ExplainOutput:
    graphs: list[fx.GraphModule]
    graph_break_count: int
    break_reasons: list                     # BreakReason: type, reason, filename, lineno, hint
    guards: list[list[str]] = field(default_factory=list)   # per entry
    eager_fallbacks: list[str] = field(default_factory=list)
    compile_times: list[float] = field(default_factory=list)
    graph_functions: list[str] = field(default_factory=list)   # the function of each graph
    recompile_reasons: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)   # what the compiled object's options imply

    @property
    def graph_count(self) -> int:
        return len(self.graphs)

    @property
    def ops_per_graph(self) -> list[list]:
        return [ops_of(gm) for gm in self.graphs]

    @property
    def op_count(self) -> int:
        return sum(len(ops) for ops in self.ops_per_graph)

    def __str__(self) -> str:
        lines = [f"Graph count: {self.graph_count}",
                 f"Graph break count: {self.graph_break_count}",
                 f"Op count: {self.op_count}"]
        if self.break_reasons:
            lines.append("Break reasons:")
            for i, r in enumerate(self.break_reasons, 1):
                lines.append(f"  {i}. {r.type}: {r.reason}")
                lines.append(f"     at {r.filename}:{r.lineno} in {r.function}")
                src = linecache.getline(r.filename, r.lineno or 0).strip()
                if src:
                    lines.append(f"        {src}")
                if r.hint:
                    lines.append(f"     hint: {r.hint}")
        for i, ops in enumerate(self.ops_per_graph, 1):
            names = [getattr(o, "__name__", str(o)) for o in ops]
            where = f" ({self.graph_functions[i - 1]})" if i <= len(self.graph_functions) else ""
            lines.append(f"Graph {i}{where}: {len(ops)} ops: {', '.join(names)}")
        if self.eager_fallbacks:
            lines.append("Eager fallbacks:")
            lines.extend(f"  {r}" for r in self.eager_fallbacks)
        if self.guards:
            lines.append("Guards:")
            for i, gs in enumerate(self.guards, 1):
                lines.append(f"  entry {i}:")
                lines.extend(f"    - {g}" for g in gs)
        if self.notes:
            lines.append("Notes:")
            lines.extend(f"  {n}" for n in self.notes)
        return "\n".join(lines)
