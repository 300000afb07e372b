"""DDP and FSDP2 training steps: eager vs tempa vs torch.compile, in N processes.

    python benchmarks/distributed.py                         # CPU, 2 gloo processes, residual MLP
    python benchmarks/distributed.py --backend nccl --nproc 8 --model gpt --autocast bf16
    python benchmarks/distributed.py --setups ddp,fsdp_block --json out.json

Each process builds the same model (same seed), wraps it (DDP; FSDP2 ``fully_shard`` on
every block then the root, compiled as a whole model or per block), and trains it with
SGD on its own batches: one first step (its time includes capture and compilation) and
``--steps`` timed steps (median; a barrier before each so the ranks start together). The
losses and final parameters of each compiler are compared with eager's on the same setup.
torch.compile is used here only, to measure against; tempa/ never uses it.

Rows: setup x compiler, with the step time median (ms), the ratio to eager, the first
step's time (s), and whether losses/parameters match eager (max relative difference).
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import socket
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402

SETUPS = ("ddp", "fsdp_whole", "fsdp_block")
COMPILERS = ("eager", "tempa", "torch.compile")


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.proj(torch.nn.functional.gelu(self.fc(self.norm(x))))


class ResidualMLP(nn.Module):
    """The CPU model: a stack of pre-norm MLP blocks (a transformer without attention)."""

    def __init__(self, dim, n_blocks):
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim) for _ in range(n_blocks))
        self.head = nn.Linear(dim, dim)

    def forward(self, x, target):
        for block in self.blocks:
            x = block(x)
        return torch.nn.functional.mse_loss(self.head(x), target)


class GPTLoss(nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.gpt = gpt

    def forward(self, idx, targets):
        _, loss = self.gpt(idx, targets)
        return loss


def build(args):
    torch.manual_seed(0)
    if args.model == "gpt":
        from tests.models.gpt import GPT, gpt124m_config, small_config
        cfg = gpt124m_config(n_layer=args.layers) if args.size == "124m" else \
            small_config(n_layer=args.layers, n_embd=args.dim, block_size=args.seq)
        model = GPTLoss(GPT(cfg))
        blocks = model.gpt.transformer.h
    else:
        model = ResidualMLP(args.dim, args.layers)
        blocks = model.blocks
    return model, blocks


def batches(args, rank, device, n):
    g = torch.Generator().manual_seed(1000 + rank)
    out = []
    for _ in range(n):
        if args.model == "gpt":
            vocab = 50304 if args.size == "124m" else 128
            seq = 1024 if args.size == "124m" else args.seq
            idx = torch.randint(0, vocab, (args.batch, seq + 1), generator=g)
            out.append((idx[:, :-1].to(device), idx[:, 1:].to(device)))
        else:
            x = torch.randn(args.batch, args.dim, generator=g)
            out.append((x.to(device), torch.randn(args.batch, args.dim, generator=g).to(device)))
    return out


def wrap(setup, compiler, args, device):
    """The model of ``setup`` compiled by ``compiler``; returns (callable, module with params)."""
    import tempa
    model, blocks = build(args)
    model.to(device)
    compile_fn = {"eager": None, "tempa": tempa.compile, "torch.compile": torch.compile}[compiler]
    if setup == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                  bucket_cap_mb=args.bucket_cap_mb)
        return (compile_fn(ddp) if compile_fn else ddp), ddp
    from torch.distributed.fsdp import fully_shard
    for i, block in enumerate(blocks):
        fully_shard(block)
        if setup == "fsdp_block" and compile_fn:
            if compiler == "torch.compile":
                block.compile()
            else:
                blocks[i] = tempa.compile(block)
    fully_shard(model)
    if setup == "fsdp_whole" and compile_fn:
        return compile_fn(model), model
    return model, model


def _full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def run_one(setup, compiler, args, rank, device):
    import tempa
    tempa.reset()
    torch._dynamo.reset()
    fn, owner = wrap(setup, compiler, args, device)
    opt = torch.optim.SGD(owner.parameters(), lr=1e-3, momentum=0.9)
    data = batches(args, rank, device, args.steps + 1)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.autocast == "bf16")
    losses, times = [], []
    for step, (x, y) in enumerate(data):
        dist.barrier()
        _sync(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with autocast:
            loss = fn(x, y)
        loss.backward()
        opt.step()
        _sync(device)
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    params = torch.cat([_full(p.detach()).float().flatten() for p in owner.parameters()]).cpu()
    stats = tempa.stats()
    return dict(first_s=times[0], step_ms=statistics.median(times[1:]) * 1e3, losses=losses,
                params=params, kernels=stats.kernels_compiled, captures=stats.captures,
                recompiles=stats.recompiles, fallbacks=stats.eager_fallbacks,
                graphs=stats.graphs_compiled)


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def worker(rank, world, port, args, out_path):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if args.backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        torch.set_num_threads(args.threads)
        device = torch.device("cpu")
    dist.init_process_group(args.backend, rank=rank, world_size=world)
    rows = []
    try:
        for setup in args.setups.split(","):
            results = {c: run_one(setup, c, args, rank, device) for c in args.compilers.split(",")}
            eager = results.get("eager")
            for compiler, r in results.items():
                row = dict(setup=setup, compiler=compiler, step_ms=r["step_ms"],
                           first_s=r["first_s"], kernels=r["kernels"], captures=r["captures"],
                           recompiles=r["recompiles"], fallbacks=r["fallbacks"],
                           graphs=r["graphs"], losses=r["losses"])
                if eager is not None:
                    row["vs_eager"] = eager["step_ms"] / r["step_ms"]
                    row["loss_diff"] = max(abs(a - b) / max(abs(a), 1e-12)
                                           for a, b in zip(r["losses"], eager["losses"]))
                    row["param_diff"] = ((r["params"] - eager["params"]).abs().max() /
                                         eager["params"].abs().max()).item()
                rows.append(row)
    finally:
        dist.destroy_process_group()
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(rows, f)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    p.add_argument("--nproc", type=int, default=None, help="processes (default 2; nccl: GPUs)")
    p.add_argument("--model", default=None, choices=("mlp", "gpt"), help="default mlp (gloo), gpt (nccl)")
    p.add_argument("--size", default=None, choices=("small", "124m"), help="gpt size (default: 124m on nccl)")
    p.add_argument("--layers", type=int, default=None)
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--autocast", default="off", choices=("off", "bf16"))
    p.add_argument("--steps", type=int, default=10, help="timed steps after the first")
    p.add_argument("--bucket-cap-mb", type=float, default=None,
                   help="DDP bucket size (default: DDP's 25 MB; the CPU model uses 1 MB)")
    p.add_argument("--setups", default=",".join(SETUPS))
    p.add_argument("--compilers", default=",".join(COMPILERS))
    p.add_argument("--threads", type=int, default=1, help="CPU threads per process (gloo)")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    gpu = args.backend == "nccl"
    args.nproc = args.nproc or (torch.cuda.device_count() if gpu else 2)
    args.model = args.model or ("gpt" if gpu else "mlp")
    args.size = args.size or ("124m" if gpu else "small")
    args.layers = args.layers or (12 if args.model == "gpt" and args.size == "124m" else 4)
    args.batch = args.batch or (8 if args.model == "gpt" and args.size == "124m" else 64)
    if args.bucket_cap_mb is None:
        args.bucket_cap_mb = 25.0 if gpu else 1.0

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out_path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tempa-dist-bench-{os.getpid()}.json")
    mp.spawn(worker, args=(args.nproc, port, args, out_path), nprocs=args.nproc)
    with open(out_path) as f:
        rows = json.load(f)
    os.unlink(out_path)
    print(f"{args.backend}, {args.nproc} processes, model {args.model} ({args.size}, {args.layers} "
          f"layers, batch {args.batch}), autocast {args.autocast}, {args.steps} timed steps")
    print(f"{'setup':11} {'compiler':14} {'step ms':>9} {'vs eager':>8} {'first s':>8} "
          f"{'kernels':>7} {'graphs':>6} {'recomp':>6} {'loss diff':>9} {'param diff':>10}")
    for r in rows:
        print(f"{r['setup']:11} {r['compiler']:14} {r['step_ms']:9.2f} {r.get('vs_eager', 1):8.2f} "
              f"{r['first_s']:8.2f} {r['kernels']:7d} {r['graphs']:6d} {r['recompiles']:6d} "
              f"{r.get('loss_diff', 0):9.1e} {r.get('param_diff', 0):10.1e}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(args=vars(args), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
