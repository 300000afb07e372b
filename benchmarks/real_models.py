"""Real-size HF models on the CPU (fp32): eager vs tempa vs torch.compile, one process.

    python benchmarks/real_models.py [--models resnet,bert,...] [--mode infer|train|both]
                                     [--size quick|default|larger] [--quick] [--rounds N]
                                     [--threads N] [--clock wall|cpu] [--no-torch-compile]
                                     [--profile] [--freezing]
                                     [--json PATH]

The models are hf_models.py's (transformers configs, random weights). For each model and
mode, each system gets its own copy of the same weights; its first call is timed (the
compile time: tempa starts from an empty cache directory, so gcc runs) and its result
checked: inference compares every output tensor, a training step the loss and every
parameter's gradient, against a float64 reference (the same model and inputs upcast to
float64, run eagerly). Eager's own fp32 result is measured against that reference too, and a
system is a MISMATCH where some tensor's largest error exceeds 4 times eager's on the same
tensor, or a floor (1e-5 of the tensor's largest value; for gradients at least 1e-5 of the
largest gradient, as a gradient that is zero in exact arithmetic comes out as rounding noise
of the terms that cancel). Why not fp32 eager as the reference: rounding in a deep net
differs between any two fp32 evaluation orders, eager's included, and at ReLU6's kinks a
rounding moves a gradient by a whole term. A
mismatch is printed as MISMATCH and makes the exit status 1. Then the three are timed
interleaved round by round (models.py's ``interleaved``: load from other jobs hits all
alike), medians of per-call times after warm-up. A training step is forward, the model's
loss (labels passed in), backward and an SGD step.

``--quick``: the "quick" size (fewer layers, batch 1) and 3 rounds.
``--freezing``: inference rows also run tempa with ``options={"freezing": True}`` (Linear
weights packed once for MKL) and torch.compile with Inductor's ``freezing`` (parameters folded
as constants), as two more systems timed in the same rounds.
``--profile``: also time each statement of tempa's generated wrappers (segments.py: the C++
kernels, each ATen op it calls, allocations) and print where a call's time goes.

Prints one line per row as it finishes, then a Markdown table (README.md, "Real-size
models"). Speedups are eager time / compiled time (above 1: faster than eager).
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
import tempfile
import time
import traceback
import types
import warnings

import torch

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import hf_models  # noqa: E402
import models  # noqa: E402
import tempa  # noqa: E402
from models import interleaved  # noqa: E402

# MISMATCH where a result's error against the float64 reference exceeds this many times
# eager fp32's error on the same tensor, or FLOOR of the tensor's largest value
EAGER_ERROR_FACTOR = 4.0
FLOOR = 1e-5


class Mismatch(AssertionError):
    pass


# --- what one call of each system is ---------------------------------------------------------
def make_step(fn, model, kwargs, train):
    """One call: inference under no_grad, or a training step (forward, loss, backward, SGD)."""
    if not train:
        def infer():
            with torch.no_grad():
                return fn(**kwargs)
        return infer
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step():
        loss = hf_models.loss_of(fn(**kwargs))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss
    return step


def first_result(fn, model, kwargs, train):
    """What the first call computes, for the comparison with eager: the output tensors, or
    for a training step the loss and the gradients (taken before the SGD step that
    ``make_step`` does on later calls)."""
    if not train:
        with torch.no_grad():
            return _tensors(fn(**kwargs))
    loss = hf_models.loss_of(fn(**kwargs))
    loss.backward()
    grads = [p.grad.detach().clone() for p in model.parameters() if p.grad is not None]
    model.zero_grad(set_to_none=True)
    return [loss.detach()] + grads


def _tensors(out):
    if isinstance(out, torch.Tensor):
        return [out.detach()]
    if hasattr(out, "to_tuple"):
        out = out.to_tuple()
    if isinstance(out, dict):
        out = list(out.values())
    if isinstance(out, (list, tuple)):
        return [t for o in out for t in _tensors(o)]
    return []


def errors_of(got, ref64, who):
    """The largest absolute error of each result tensor against the float64 reference."""
    if len(got) != len(ref64):
        raise Mismatch(f"{who}: {len(got)} result tensors, the float64 reference {len(ref64)}")
    errs = []
    for i, (g, r) in enumerate(zip(got, ref64)):
        if g.shape != r.shape:
            raise Mismatch(f"{who}: result {i} has shape {tuple(g.shape)}, the float64 reference "
                           f"{tuple(r.shape)}")
        errs.append((g.double() - r).abs().max().item() if r.numel() else 0.0)
    return errs


def check_close(got, ref64, eager_errs, who, floor=0.0):
    """Raise Mismatch naming the first tensor whose error against the float64 reference is
    above EAGER_ERROR_FACTOR times eager fp32's (``eager_errs``) and above the floor (FLOOR
    of the tensor's largest value, or ``floor`` where that is larger). Returns the worst
    error relative to its tensor's largest value."""
    worst = 0.0
    for i, (err, eager_err, r) in enumerate(zip(errors_of(got, ref64, who), eager_errs, ref64)):
        scale = r.abs().max().item() if r.numel() else 0.0
        worst = max(worst, err / (scale or 1.0))
        allowed = max(EAGER_ERROR_FACTOR * eager_err, FLOOR * scale, floor)
        if err > allowed:
            raise Mismatch(f"{who}: result {i} (shape {tuple(r.shape)}) differs from the float64 "
                           f"reference by {err:.3g} (eager fp32: {eager_err:.3g}; largest value "
                           f"{scale:.3g})")
    return worst


def _floor(ref, train):
    """The absolute tolerance below which a gradient's difference is rounding: a gradient
    that is zero in exact arithmetic (a bias in front of a LayerNorm) comes out as rounding
    noise of the terms that cancel, whose size is that of the other gradients; 1e-5 of the
    largest one. Inference outputs have none: each is compared at its own scale."""
    if not train:
        return 0.0
    return 1e-5 * max((g.abs().max().item() for g in ref[1:] if g.numel()), default=0.0)


def float64_reference(case, train):
    """The first call's results with the model and its floating-point inputs upcast to
    float64, eagerly: the reference both fp32 eager and the compiled systems are measured
    against."""
    model = copy.deepcopy(case.model).double()
    kwargs = {k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
              for k, v in case.kwargs.items()}
    return first_result(model, model, kwargs, train)


# --- one row -------------------------------------------------------------------------------
def _calling(model, tag):
    """A function calling ``model``, with a code object of its own. Why: Dynamo keeps its
    compiled graphs per code object, and two copies of one model share ``forward``'s, so
    torch.compile's second copy would run the graph compiled for the first (made with or
    without Inductor's freezing), whatever the flag was when it was called first."""
    def call(*args, **kwargs):
        return model(*args, **kwargs)
    code = call.__code__.replace(co_name=f"call_{tag.replace('.', '_').replace('+', '_')}")
    return types.FunctionType(code, call.__globals__, code.co_name, call.__defaults__, call.__closure__)


def bench_row(name, size, train, use_tc, rounds, profile_calls=0, freezing=False):
    """``freezing`` (inference rows): also tempa with options={"freezing": True} and
    torch.compile with Inductor's freezing, as "tempa+freezing" and "torch.compile+freezing"."""
    case = hf_models.build(name, size, train)
    row = {"model": name, "title": case.title, "mode": "train" if train else "infer"}
    freezing = freezing and not train
    copies = {"eager": case.model, "tempa": copy.deepcopy(case.model)}
    if freezing:
        copies["tempa+freezing"] = copy.deepcopy(case.model)
    if use_tc:
        copies["torch.compile"] = copy.deepcopy(case.model)
        if freezing:
            copies["torch.compile+freezing"] = copy.deepcopy(case.model)
    ref64 = float64_reference(case, train)
    eager_errs = errors_of(first_result(case.model, case.model, case.kwargs, train), ref64,
                           f"{name} {row['mode']} eager")
    floor = _floor(ref64, train)
    row["eager_err"] = max((e / (r.abs().max().item() or 1.0) for e, r in zip(eager_errs, ref64)
                            if r.numel()), default=0.0)
    runs = {"eager": make_step(case.model, case.model, case.kwargs, train)}

    tempa.reset()

    def with_tempa(key, prefix, options=None):
        before = tempa.stats()
        with tempfile.TemporaryDirectory() as d:
            old = tempa.config.cache_dir
            tempa.config.cache_dir = d
            try:
                if profile_calls and key == "tempa":
                    import segments
                    segments.install(models.CLOCK)
                fast = tempa.compile(copies[key], options=options)
                t0 = time.perf_counter()
                got = first_result(fast, copies[key], case.kwargs, train)
                row[f"{prefix}_compile_s"] = time.perf_counter() - t0
            finally:
                tempa.config.cache_dir = old
        s = tempa.stats()
        row[f"{prefix}_info"] = (
            f"{s.graphs_compiled - before.graphs_compiled} graphs, "
            f"{s.graph_breaks - before.graph_breaks} breaks, "
            f"{s.kernels_compiled - before.kernels_compiled} kernels, "
            f"{s.aten_fallbacks - before.aten_fallbacks} ATen fallbacks")
        row[f"{prefix}_err"] = check_close(got, ref64, eager_errs, f"{name} {row['mode']} {key}", floor)
        runs[key] = make_step(fast, copies[key], case.kwargs, train)
        return fast
    with_tempa("tempa", "tempa")
    if freezing:
        fast = with_tempa("tempa+freezing", "tempa_frz", {"freezing": True})
        row["tempa_frz_packed"] = sum(len(getattr(e.kernels.inference, "packed_weights", ()))
                                      for e in tempa.entries(fast)
                                      if e.kernels is not None and e.kernels.inference is not None)

    def with_torch_compile(key, prefix, inductor_freezing=False):
        import torch._inductor.config as inductor_config
        try:
            tc = torch.compile(_calling(copies[key], key) if freezing else copies[key])
            t0 = time.perf_counter()
            # Inductor reads its freezing flag when it compiles, on the first call
            with inductor_config.patch(freezing=inductor_freezing):
                got = first_result(tc, copies[key], case.kwargs, train)
            row[f"{prefix}_compile_s"] = time.perf_counter() - t0
            row[f"{prefix}_err"] = check_close(got, ref64, eager_errs, f"{name} {row['mode']} {key}",
                                               floor)
            runs[key] = make_step(tc, copies[key], case.kwargs, train)
        except Mismatch:
            raise
        except Exception as e:  # noqa: BLE001 - torch.compile failing is a row note, not ours
            row[f"{prefix}_error"] = f"{type(e).__name__}: {e}"[:100]
    if use_tc:
        torch._dynamo.reset()
        with_torch_compile("torch.compile", "tc")
        if freezing:
            with_torch_compile("torch.compile+freezing", "tc_frz", inductor_freezing=True)

    row.update({k + "_us": v for k, v in interleaved(runs, rounds, target_s=0.2).items()})
    if profile_calls:
        import segments
        row["profile"] = segments.profile(runs["tempa"], profile_calls)
    return row


# --- output --------------------------------------------------------------------------------
def _ms(us):
    return f"{us / 1e3:.2f}" if us is not None else "—"


def print_line(r):
    e, t, c = r["eager_us"], r["tempa_us"], r.get("torch.compile_us")
    tc = (f"torch.compile {_ms(c)} ms ({e / c:5.2f}x, compile {r['tc_compile_s']:5.1f} s)" if c
          else f"torch.compile: {r.get('tc_error', 'not run')}")
    frz = ""
    for key, prefix in (("tempa+freezing", "tempa_frz"), ("torch.compile+freezing", "tc_frz")):
        f = r.get(key + "_us")
        if f:
            frz += f"  {key} {_ms(f)} ms ({e / f:5.2f}x, compile {r[prefix + '_compile_s']:5.1f} s)"
        elif prefix + "_error" in r:
            frz += f"  {key}: {r[prefix + '_error']}"
    if "tempa_frz_packed" in r:
        frz += f"  [{r['tempa_frz_packed']} weights packed]"
    print(f"{r['model']:16s} {r['mode']:5s} eager {_ms(e)} ms  tempa {_ms(t)} ms ({e / t:5.2f}x, "
          f"compile {r['tempa_compile_s']:5.1f} s)  {tc}{frz}  [{r['tempa_info']}]", file=sys.stderr,
          flush=True)


def geomean(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def table(rows) -> str:
    if any("tempa+freezing_us" in r or "tempa_frz_error" in r for r in rows):
        return freezing_table(rows)
    out = ["| model | mode | eager ms | tempa ms | tempa speedup | tempa compile s | "
           "torch.compile ms | torch.compile speedup | torch.compile compile s |",
           "|---|---|---|---|---|---|---|---|---|"]
    st, sc = [], []
    for r in rows:
        e, t, c = r["eager_us"], r["tempa_us"], r.get("torch.compile_us")
        st.append(e / t)
        if c:
            sc.append(e / c)
        tc = f"{_ms(c)} | {e / c:.2f}x | {r['tc_compile_s']:.1f}" if c else f"— | — | {r.get('tc_error', '')}"
        out.append(f"| {r['title']} | {r['mode']} | {_ms(e)} | {_ms(t)} | {e / t:.2f}x | "
                   f"{r['tempa_compile_s']:.1f} | {tc} |")
    out.append(f"| **geomean** | | | | **{geomean(st):.2f}x** | | | **{geomean(sc):.2f}x** | |")
    return "\n".join(out)


# the systems of a --freezing table: (runs key, row prefix)
FREEZING_SYSTEMS = (("tempa", "tempa"), ("tempa+freezing", "tempa_frz"),
                    ("torch.compile", "tc"), ("torch.compile+freezing", "tc_frz"))


def freezing_table(rows) -> str:
    """--freezing: eager, tempa and torch.compile each without and with freezing: per call
    ms (speedup over eager), compile seconds, and how many weights tempa packed."""
    out = ["| model | mode | eager ms | " + " | ".join(f"{k} ms" for k, _ in FREEZING_SYSTEMS)
           + " | compile s (" + " / ".join(k for k, _ in FREEZING_SYSTEMS) + ") | weights packed |",
           "|---|---|---|" + "---|" * len(FREEZING_SYSTEMS) + "---|---|"]
    speedups = {k: [] for k, _ in FREEZING_SYSTEMS}
    for r in rows:
        e = r["eager_us"]
        cells, compiles = [], []
        for key, prefix in FREEZING_SYSTEMS:
            t = r.get(key + "_us")
            if t:
                speedups[key].append(e / t)
            cells.append(f"{_ms(t)} ({e / t:.2f}x)" if t else "—")
            compiles.append(f"{r[prefix + '_compile_s']:.1f}" if prefix + "_compile_s" in r else "—")
        out.append(f"| {r['title']} | {r['mode']} | {_ms(e)} | " + " | ".join(cells)
                   + f" | {' / '.join(compiles)} | {r.get('tempa_frz_packed', '—')} |")
    out.append("| **geomean** | | | " + " | ".join(f"**{geomean(speedups[k]):.2f}x**" if speedups[k]
                                                  else "—" for k, _ in FREEZING_SYSTEMS) + " | | |")
    errors = [f"{r['title']} {key}: {r[prefix + '_error']}" for r in rows
              for key, prefix in FREEZING_SYSTEMS if prefix + "_error" in r]
    return "\n".join(out + ([""] + [f"- {x}" for x in errors] if errors else []))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(hf_models.NAMES),
                    help="comma-separated, from: " + ", ".join(hf_models.NAMES))
    ap.add_argument("--mode", choices=["infer", "train", "both"], default="both")
    ap.add_argument("--size", choices=["quick", "default", "larger"], default="default")
    ap.add_argument("--quick", action="store_true", help="--size quick and 3 rounds")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--threads", type=int, default=0, help="torch.set_num_threads for all three")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="cpu: time calls by this thread's CPU time, which does not count the "
                         "time other jobs hold the cores (use with --threads 1)")
    ap.add_argument("--no-torch-compile", action="store_true")
    ap.add_argument("--freezing", action="store_true",
                    help="inference rows: also tempa with options={'freezing': True} and "
                         "torch.compile with Inductor's freezing (columns tempa+freezing, "
                         "torch.compile+freezing)")
    ap.add_argument("--profile", action="store_true",
                    help="also print where each tempa call's time goes (segments.py)")
    ap.add_argument("--json", default="", help="write the rows (and profiles) to this path")
    a = ap.parse_args()
    if a.quick:
        a.size, a.rounds = "quick", min(a.rounds, 3)
    if a.threads:
        torch.set_num_threads(a.threads)
    models.CLOCK = time.thread_time if a.clock == "cpu" else time.perf_counter
    if not hf_models.available():
        sys.exit("real_models.py needs transformers (pip install transformers)")
    warnings.filterwarnings("ignore")
    import transformers
    transformers.logging.set_verbosity_error()
    modes = {"infer": [False], "train": [True], "both": [False, True]}[a.mode]
    load = os.getloadavg()
    rows, failed = [], []
    for name in a.models.split(","):
        for train in modes:
            try:
                r = bench_row(name, a.size, train, not a.no_torch_compile, a.rounds,
                              profile_calls=5 * a.rounds if a.profile else 0, freezing=a.freezing)
            except Mismatch as e:
                print(f"MISMATCH {e}", file=sys.stderr, flush=True)
                failed.append(str(e))
                continue
            except Exception as e:  # noqa: BLE001 - one model failing must not end the run
                traceback.print_exc()
                failed.append(f"{name} {'train' if train else 'infer'}: {type(e).__name__}: {e}")
                continue
            rows.append(r)
            print_line(r)
            if a.profile:
                print(f"## {r['title']} {r['mode']}: where tempa's call goes\n{r['profile']}\n",
                      file=sys.stderr, flush=True)
    print(f"\n{time.strftime('%Y-%m-%d %H:%M')}, size {a.size}, {os.cpu_count()} cores, "
          f"{torch.get_num_threads()} threads, {a.clock} clock, torch {torch.__version__}, transformers "
          f"{transformers.__version__}, load average at start {load[0]:.2f}, at end "
          f"{os.getloadavg()[0]:.2f}; per call ms, medians of {a.rounds} interleaved rounds\n")
    print(table(rows))
    if failed:
        print("\nFAILED:\n" + "\n".join(f"- {f}" for f in failed))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "failed": failed, "size": a.size, "torch": torch.__version__}, f, indent=1)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
