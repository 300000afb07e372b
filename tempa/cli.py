"""The `tempa` command line: does compiling pay off for my model, and what did tempa do?

    tempa bench   FILE.py      eager vs compiled: first call cold/warm, per call, break-even
    tempa explain FILE.py      graphs, breaks with the source line, guards, recompiles
    tempa report  FILE.py -o report.html   all of the above in one self-contained page
    tempa cache   info|clear   the on-disk cache of compiled artifacts

The measurement logic lives in tempa/tools/, the page in tempa/report/; this file only
parses arguments, prints, and turns bad input into one line and exit status 2.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys

from .stance import STANCES

EXIT_BAD_INPUT = 2

CONVENTION_HELP = """\
FILE (the model to look at):
  FILE.py defines
      model            an nn.Module or a function
      example_inputs   a tuple of positional arguments, e.g. (torch.randn(8, 32),)
      example_kwargs   optional: a dict of keyword arguments
      extra_inputs     optional: a list of further input tuples (other shapes) that
                       explain/report run after the first call, to show recompiles
  or FILE.py defines make() returning (model, example_inputs[, example_kwargs]).
  Also accepted: a module name (pkg.models), module:attr or FILE.py:attr, where attr is a
  make()-style function. Examples: examples/seed_mlp.py, examples/README.md.
"""

BENCH_HELP = CONVENTION_HELP + """
How it measures:
  per call     after 10 warm-up calls, 12 rounds each time a block of eager and a block
               of compiled calls back to back, one by one; median and IQR per side, and the
               speed-up with a 95% interval (bootstrap over the rounds; "cannot tell" when
               it contains 1.0x). Eager is also timed alone before anything is compiled
               (generated kernels' threads can slow down eager code that runs after them;
               the bench notes it when it happens).
  first call   cold: a fresh process, empty disk cache (what the first run of your program
               pays); warm: a second fresh process finding the cache the first one filled
               (what every later start pays). --first-call in-process times the cold first
               call in this process instead and skips warm (faster, less faithful).
  break-even   calls n until first_call + (n-1)*compiled <= n*eager.

--json PATH writes (schema "tempa.bench/1"; times in seconds, null where not measured):
  {"schema": "tempa.bench/1",
   "target": {"spec", "name", "inputs", "device", "no_grad", "backend"},
   "environment": {"tempa", "torch", "load_average", "cpus", "python", "platform", "cpu",
                   "torch_threads", "cuda"},
   "eager": {"first_call_s", "median_s", "q1_s", "q3_s", "iqr_s", "calls"},
   "modes": [{"mode", "ok", "error", "first_call_cold_s", "first_call_warm_s",
              "first_call_in_process_s", "first_call_method", "median_s", "q1_s", "q3_s",
              "iqr_s", "calls", "speedup", "speedup_ci", "rounds", "break_even_calls",
              "break_even_calls_warm",
              "stats": {"captures", "recompiles", "graph_breaks", "eager_fallbacks",
                        "graphs_compiled", "kernels_compiled", "aten_fallbacks",
                        "disk_cache_hits", "gcc_runs"},
              "fallback_messages": [str], "reasons": [str], "verdict": str}]}

Exit status: 0 measured (whatever the verdict), 2 bad input (the FILE, an option).
"""


class _Fmt(argparse.RawDescriptionHelpFormatter):
    pass


def _common(p: argparse.ArgumentParser, *, measure: bool):
    p.add_argument("target", metavar="FILE",
                   help="FILE.py (or module, module:attr) defining the model; see below")
    p.add_argument("--backend", default="tempa" if measure else "eager",
                   help="'tempa' (generated kernels), 'eager' (capture only) or "
                        "module:function (your backend(gm, example_inputs))"
                        + ("" if measure else "; default: eager (capture is what explain shows)"))
    p.add_argument("--no-grad", action="store_true", help="run under torch.no_grad()")
    p.add_argument("--debug", action="store_true", help="show tracebacks")
    p.add_argument("--stance", default="default", choices=STANCES,
                   help="tempa.set_stance for the run; 'auto' keeps, per function, the faster "
                        "of compiled and eager (default: %(default)s)")
    if measure:
        p.add_argument("--mode", default="default",
                       help="comma-separated: default,reduce-overhead,max-autotune "
                            "(default: %(default)s)")
        p.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
        p.add_argument("--calls", type=int, default=None,
                       help="timed calls per side (default: enough for ~0.5 s, at least 200)")
        p.add_argument("--warmup", type=int, default=10, help="warm-up calls (default 10)")
        p.add_argument("--first-call", choices=("subprocess", "in-process"),
                       default="subprocess", help="how first calls are timed (see below)")
        p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version
    import torch
    try:
        mine = version("tempa")
    except PackageNotFoundError:    # run from a source tree that was never installed
        mine = "(not installed)"
    return f"{mine} (torch {torch.__version__})"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tempa", formatter_class=_Fmt,
        description="tempa: a just-in-time compiler for PyTorch. These commands answer "
                    "\"does compiling pay off for my model?\" and show what tempa did.",
        epilog=CONVENTION_HELP + "\nLogging: TEMPA_LOGS=graphs,guards,recompiles,breaks,code,"
                                 "perf,fallbacks (or all) prints tempa's log channels.")
    p.add_argument("--version", action="version", version=f"tempa {_version()}")
    sub = p.add_subparsers(dest="command", metavar="{bench,explain,report,cache}")

    b = sub.add_parser("bench", formatter_class=_Fmt, epilog=BENCH_HELP,
                       help="eager vs compiled: first call, per call, break-even, verdict",
                       description="Run FILE's model eagerly and compiled in one process and "
                                   "say whether compiling pays off, after how many calls.")
    _common(b, measure=True)
    b.add_argument("--json", metavar="PATH", help="also write the results as JSON ('-': stdout "
                                                  "instead of the table)")

    e = sub.add_parser("explain", formatter_class=_Fmt, epilog=CONVENTION_HELP,
                       help="graphs, breaks with the source line and hint, guards, recompiles",
                       description="Capture FILE's model and show the graphs, every graph "
                                   "break with your source line and a hint, the guards of "
                                   "each entry, recompile reasons and eager fallbacks.")
    _common(e, measure=False)
    e.add_argument("--no-code", action="store_true", help="do not print each graph's code")

    r = sub.add_parser("report", formatter_class=_Fmt, epilog=CONVENTION_HELP,
                       help="one self-contained HTML page: bench + explain + generated code",
                       description="Write one self-contained HTML file (no network needed) "
                                   "with the bench table and chart, graphs, breaks, guards, "
                                   "generated kernels, wrapper and fusion decisions.")
    _common(r, measure=True)
    r.add_argument("-o", "--output", default="report.html", help="default: %(default)s")

    c = sub.add_parser("cache", help="where the disk cache is, its size; clear it",
                       description="The on-disk cache of compiled artifacts (tempa.config."
                                   "cache_dir, TEMPA_CACHE_DIR).")
    c.add_argument("action", choices=("info", "clear"))
    c.add_argument("--json", action="store_true", help="info as JSON")
    c.add_argument("--debug", action="store_true")
    return p


def _fail(command: str, msg: str) -> int:
    print(f"tempa {command}: error: {msg}", file=sys.stderr)
    return EXIT_BAD_INPUT


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return EXIT_BAD_INPUT
    from .tools.load import TargetError
    try:
        with _stance(args):
            return {"bench": cmd_bench, "explain": cmd_explain, "report": cmd_report,
                    "cache": cmd_cache}[args.command](args)
    except TargetError as e:
        if args.debug:
            raise
        return _fail(args.command, str(e))
    except KeyboardInterrupt:
        print(f"tempa {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if args.debug:
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        print(f"tempa {args.command}: internal error: {type(e).__name__}: {first} (run with "
              "--debug for the traceback, and please report it)", file=sys.stderr)
        return 1


def _stance(args):
    if getattr(args, "stance", "default") == "default":
        return contextlib.nullcontext()
    import tempa
    return tempa.set_stance(args.stance)


def _modes(spec: str) -> list[str]:
    return [m.strip() for m in spec.split(",") if m.strip()]


def _load(args):
    from .tools.load import load
    return load(args.target, debug=args.debug)


def _bench(args, *, keep_compiled=False):
    from .tools import bench
    target = _load(args)
    if args.calls is not None and args.calls < 1:
        from .tools.load import TargetError
        raise TargetError("--calls must be at least 1")
    return target, bench.run(target, modes=_modes(args.mode), backend=args.backend,
                             device=args.device, no_grad=args.no_grad, warmup=args.warmup,
                             calls=args.calls, first_call=args.first_call,
                             progress=not args.quiet, keep_compiled=keep_compiled,
                             debug=args.debug)


def cmd_bench(args) -> int:
    from .tools import bench
    _, res = _bench(args)
    data = res.to_json()
    if args.json == "-":
        json.dump(data, sys.stdout, indent=2)
        print()
        return 0
    print(bench.render_text(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(data, f, indent=2)
        print(f"\nwrote {args.json}")
    return 0


def _grad(args):
    import torch
    return torch.no_grad() if args.no_grad else contextlib.nullcontext()


def cmd_explain(args) -> int:
    from .tools import explain
    from .tools.bench import resolve_backend
    target = _load(args)
    backend = resolve_backend(args.backend)
    from .tools.load import check_eager
    with _grad(args):
        check_eager(target, args.debug)
        ex = explain.explain(target, backend=backend)
    print(explain.render_text(ex, show_code=not args.no_code))
    return 0


def cmd_report(args) -> int:
    from .report import render
    from .tools import explain
    target, res = _bench(args, keep_compiled=True)
    # What the backend generated, from the compiled model the bench timed (first mode that
    # compiled); read before explain, which resets tempa's caches.
    generated = []
    for m in res.modes:
        if m.compiled is not None:
            generated = explain.entries(m.compiled)
            break
    with _grad(args):
        ex = explain.explain(target.to(args.device), backend="eager")
    html = render.page(res, ex, generated)
    out = os.path.abspath(args.output)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        f.write(html)
    verdicts = "; ".join(f"[{m.mode}] {m.verdict}" for m in res.modes)
    print(f"wrote {args.output} ({len(html) // 1024} KiB): {verdicts}")
    return 0


def cmd_cache(args) -> int:
    from .tools import cache
    if args.action == "info":
        ci = cache.info()
        if args.json:
            print(json.dumps({"path": ci.path, "exists": ci.exists, "entries": ci.entries,
                              "bytes": ci.bytes, "by_kind": ci.by_kind}, indent=2))
            return 0
        print(f"tempa disk cache: {ci.path}" + ("" if ci.exists else " (does not exist yet)"))
        print(f"  entries: {ci.entries}")
        print(f"  size:    {cache.human_bytes(ci.bytes)}")
        for kind, n in sorted(ci.by_kind.items()):
            print(f"    {kind}: {n}")
        print("  (set TEMPA_CACHE_DIR or tempa.config.cache_dir to move it; "
              "`tempa cache clear` empties it)")
        return 0
    n, freed = cache.clear()
    print(f"tempa disk cache: {cache.cache_dir()}: removed {n} entries "
          f"({cache.human_bytes(freed)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
