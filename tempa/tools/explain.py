"""What tempa made of a model: graphs, breaks (with the user's source line), guards per
entry, recompile reasons, eager fallbacks, and what the backend generated for each graph.

Sources, most public first: ``tempa.explain`` (capture's own report), ``tempa.entries``
(the compiled entries of a compiled model). Where one of them is missing in this version of
tempa, the same facts are read from the compile context the api hangs on the compiled object
(``_tempa_context`` / ``__tempa_context__``) so the tools keep working; see FALLBACK_NOTES.
"""
from __future__ import annotations

import linecache
import re
from dataclasses import dataclass, field

from .bench import collect_logs
from .load import Target

FALLBACK_NOTES: list[str] = []   # which public accessors were missing (shown by --debug)


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


def _context_of(compiled):
    return (getattr(compiled, "__dict__", {}).get("_tempa_context")
            or getattr(compiled, "__tempa_context__", None))


def entries(compiled) -> list[GraphInfo]:
    """One GraphInfo per compiled entry of ``compiled`` (a tempa.compile result)."""
    import tempa
    out = []
    if hasattr(tempa, "entries"):
        try:
            for e in tempa.entries(compiled):
                gm = getattr(e, "graph", None)
                out.append(_graph_info(getattr(e, "function", "?"), gm,
                                       getattr(e, "graph_code", None),
                                       list(getattr(e, "guards", []) or []),
                                       getattr(e, "compiled", None)))
            return out
        except Exception as err:  # an API in flux must not take the tools down
            FALLBACK_NOTES.append(f"tempa.entries failed ({type(err).__name__}: {err})")
    else:
        _note("tempa.entries(compiled) is missing; reading the compile context")
    ctx = _context_of(compiled)
    if ctx is None:
        return out
    for cache in list(getattr(ctx, "caches", {}).values()):
        for e in reversed(list(getattr(cache, "entries", []))):   # oldest first
            captured = getattr(e, "captured", None)
            gm = getattr(captured, "gm", None)
            guards = [g[1] if isinstance(g, tuple) else str(g) for g in getattr(e, "guards", [])]
            out.append(_graph_info(getattr(cache, "name", "?"), gm, None, guards,
                                   getattr(e, "compiled", None)))
    return out


def eager_reasons(compiled) -> list[str]:
    """Why code objects of ``compiled`` run eagerly for good (from the compile context)."""
    ctx = _context_of(compiled)
    if ctx is None:
        return []
    return [f"{getattr(c, 'name', '?')}: {c.eager_reason}"
            for c in list(getattr(ctx, "caches", {}).values())
            if getattr(c, "eager_reason", None)]


def _note(msg: str):
    if msg not in FALLBACK_NOTES:
        FALLBACK_NOTES.append(msg)


def _graph_info(function, gm, code, guards, compiled) -> GraphInfo:
    import torch.fx as fx
    gi = GraphInfo(function=function, code=code or (gm.code.strip() if gm is not None else ""),
                   op_count=_op_count(gm) if gm is not None else 0, guards=guards)
    info = getattr(compiled, "tempa_info", None)
    if info is not None:
        g = lambda n: getattr(info, n, None) if not isinstance(info, dict) else info.get(n)  # noqa: E731
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
        if hasattr(tempa, "explain"):
            try:
                _from_public_explain(ex, tempa.explain(target.model)(*args, **kwargs))
            except Exception as e:
                ex.error = f"tempa.explain raised {type(e).__name__}: {e}"
        else:
            _note("tempa.explain is missing; capturing with backend='eager' and reading the "
                  "compile context")
        # A compile of our own: for the fallback above and for recompiles (extra_inputs).
        tempa.reset()
        try:
            compiled = tempa.compile(target.model, backend=backend)
            compiled(*args, **kwargs)
            if not hasattr(tempa, "explain"):
                _from_entries(ex, compiled)
            for a, k in target.extra_inputs:
                compiled(*a, **k)
        except Exception as e:
            ex.error = ex.error or f"compiling raised {type(e).__name__}: {e}"
    ex.recompiles = list(logs_["recompiles"].messages)
    s = tempa.stats()
    if s.recompiles and not ex.recompiles:
        ex.recompiles = [f"{s.recompiles} recompiles (switch on TEMPA_LOGS=recompiles for "
                         "the reasons)"]
    for msg in logs_["fallbacks"].messages:
        if msg not in ex.eager_fallbacks and "eagerly" in msg:
            ex.eager_fallbacks.append(msg)
    ex.notes = [m for m in logs_["fallbacks"].messages if m not in ex.eager_fallbacks]
    tempa.reset()
    return ex


def _from_public_explain(ex: Explanation, rep):
    ex.graph_count = int(getattr(rep, "graph_count", 0))
    ex.break_count = int(getattr(rep, "graph_break_count", 0))
    ex.op_count = int(getattr(rep, "op_count", 0))
    graphs = list(getattr(rep, "graphs", []) or [])
    ops = list(getattr(rep, "ops_per_graph", []) or [])
    guards = list(getattr(rep, "guards", []) or [])
    for i, gm in enumerate(graphs):
        gi = _graph_info(getattr(gm, "_tempa_function", f"graph {i + 1}"), gm, None,
                         [str(g) for g in (guards[i] if i < len(guards) else [])], None)
        if i < len(ops) and isinstance(ops[i], (list, tuple)):
            gi.op_count = len(ops[i])
        ex.graphs.append(gi)
    ex.breaks = [_break_from(b) for b in getattr(rep, "break_reasons", []) or []]
    ex.eager_fallbacks = [str(f) for f in getattr(rep, "eager_fallbacks", []) or []]


def _from_entries(ex: Explanation, compiled):
    ex.graphs = entries(compiled)
    ex.graph_count = len(ex.graphs)
    ex.op_count = sum(g.op_count for g in ex.graphs)
    for reason in eager_reasons(compiled):
        fn, _, text = reason.partition(": ")
        b = parse_break(text)
        if b.type != "unknown" or "recompile_limit" not in text:
            ex.breaks.append(b)
        ex.eager_fallbacks.append(f"{fn} runs eagerly: {text.split('. Hint:')[0]}")
    ex.break_count = len(ex.breaks)


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
    if ex.notes:
        out += ["", "Notes:"] + [f"  - {n}" for n in ex.notes]
    return "\n".join(out)
