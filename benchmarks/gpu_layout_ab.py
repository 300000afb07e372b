"""A/B of tempa's convolution layout policy (config.gpu_conv_layout, lower/layout.py
CONV_LAYOUTS) and of split reductions (config.gpu_split_reductions, lower/reductions.py):
torchvision ResNet-50 inference and training step, tempa default and reduce-overhead with
convolutions channels-last and in eager's layouts, next to eager, in one process, bf16
autocast (issue 19).

    python benchmarks/gpu_layout_ab.py [--rows resnet50_tv,resnet50_tv_train] [--reps N]
                                       [--torch-compile] [--out results.json]
                                       [--cells reduce-overhead:eager:nosplit,...]

--cells: the tempa cells as MODE:LAYOUT:SPLIT (split or nosplit), default every mode and
layout with reductions split.

Each tempa cell's first call is checked against eager's: the output (inference) or the
loss, every parameter gradient and BatchNorm's running stats after one backward (training),
as relative errors (bf16: about 1e-2 expected, above 5e-2 says MISMATCH), and the strides
of the output and of every .grad against eager's (the policy must not change what the
caller sees). The timed training step is gpu_real.py's: forward, loss, backward, SGD.
--torch-compile adds torch.compile reduce-overhead for reference (about 2 minutes more).
--device cpu --size quick --reps 2 [--rows small_convnet,small_convnet_train]: a smoke test
without a GPU (config.cpu_conv_layout is switched instead; figures meaningless).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

import gpu_real  # noqa: E402
from gpu_real import KwAutocast, compare, make_row, median_call_ms, sync  # noqa: E402

LAYOUTS = ("channels_last", "eager")
MODES = ("default", "reduce-overhead")


def _flat(tensors):
    return torch.cat([t.detach().float().reshape(-1) for t in tensors])


def _rel(a, b) -> float:
    return ((a - b).norm() / (b.norm() + 1e-12)).item()


def first_call(row, fn, model):
    """What the first call gives, for the checks: output or loss, grads, running stats,
    strides of the output and of each .grad."""
    if row.kind == "train":
        loss = gpu_real.hf_models.loss_of(fn(**row.kwargs))
        loss.backward()
        params = [p for p in model.parameters() if p.grad is not None]
        got = dict(out=loss.detach().clone(), grads=_flat(p.grad for p in params),
                   grad_strides=[p.grad.stride() for p in params],
                   stats=_flat(b for b in model.buffers() if b.is_floating_point()), strides=())
        model.zero_grad(set_to_none=True)
        return got
    with torch.no_grad():
        out = gpu_real.hf_models.first_tensor(fn(**row.kwargs))
    return dict(out=out.detach().clone(), strides=out.stride())


def checks(got, ref) -> tuple:
    """(error of the output or loss, error of the grads and stats, what differs)."""
    err, verdict = compare(got["out"], ref["out"], "infer")
    notes = [verdict] if verdict else []
    if tuple(got["strides"]) != tuple(ref["strides"]):
        notes.append(f"output strides {got['strides']} vs eager {ref['strides']}")
    grad_err = float("nan")
    if "grads" in got:
        grad_err = max(_rel(got["grads"], ref["grads"]), _rel(got["stats"], ref["stats"]))
        if grad_err > 5e-2:
            notes.append("GRAD MISMATCH")
        bad = sum(a != b for a, b in zip(got["grad_strides"], ref["grad_strides"]))
        if bad or len(got["grad_strides"]) != len(ref["grad_strides"]):
            notes.append(f"{bad} .grad strides differ from eager's")
    return err, grad_err, notes


def timed_call(row, fn, model):
    if row.kind != "train":
        def call():
            with torch.no_grad():
                return fn(**row.kwargs)
        return call
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step():
        loss = gpu_real.hf_models.loss_of(fn(**row.kwargs))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss
    return step


def layout_notes(fn) -> str:
    """What tempa says its layout policy did (pass "layout" of each compiled graph)."""
    from tempa.introspect import entries
    said = []
    for e in entries(fn):
        info = e.kernels
        text = getattr(info, "passes", {}).get("layout") if info is not None else None
        if text:
            said.extend(text.splitlines())
    return " | ".join(said) or "no layout pass"


class SmallConvNet(torch.nn.Module):
    """Conv + BN + ReLU blocks with a residual and a stride-2 stage: the smoke test's row
    ("small_convnet", "small_convnet_train") where torchvision is missing."""

    def __init__(self, c=16):
        super().__init__()
        nn = torch.nn
        self.stem = nn.Sequential(nn.Conv2d(3, c, 3, padding=1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.body = nn.Sequential(nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c))
        self.down = nn.Sequential(nn.Conv2d(c, 2 * c, 3, stride=2, padding=1, bias=False),
                                  nn.BatchNorm2d(2 * c), nn.ReLU())
        self.head = nn.Linear(2 * c, 10)

    def forward(self, x):
        y = self.stem(x)
        y = torch.relu(self.body(y) + y)
        return self.head(self.down(y).mean((2, 3)))


def make(key):
    if not key.startswith("small_convnet"):
        return make_row(key)
    torch.manual_seed(0)
    m = SmallConvNet().to(gpu_real.DEVICE)
    x = torch.randn(4, 3, 32, 32, device=gpu_real.DEVICE)
    if key.endswith("_train"):
        return gpu_real.TrainRow(key, "small convnet train step", m, {"x": x})
    return gpu_real.Row(key, "small convnet", m.eval(), {"x": x})


def run_cell(row, system, mode, layout, ref, split=True):
    import tempa
    model = copy.deepcopy(row.model)
    model.train() if row.kind == "train" else model.eval()
    wrapped = KwAutocast(model)
    if system == "tempa":
        tempa.reset()
        tempa.config.gpu_conv_layout = tempa.config.cpu_conv_layout = layout
        tempa.config.gpu_split_reductions = split
        fn = tempa.compile(wrapped, mode=None if mode == "default" else mode)
    elif system == "torch.compile":
        import importlib
        importlib.import_module("torch._dynamo").reset()
        fn = torch.compile(wrapped, mode=None if mode == "default" else mode)
    else:
        fn = wrapped
    sync()
    t0 = time.perf_counter()
    got = first_call(row, fn, model)
    sync()
    compile_s = time.perf_counter() - t0
    ms = median_call_ms(timed_call(row, fn, model), warmup=5, reps=row.reps)
    r = dict(row=row.key, system=system, mode=mode, layout=layout, ms=ms, compile_s=compile_s,
             split=("split" if split else "nosplit") if system == "tempa" else "-")
    if ref is None:
        r.update(err=0.0, grad_err=0.0, notes="")
        return r, got
    err, grad_err, notes = checks(got, ref)
    if system == "tempa":
        s = tempa.stats()
        notes.append(f"{s.graphs_compiled} graphs, {s.kernels_compiled} kernels, "
                     f"{s.eager_fallbacks} eager fallbacks; {layout_notes(fn)}")
    r.update(err=err, grad_err=grad_err, notes="; ".join(notes))
    return r, got


def table(results) -> str:
    lines = ["| row | system | mode | conv layout | reductions | ms | vs eager | compile s | err | grad err | notes |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    eager = {r["row"]: r["ms"] for r in results if r["system"] == "eager"}
    for r in results:
        e = eager.get(r["row"])
        speed = f"{e / r['ms']:.2f}x" if e and r["ms"] == r["ms"] and r["ms"] > 0 else "—"
        lines.append(f"| {r['row']} | {r['system']} | {r['mode']} | {r['layout']} | {r.get('split', '-')} | {r['ms']:.2f} | "
                     f"{speed} | {r['compile_s']:.1f} | {r['err']:.1e} | {r['grad_err']:.1e} | "
                     f"{r['notes']} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="resnet50_tv,resnet50_tv_train")
    ap.add_argument("--reps", type=int, default=0, help="timed calls per cell (default: per row)")
    ap.add_argument("--torch-compile", action="store_true", help="add torch.compile reduce-overhead")
    ap.add_argument("--budget-s", type=float, default=480.0, help="start no cell after this many seconds")
    ap.add_argument("--out", default="", help="results JSON (and a .md table beside it)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--size", choices=["quick", "larger"], default="larger")
    ap.add_argument("--cells", default="", help="tempa cells, MODE:LAYOUT:split|nosplit, comma-separated")
    a = ap.parse_args()
    started = time.time()
    gpu_real.DEVICE, gpu_real.SIZE = a.device, a.size
    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_layout_ab.py needs CUDA (or --device cpu --size quick for a smoke test)")
    os.environ.setdefault("TEMPA_CACHE_DIR", tempfile.mkdtemp(prefix="tempa-layout-ab-"))
    import tempa
    tempa.config.cache_dir = os.environ["TEMPA_CACHE_DIR"]
    warnings.filterwarnings("ignore")
    if a.cells:
        tempa_cells = [tuple(c.split(":")) for c in a.cells.split(",")]
    else:
        tempa_cells = [(m, lay, "split") for lay in LAYOUTS for m in MODES]
    cells = [("eager", "-", "-", "-")] + [("tempa",) + c for c in tempa_cells]
    if a.torch_compile:
        cells.append(("torch.compile", "reduce-overhead", "-", "-"))
    results = []
    for key in a.rows.split(","):
        row = make(key)
        if isinstance(row, str):
            print(f"{key}: skipped: {row}", flush=True)
            continue
        if a.reps:
            row.reps = a.reps
        ref = None
        for system, mode, layout, split in cells:
            if time.time() - started > a.budget_s:
                print(f"  {key} {system} {mode} {layout} {split}: not run (over the {a.budget_s:.0f} s budget)")
                continue
            try:
                r, got = run_cell(row, system, mode, layout, ref, split != "nosplit")
                ref = got if system == "eager" else ref
            except Exception as e:  # noqa: BLE001 - one cell failing must not end the run
                traceback.print_exc()
                r = dict(row=key, system=system, mode=mode, layout=layout, split=split, ms=float("nan"),
                         compile_s=float("nan"), err=float("nan"), grad_err=float("nan"),
                         notes=f"FAILED {type(e).__name__}: {str(e)[:150]}")
            results.append(r)
            print(f"  {key:18s} {system:13s} {mode:16s} {layout:13s} {split:7s} {r['ms']:8.2f} ms  "
                  f"compile {r['compile_s']:5.1f} s  err {r['err']:.1e}  grad {r['grad_err']:.1e}  "
                  f"{r['notes']}", flush=True)
            if a.device == "cuda":
                torch.cuda.empty_cache()
        del row
    print("\n" + table(results))
    print(f"\nwall {time.time() - started:.0f} s")
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.splitext(a.out)[0] + ".md", "w") as f:
            f.write(table(results) + "\n")


if __name__ == "__main__":
    main()
