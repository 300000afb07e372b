"""What tempa made of a model: graphs, breaks (with the user's source line), guards per
entry, recompile reasons, eager fallbacks, and what the backend generated for each graph.

Sources: ``tempa.explain`` (capture's own report of one call) and ``tempa.entries`` (the
compiled entries of a compiled model).
"""
from __future__ import annotations

import linecache
import re
from dataclasses import dataclass, field

from .bench import collect_logs
from .load import Target


@dataclass
class BreakInfo:
    type: str
    reason: str
    filename: str | None = None
    lineno: int | None = None
    function: str | None = None
    hint: str = ""

    @property
    def where(self) -> str:
        if not self.filename:
            return "?"
        return f"{self.filename}:{self.lineno}" + (f" in {self.function}" if self.function else "")

    def source(self, context: int = 2) -> list[tuple[int, str, bool]]:
        """(line number, text, is the break's line) around the break, from the user's file."""
        if not self.filename or not self.lineno:
            return []
        lines = linecache.getlines(self.filename)
        if not lines:
            return []
        lo, hi = max(1, self.lineno - context), min(len(lines), self.lineno + context)
        return [(i, lines[i - 1].rstrip("\n"), i == self.lineno) for i in range(lo, hi + 1)]


@dataclass
class GraphInfo:
    function: str
    code: str
    op_count: int
    guards: list[str] = field(default_factory=list)
    backend: str = ""            # what ran the graph: generated kernels, the FX graph, ...
    kernel_count: int | None = None
    cpp_source: str | None = None
    triton_source: str | None = None
    wrapper_source: str | None = None
    fusion_report: str | None = None
    aten_fallbacks: list[str] = field(default_factory=list)
    extern_calls: list[str] = field(default_factory=list)
    used_gcc: bool | None = None
    from_disk_cache: bool | None = None
    fallback_reason: str | None = None   # the backend ran this graph eagerly, and why
    compile_seconds: float | None = None
    variants: dict = field(default_factory=dict)   # "forward"/"backward"/... -> cpp source
    notes: list[str] = field(default_factory=list)


@dataclass
class Explanation:
    name: str
    inputs: str
    graph_count: int = 0
    break_count: int = 0
    op_count: int = 0
    graphs: list[GraphInfo] = field(default_factory=list)
    breaks: list[BreakInfo] = field(default_factory=list)
    recompiles: list[str] = field(default_factory=list)
    eager_fallbacks: list[str] = field(default_factory=list)
    stance: list[str] = field(default_factory=list)    # what stance "auto" chose, and why
    notes: list[str] = field(default_factory=list)
    error: str | None = None


_WHERE = re.compile(r"^(?P<type>[^:]+): (?P<reason>.*) \((?P<file>.+?):(?P<line>\d+|None) in "
                    r"(?P<func>[^)]+)\)(?:\. Hint: (?P<hint>.*))?$", re.S)


def parse_break(text: str) -> BreakInfo:
    """A break from its text form 'type: reason (file:line in function). Hint: hint'."""
    m = _WHERE.match(text.strip())
    if not m:
        return BreakInfo("unknown", text.strip())
    line = m["line"]
    return BreakInfo(m["type"], m["reason"], m["file"], int(line) if line.isdigit() else None,
                     m["func"], m["hint"] or "")


def _break_from(obj) -> BreakInfo:
    if isinstance(obj, str):
        return parse_break(obj)
    g = lambda n, d=None: getattr(obj, n, d)  # noqa: E731
    return BreakInfo(str(g("type", "?")), str(g("reason", obj)), g("filename"), g("lineno"),
                     g("function"), str(g("hint", "") or ""))


def _op_count(gm) -> int:
    return sum(1 for n in gm.graph.nodes
               if n.op in ("call_function", "call_method", "call_module"))


def entries(compiled) -> list[GraphInfo]:
    """One GraphInfo per compiled entry of ``compiled`` (a tempa.compile result)."""
    import tempa
    return [_graph_info(e.function, e.graph, e.graph_code, list(e.guards), e.compiled)
            for e in tempa.entries(compiled)]


def _graph_info(function, gm, code, guards, compiled) -> GraphInfo:
    import torch.fx as fx
    gi = GraphInfo(function=function, code=code or (gm.code.strip() if gm is not None else ""),
                   op_count=_op_count(gm) if gm is not None else 0, guards=guards)
    info = getattr(compiled, "tempa_info", None)
    if info is not None:
        g = lambda n: getattr(info, n, None)  # noqa: E731 - BackendInfo fields, some unset
        gi.backend = "tempa: generated kernels"
        gi.kernel_count = g("kernel_count")
        gi.cpp_source = g("cpp_source")
        gi.triton_source = g("triton_source")
        gi.wrapper_source = g("wrapper_source")
        fr = g("fusion_report")
        gi.fusion_report = fr if isinstance(fr, str) or fr is None else "\n".join(map(str, fr))
        af = g("aten_fallbacks") or []
        gi.aten_fallbacks = [str(a) for a in af] if not isinstance(af, int) else [f"{af} ops"]
        gi.used_gcc = g("used_gcc")
        gi.from_disk_cache = g("from_disk_cache")
        gi.extern_calls = [str(x) for x in (g("extern_calls") or [])]
        gi.fallback_reason = g("fallback_reason")
        gi.compile_seconds = g("compile_seconds")
        gi.notes = [str(x) for x in (g("notes") or [])]
        for v in ("inference", "forward", "backward"):
            var = g(v)
            src = getattr(var, "cpp_source", None) if var is not None else None
            if src and src != gi.cpp_source:
                gi.variants[v] = src
        if gi.fallback_reason:
            gi.backend = "tempa: ran eagerly (" + str(gi.fallback_reason) + ")"
    elif isinstance(compiled, fx.GraphModule):
        gi.backend = "the captured FX graph, op by op (no generated kernels)"
    elif compiled is not None:
        gi.backend = f"{type(compiled).__name__} (a custom backend's callable)"
    return gi


def explain(target: Target, *, backend="eager") -> Explanation:
    """Capture ``target`` and say what happened; then call it with each of its
    ``extra_inputs`` to show recompiles."""
    import tempa
    ex = Explanation(target.name, target.describe_inputs())
    args, kwargs = target.args, target.kwargs
    tempa.reset()
    with collect_logs("fallbacks", "recompiles", "breaks") as logs_:
        try:
            _from_public_explain(ex, tempa.explain(target.model)(*args, **kwargs))
        except Exception as e:
            ex.error = f"tempa.explain raised {type(e).__name__}: {e}"
        # A compile of our own: for recompiles (extra_inputs) and fallbacks.
        tempa.reset()
        try:
            compiled = tempa.compile(target.model, backend=backend)
            compiled(*args, **kwargs)
            for a, k in target.extra_inputs:
                compiled(*a, **k)
            if tempa.stance.state.name == "auto" or tempa.config.measure_against_eager:
                # enough calls for the trials against eager to decide: a resume function
                # after a break runs only on the calls its caller's trial ran compiled
                for _ in range(3 * (tempa.stance.WARMUP + 2 * tempa.stance.ROUNDS)):
                    compiled(*args, **kwargs)
            ex.stance = tempa.stance_decisions(compiled)
        except Exception as e:
            ex.error = ex.error or f"compiling raised {type(e).__name__}: {e}"
    # one line per recompile (as many as tempa.stats().recompiles); the lines saying which
    # sizes became dynamic are notes
    ex.recompiles = [m for m in logs_["recompiles"].messages if m.startswith("recompiling ")]
    dynamic_notes = [m for m in logs_["recompiles"].messages if m not in ex.recompiles]
    s = tempa.stats()
    if s.recompiles and not ex.recompiles:
        ex.recompiles = [f"{s.recompiles} recompiles (switch on TEMPA_LOGS=recompiles for "
                         "the reasons)"]
    # the trials' verdicts against eager are in ex.stance (a slower one came on fallbacks too)
    said = [m for m in logs_["fallbacks"].messages if m.removeprefix("tempa: ") not in ex.stance]
    for msg in said:
        if msg not in ex.eager_fallbacks and "eagerly" in msg:
            ex.eager_fallbacks.append(msg)
    ex.notes = dynamic_notes + [m for m in said if m not in ex.eager_fallbacks]
    tempa.reset()
    return ex


def _from_public_explain(ex: Explanation, rep):
    ex.graph_count = rep.graph_count
    ex.break_count = rep.graph_break_count
    ex.op_count = rep.op_count
    for i, (gm, ops) in enumerate(zip(rep.graphs, rep.ops_per_graph)):
        function = rep.graph_functions[i] if i < len(rep.graph_functions) else f"graph {i + 1}"
        guards = rep.guards[i] if i < len(rep.guards) else []
        gi = _graph_info(function, gm, None, [str(g) for g in guards], None)
        gi.op_count = len(ops)
        ex.graphs.append(gi)
    ex.breaks = [_break_from(b) for b in rep.break_reasons]
    ex.eager_fallbacks = [str(f) for f in rep.eager_fallbacks]


# -- text ---------------------------------------------------------------------------------
def render_text(ex: Explanation, *, show_code: bool = True) -> str:
    out = [f"tempa explain: {ex.name}({ex.inputs})", "",
           f"Graphs: {ex.graph_count}    Graph breaks: {ex.break_count}    "
           f"Ops in graphs: {ex.op_count}"]
    if ex.error:
        out += ["", f"error: {ex.error}"]
    for i, g in enumerate(ex.graphs, 1):
        out += ["", f"Graph {i} of {len(ex.graphs)}: {g.function}, {g.op_count} ops"
                + (f"  [{g.backend}]" if g.backend else "")]
        if show_code and g.code:
            out += ["    " + line for line in g.code.splitlines() if line.strip()]
        if g.guards:
            out.append(f"  guards ({len(g.guards)}):")
            out += [f"    - {d}" for d in g.guards]
    for i, b in enumerate(ex.breaks, 1):
        out += ["", f"Break {i}: {b.type} at {b.where}", f"  reason: {b.reason}"]
        for n, text, mark in b.source():
            out.append(f"  {'>' if mark else ' '} {n:4d} | {text}")
        if b.hint:
            out.append(f"  hint: {b.hint}")
    out += ["", "Recompiles:" + ("" if ex.recompiles else
                                 " none (add `extra_inputs` to the file to try other shapes)")]
    out += [f"  - {r}" for r in ex.recompiles]
    out += ["", "Eager fallbacks:" + ("" if ex.eager_fallbacks else " none")]
    out += [f"  - {f}" for f in ex.eager_fallbacks]
    if ex.stance:
        out += ["", "Stance:"] + [f"  - {d}" for d in ex.stance]
    if ex.notes:
        out += ["", "Notes:"] + [f"  - {n}" for n in ex.notes]
    return "\n".join(out)
