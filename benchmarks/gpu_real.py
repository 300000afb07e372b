"""GPU benchmark beyond GPT (issue 19): HF decoders, encoders, ConvNets; eager vs
torch.compile vs tempa in each mode, one process, bf16 autocast.

    python benchmarks/gpu_real.py --out /path/results.json [--rows llama_prefill,...]
                                  [--budget-s 420] [--only tempa] [--reps N]

Rows (in this order; --rows picks and orders them):
  llama_prefill, qwen2_prefill, mistral_prefill   HF decoders (GQA, RoPE, RMSNorm, SwiGLU;
                                                  hf_models "larger": 16 layers, d=1024),
                                                  b4 T512, logits of a full forward
  llama_decode, qwen2_decode    decode steps (b4, one new token each, at positions 512, 513...)
                                on a StaticCache filled by an eager prefill of 512 tokens
  llama_generate                model.generate(16 new tokens, static cache, greedy) with the
                                forward compiled (generate(..., disable_compile=True)), ms per
                                generated token, tokens compared with eager's
  resnet50_tv, resnet50_tv_train  torchvision ResNet-50 b32 224x224 (when torchvision exists)
  bert, vit, t5, convnext, efficientnet   HF encoders and ConvNets (bert b8 T128, ViT-B/16
                                b16 224, T5-small b8 T512/128, ConvNeXt-T and EfficientNet-B0
                                b32 224), inference
  llama_train, bert_train, vit_train   a training step: forward, loss, backward, SGD

Each row runs eager, torch.compile (default, reduce-overhead) and tempa (default,
reduce-overhead); times are medians of CUDA-event timings after warm-up, "compile" the first
call's wall time (tempa's cache starts empty). Each cell's output is compared with eager's
(relative error of the first output, or of the loss): bf16, so about 1e-2 is expected; above
5e-2 the cell says MISMATCH. Each cell runs in try/except: a failure prints its traceback and
the run goes on. --budget-s: no cell starts once that many seconds have passed (default 420,
to stay under 8 minutes with the cell in flight). Without transformers the HF rows are
skipped with a message; without torchvision the ResNet-50 rows.

--device cpu --size quick --reps 2: a smoke test of this script on a machine without a GPU
(bf16 CPU autocast, hf_models' quick models and inputs, wall-clock medians); its figures
mean nothing.

--out PATH writes the results as JSON (after every cell, so a run cut short keeps what it
measured) and a Markdown table at PATH with the suffix .md.
"""
from __future__ import annotations

import argparse
import copy
import importlib.util
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
import torch.nn as nn  # noqa: E402

import hf_models  # noqa: E402
from gpu import median_ms  # noqa: E402

DEFAULT_ROWS = ("llama_prefill,llama_decode,resnet50_tv,resnet50_tv_train,bert,vit,llama_train,"
                "qwen2_prefill,llama_generate,t5,mistral_prefill,qwen2_decode,convnext,"
                "efficientnet,bert_train,vit_train")
SYSTEMS = (("eager", "default"), ("torch.compile", "default"), ("torch.compile", "reduce-overhead"),
           ("tempa", "default"), ("tempa", "reduce-overhead"))
PROMPT, NEW_TOKENS = 512, 16
DEVICE = "cuda"             # --device cpu: the smoke test
SIZE = "larger"             # hf_models' size; --size quick for the smoke test


def sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def median_call_ms(fn, warmup, reps):
    if DEVICE == "cuda":
        return median_ms(fn, warmup=warmup, reps=reps)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return sorted(times)[len(times) // 2]


class KwAutocast(nn.Module):
    """bf16 autocast inside forward (keyword inputs): the compilers capture the region."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, **kwargs):
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            return self.m(**kwargs)


class Kw(nn.Module):
    """Keyword inputs, no autocast: for a model whose weights are already bf16."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, **kwargs):
        return self.m(**kwargs)


# --- rows: what a cell calls ---------------------------------------------------------------
class Row:
    """A model and its inputs; ``cell(compile)`` returns (the call to time, first output)."""
    kind = "infer"
    reps = 30

    def __init__(self, key, title, model, kwargs):
        self.key, self.title, self.model, self.kwargs = key, title, model, kwargs

    def cell(self, compile_fn):
        model = copy.deepcopy(self.model)
        fn = compile_fn(KwAutocast(model))
        kwargs = self.kwargs

        def call():
            with torch.no_grad():
                return hf_models.first_tensor(fn(**kwargs))
        return call


class TrainRow(Row):
    kind = "train"
    reps = 15

    def cell(self, compile_fn):
        model = copy.deepcopy(self.model).train()
        fn = compile_fn(KwAutocast(model))
        opt = torch.optim.SGD(model.parameters(), lr=1e-4)
        kwargs = self.kwargs

        def step():
            loss = hf_models.loss_of(fn(**kwargs))
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss.detach()
        return step


class DecodeRow(Row):
    """Decode steps on a StaticCache that an eager prefill of PROMPT tokens filled, one new
    token per call, as generate() runs them: a StaticCache layer writes at its own running
    count (transformers 5: `cumulative_length`, whatever cache_position says), so every call
    writes the next slot and the cache holds room for every call the cell makes. The shapes,
    and so the work, are those of any step."""
    kind = "decode"
    reps = 100

    @property
    def calls(self):
        # run_cell's first call, warm-up and timed calls, and gpu_profile.py's 35 more
        return 1 + 5 + self.reps + 64

    def cell(self, compile_fn):
        from transformers import StaticCache
        # bf16 weights, no autocast: under autocast the cache (made in the weights' dtype)
        # and the new keys (bf16) differ, and index_copy_ refuses (eager too)
        model = copy.deepcopy(self.model).to(torch.bfloat16)
        ids = self.kwargs["input_ids"]
        cache = StaticCache(config=model.config, max_cache_len=ids.shape[1] + self.calls)
        with torch.no_grad():
            model(input_ids=ids, past_key_values=cache, use_cache=True,
                  cache_position=torch.arange(ids.shape[1], device=ids.device))
        fn = compile_fn(Kw(model))
        # the position advances in place after each step (one tiny kernel, in every system's
        # time alike): a CUDA graph copies it into its static input like any other tensor
        position = torch.tensor([ids.shape[1]], device=ids.device)
        step_kwargs = dict(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True,
                           cache_position=position)
        made = [0]

        def call():
            made[0] += 1
            if made[0] > self.calls:
                raise RuntimeError(f"DecodeRow: more than {self.calls} steps; the cache is full")
            with torch.no_grad():
                logits = fn(**step_kwargs).logits
            position.add_(1)
            return logits
        return call


class GenerateRow(Row):
    """model.generate with the forward compiled: HF's own loop, static cache, greedy."""
    kind = "generate"
    reps = 5

    def cell(self, compile_fn):
        model = copy.deepcopy(self.model).to(torch.bfloat16)   # as DecodeRow: no autocast
        model.forward = compile_fn(model.forward)
        ids = self.kwargs["input_ids"]

        def call():
            with torch.no_grad():
                # disable_compile: generate would otherwise torch.compile the forward itself
                return model.generate(ids, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                      do_sample=False, cache_implementation="static",
                                      disable_compile=True, pad_token_id=0)
        return call


def _hf(name, train=False, **inputs):
    """hf_models' model at SIZE, on DEVICE; at "quick" (the smoke test) with its own inputs."""
    if SIZE == "quick":
        inputs = {}
    return hf_models.build(name, SIZE, train, **inputs).to(DEVICE)


def make_row(key):
    """The row ``key``, or a string saying why it cannot run here."""
    hf_keys = {"llama", "qwen2", "mistral", "bert", "vit", "t5", "convnext", "efficientnet"}
    base = key.split("_")[0]
    if base in hf_keys and not hf_models.available():
        return "transformers is not installed"
    if key.startswith("resnet50_tv"):
        if importlib.util.find_spec("torchvision") is None:
            return "torchvision is not installed"
        import torchvision
        torch.manual_seed(0)
        m = torchvision.models.resnet50().to(DEVICE)
        b, side = (32, 224) if SIZE != "quick" else (1, 64)
        x = torch.randn(b, 3, side, side, device=DEVICE)
        if key.endswith("_train"):
            y = torch.randint(0, 1000, (b,), device=DEVICE)
            return TrainRow(key, "torchvision ResNet-50 b32 224 train step",
                            _ClassifierLoss(m), {"x": x, "y": y})
        return Row(key, "torchvision ResNet-50 b32 224", m.eval(), {"x": x})
    if key.endswith("_prefill"):
        c = _hf(base, batch=4, tokens=PROMPT)
        return Row(key, c.title + " prefill", c.model, c.kwargs)
    if key.endswith("_decode"):
        c = _hf(base, batch=4, tokens=PROMPT)
        return DecodeRow(key, c.title + " decode step (StaticCache)", c.model, c.kwargs)
    if key.endswith("_generate"):
        c = _hf(base, batch=1, tokens=64)
        return GenerateRow(key, c.title + f" generate {NEW_TOKENS} tokens, per token", c.model, c.kwargs)
    inputs = {"bert": dict(batch=8, tokens=128), "vit": dict(batch=16, image=224),
              "t5": dict(batch=8, tokens=512, dec_tokens=128), "convnext": dict(batch=32, image=224),
              "efficientnet": dict(batch=32, image=224), "llama": dict(batch=4, tokens=PROMPT)}
    if base not in inputs:
        return f"unknown row {key!r}"
    train = key.endswith("_train")
    c = _hf(base, train=train, **inputs[base])
    return (TrainRow if train else Row)(key, c.title + (" train step" if train else ""), c.model, c.kwargs)


class _ClassifierLoss(nn.Module):
    """torchvision's classifier with its cross-entropy, so the loss is in the graph."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.m(x), y)


# --- cells -----------------------------------------------------------------------------------
def compiler(system, mode):
    if system == "eager":
        return lambda m: m
    if system == "torch.compile":
        import importlib
        importlib.import_module("torch._dynamo").reset()
        return lambda m: torch.compile(m, mode=None if mode == "default" else mode)
    import tempa
    tempa.reset()
    return lambda m: tempa.compile(m, mode=None if mode == "default" else mode)


def _first(out):
    if hasattr(out, "sequences"):
        out = out.sequences
    return out.detach().clone() if isinstance(out, torch.Tensor) else hf_models.first_tensor(out).detach().clone()


def compare(out, ref, kind):
    """(error, note): token agreement for generate, else the relative error of the output."""
    if ref is None:
        return float("nan"), ""
    if kind == "generate":
        same = (out == ref).float().mean().item() if out.shape == ref.shape else 0.0
        return 1.0 - same, f"{same:.0%} of tokens as eager"
    a, b = out.float(), ref.float()
    err = ((a - b).norm() / (b.norm() + 1e-12)).item()
    return err, "MISMATCH" if err > 5e-2 else ""


def run_cell(row, system, mode):
    call = row.cell(compiler(system, mode))
    sync()
    t0 = time.perf_counter()
    out = _first(call())       # a copy: CUDA-graph outputs are overwritten by later calls
    sync()
    compile_s = time.perf_counter() - t0
    ms = median_call_ms(call, warmup=3 if row.kind == "generate" else 5, reps=row.reps)
    if row.kind == "generate":
        ms /= NEW_TOKENS
    notes = _tempa_notes() if system == "tempa" else ""
    return ms, compile_s, out, notes


def _tempa_notes():
    import tempa
    s = tempa.stats()
    return (f"{s.captures} captures, {s.graph_breaks} breaks, {s.graphs_compiled} graphs, "
            f"{s.kernels_compiled} kernels, {s.eager_fallbacks} eager fallbacks")


# --- output ----------------------------------------------------------------------------------
def markdown(results, skipped) -> str:
    lines = ["| row | system | mode | ms | vs eager | compile s | err | notes |",
             "|---|---|---|---|---|---|---|---|"]
    eager = {r["row"]: r["ms"] for r in results if r["system"] == "eager"}
    for r in results:
        e = eager.get(r["row"])
        speed = f"{e / r['ms']:.2f}x" if e and r["ms"] == r["ms"] and r["ms"] > 0 else "—"
        lines.append(f"| {r['title']} | {r['system']} | {r['mode']} | {r['ms']:.3f} | {speed} | "
                     f"{r['compile_s']:.1f} | {r['err']:.1e} | {r['notes']} |")
    if skipped:
        lines += ["", "Not run:"] + [f"- {k}: {why}" for k, why in skipped]
    return "\n".join(lines)


def write(path, results, skipped, started):
    if not path:
        return
    gpu = torch.cuda.get_device_name() if DEVICE == "cuda" else "CPU smoke test"
    meta = dict(torch=torch.__version__, gpu=gpu, date=time.strftime("%Y-%m-%d %H:%M"),
                wall_s=time.time() - started)
    with open(path, "w") as f:
        json.dump(dict(results=results, skipped=skipped, **meta), f, indent=1)
    with open(os.path.splitext(path)[0] + ".md", "w") as f:
        f.write(f"{meta['gpu']}, torch {meta['torch']}, {meta['date']}; bf16 autocast, median ms\n\n")
        f.write(markdown(results, skipped) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default=DEFAULT_ROWS)
    ap.add_argument("--out", default="", help="results JSON (and a .md table beside it)")
    ap.add_argument("--budget-s", type=float, default=420.0,
                    help="start no cell after this many seconds")
    ap.add_argument("--only", default="", help="'tempa': skip torch.compile")
    ap.add_argument("--reps", type=int, default=0, help="timed calls per cell (default: per row)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                    help="cpu: a smoke test of the script, figures meaningless")
    ap.add_argument("--size", choices=["quick", "default", "larger"], default="larger",
                    help="hf_models' size (quick: its small inputs too, for a smoke test)")
    a = ap.parse_args()
    started = time.time()
    global DEVICE, SIZE
    DEVICE, SIZE = a.device, a.size
    if DEVICE == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_real.py needs CUDA (or --device cpu for a smoke test)")
    os.environ.setdefault("TEMPA_CACHE_DIR", tempfile.mkdtemp(prefix="tempa-gpu-real-"))
    import tempa
    tempa.config.cache_dir = os.environ["TEMPA_CACHE_DIR"]
    warnings.filterwarnings("ignore")
    if hf_models.available():
        import transformers
        transformers.logging.set_verbosity_error()
    else:
        print("transformers is not installed: the HF rows are skipped", flush=True)
    results, skipped = [], []
    for key in a.rows.split(","):
        if time.time() - started > a.budget_s:
            skipped.append((key, f"over the {a.budget_s:.0f} s budget"))
            continue
        try:
            row = make_row(key)
        except Exception as e:  # noqa: BLE001 - a row that cannot be built is reported
            traceback.print_exc()
            row = f"building it failed: {type(e).__name__}: {str(e)[:150]}"
        if isinstance(row, str):
            print(f"{key}: skipped: {row}", flush=True)
            skipped.append((key, row))
            continue
        if a.reps:
            row.reps = a.reps
        ref = None
        for system, mode in SYSTEMS:
            if a.only == "tempa" and system == "torch.compile":
                continue
            if time.time() - started > a.budget_s:
                skipped.append((f"{key} {system} {mode}", f"over the {a.budget_s:.0f} s budget"))
                continue
            r = dict(row=key, title=row.title, system=system, mode=mode)
            try:
                ms, cs, out, notes = run_cell(row, system, mode)
                if system == "eager":
                    ref = out
                err, verdict = compare(out, ref, row.kind) if system != "eager" else (0.0, "")
                r.update(ms=ms, compile_s=cs, err=err, notes="; ".join(x for x in (verdict, notes) if x))
            except Exception as e:  # noqa: BLE001 - one cell failing must not end the run
                traceback.print_exc()
                r.update(ms=float("nan"), compile_s=float("nan"), err=float("nan"),
                         notes=f"FAILED {type(e).__name__}: {str(e)[:150]}")
            results.append(r)
            print(f"  {key:18s} {system:14s} {mode:16s} {r['ms']:9.3f} ms  compile {r['compile_s']:6.1f} s  "
                  f"err {r['err']:.1e}  {r['notes']}", flush=True)
            write(a.out, results, skipped, started)
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
        del row
    write(a.out, results, skipped, started)
    print("\n" + markdown(results, skipped))
    print(f"\nwall {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
