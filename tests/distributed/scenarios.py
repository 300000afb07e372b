"""What each process of a distributed test runs (top-level functions: spawn pickles them
by name). Each scenario trains an eager copy and a tempa-compiled copy of one model side by
side for 3 optimizer steps on the same data and compares gradients and parameters, then
checks which path ran in this process."""
from __future__ import annotations

import copy

import torch
import torch.nn as nn

STEPS = 3
TOL = dict(rtol=1e-5, atol=1e-6)


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 2 * dim)
        self.proj = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.proj(torch.nn.functional.gelu(self.fc(self.norm(x))))


class Net(nn.Module):
    """A small residual MLP: an input layer, blocks in a loop (as a GPT's), a head."""

    def __init__(self, dim=32, n_blocks=3, checkpoint=False):
        super().__init__()
        self.inp = nn.Linear(16, dim)
        self.blocks = nn.ModuleList(Block(dim) for _ in range(n_blocks))
        self.head = nn.Linear(dim, 4)
        self.checkpoint = checkpoint

    def forward(self, x):
        h = self.inp(x)
        for block in self.blocks:
            if self.checkpoint:
                h = torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False)
            else:
                h = block(h)
        return self.head(h)


def batches(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g))
            for _ in range(STEPS)]


def train(model, data, micro_steps=1, no_sync=None):
    """3 SGD steps; with ``micro_steps`` > 1, gradients accumulate over micro-batches (the
    first ones under ``no_sync`` when given). Returns each step's gradients."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    grads = []
    for x, y in data:
        opt.zero_grad()
        # (clones: a chunk's storage offset is guarded, and a second offset would recompile)
        chunks = [(a.clone(), b) for a, b in zip(x.chunk(micro_steps), y.chunk(micro_steps))]
        for i, chunk in enumerate(chunks):
            last = i == micro_steps - 1
            ctx = no_sync() if (no_sync is not None and not last) else _nothing()
            with ctx:
                loss = torch.nn.functional.mse_loss(model(chunk[0]), chunk[1])
                loss.backward()
        grads.append([_full(p.grad).clone() for p in model.parameters()])
        opt.step()
    return grads


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _full(t):
    """A DTensor's whole value (FSDP2 parameters and gradients are sharded)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def assert_same_training(eager_grads, compiled_grads, eager_model, compiled_model):
    for step, (ge, gc) in enumerate(zip(eager_grads, compiled_grads)):
        for i, (a, b) in enumerate(zip(ge, gc)):
            torch.testing.assert_close(b, a, **TOL, msg=lambda m: f"step {step} grad {i}: {m}")
    for (name, a), b in zip(eager_model.named_parameters(), compiled_model.parameters()):
        torch.testing.assert_close(_full(b), _full(a), **TOL, msg=lambda m: f"{name}: {m}")


def assert_compiled(stats, min_captures=1):
    assert stats.kernels_compiled > 0, stats
    assert stats.eager_fallbacks == 0, stats
    assert stats.captures >= min_captures, stats


# -- DDP ---------------------------------------------------------------------------------------

def _ddp_pair(bucket_cap_mb, **options):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    base = Net()
    eager = DDP(copy.deepcopy(base), bucket_cap_mb=bucket_cap_mb, **options)
    compiled_ddp = DDP(copy.deepcopy(base), bucket_cap_mb=bucket_cap_mb, **options)
    return eager, compiled_ddp


def ddp_buckets(rank, world):
    import tempa
    from tempa.distributed import bucket_caps
    eager, ddp = _ddp_pair(bucket_cap_mb=0.01)   # ~10 kB: the 23 kB of parameters in 3 buckets
    fast = tempa.compile(ddp)
    data = batches(rank)
    eager_grads = train(eager, data)
    compiled_grads = train(fast, data)
    assert_same_training(eager_grads, compiled_grads, eager, ddp)
    # Gradients are averaged across ranks: both ranks hold the same parameters.
    flat = torch.cat([p.detach().flatten() for p in ddp.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    torch.distributed.all_gather(gathered, flat)
    torch.testing.assert_close(gathered[0], gathered[1])

    stats = tempa.stats()
    assert_compiled(stats)
    assert stats.recompiles == 0 and stats.graph_breaks == 0, stats
    (entry,) = tempa.entries(fast)
    pieces = entry.compiled.ddp_pieces
    expected = _reducer_bucket_count(ddp)
    assert len(pieces) == expected > 1, (len(pieces), expected, bucket_caps(ddp))
    assert all(p.tempa_info is not None and p.tempa_info.kernel_count > 0 for p in pieces)


def _reducer_bucket_count(ddp) -> int:
    """How many buckets DDP's reducer uses once rebuilt after the first step."""
    sizes = ddp._get_ddp_logging_data().get("rebuilt_bucket_sizes")
    return len(str(sizes).split(","))


def ddp_no_sync_accumulation(rank, world):
    import tempa
    eager, ddp = _ddp_pair(bucket_cap_mb=0.01)
    fast = tempa.compile(ddp)
    data = batches(rank)
    eager_grads = train(eager, data, micro_steps=2, no_sync=eager.no_sync)
    compiled_grads = train(fast, data, micro_steps=2, no_sync=fast.no_sync)
    assert_same_training(eager_grads, compiled_grads, eager, ddp)
    stats = tempa.stats()
    assert_compiled(stats)
    # micro-batches of 4 rows after the full batch of 8 would be a second shape; all calls
    # here use batch 4, so one capture serves the no_sync and the syncing calls alike.
    assert stats.recompiles == 0, stats


def ddp_options(rank, world):
    """DDP's other reducer modes: its forward runs them eagerly around the compiled pieces."""
    import tempa
    for options in (dict(static_graph=True), dict(find_unused_parameters=True),
                    dict(gradient_as_bucket_view=True)):
        tempa.reset()
        eager, ddp = _ddp_pair(bucket_cap_mb=0.01, **options)
        fast = tempa.compile(ddp)
        data = batches(rank)
        assert_same_training(train(eager, data), train(fast, data), eager, ddp)
        assert_compiled(tempa.stats())
        assert len(tempa.entries(fast)[0].compiled.ddp_pieces) > 1, options


# -- FSDP2 -------------------------------------------------------------------------------------

def _fsdp_pair(checkpoint=False):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    base = Net(checkpoint=checkpoint)
    # A CPU mesh named explicitly: fully_shard's default mesh is CUDA's where a GPU exists,
    # and these gloo tests keep the model on the CPU.
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    models = []
    for _ in range(2):
        m = copy.deepcopy(base)
        for block in m.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(m, mesh=mesh)
        models.append(m)
    return models


def fsdp_whole_model(rank, world):
    import tempa
    eager, model = _fsdp_pair()
    fast = tempa.compile(model)
    data = batches(rank)
    eager_grads = train(eager, data)
    after_first = None
    compiled_grads = []
    for step in range(STEPS):
        compiled_grads += train_one(fast, data[step], model)
        if step == 0:
            after_first = tempa.stats()
    _check_fsdp_params(eager, model, eager_grads, compiled_grads)
    stats = tempa.stats()
    assert_compiled(stats, min_captures=1 + len(model.blocks))
    names = [e.function for e in tempa.entries(fast)]
    assert names.count("Block.forward") == len(model.blocks), names
    # FSDP2 swaps unsharded parameters in and out every step: no step recompiles.
    assert stats.captures == after_first.captures and stats.recompiles == 0, (after_first, stats)


_optimizers = {}


def train_one(model, batch, owner):
    """One SGD step on ``model`` (the optimizer kept per owner), returning its gradients."""
    opt = _optimizers.get(id(owner))
    if opt is None:
        opt = _optimizers[id(owner)] = torch.optim.SGD(owner.parameters(), lr=0.1, momentum=0.9)
    x, y = batch
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    grads = [_full(p.grad).clone() for p in owner.parameters()]
    opt.step()
    return [grads]


def _check_fsdp_params(eager, model, eager_grads, compiled_grads):
    assert_same_training(eager_grads, compiled_grads, eager, model)


def fsdp_per_block(rank, world):
    import tempa
    eager, model = _fsdp_pair()
    for i, block in enumerate(model.blocks):
        model.blocks[i] = tempa.compile(block)
    data = batches(rank)
    eager_grads = train(eager, data)
    compiled_grads = train(model, data)
    _check_fsdp_params(eager, model, eager_grads, compiled_grads)
    stats = tempa.stats()
    assert_compiled(stats, min_captures=len(model.blocks))
    assert stats.captures == len(model.blocks) and stats.recompiles == 0, stats


def fsdp_activation_checkpointing(rank, world):
    import tempa
    eager, model = _fsdp_pair(checkpoint=True)
    fast = tempa.compile(model)
    data = batches(rank)
    eager_grads = train(eager, data)
    compiled_grads = train(fast, data)
    _check_fsdp_params(eager, model, eager_grads, compiled_grads)
    # The blocks run compiled inside checkpoint (forward and recomputation alike);
    # torch.utils.checkpoint's own Python runs eagerly, and tempa says so.
    stats = tempa.stats()
    assert stats.kernels_compiled > 0 and stats.recompiles == 0, stats
    assert stats.captures >= 1 + len(model.blocks), stats
    names = [e.function for e in tempa.entries(fast)]
    assert names.count("Block.forward") == len(model.blocks), names
    assert not any("Block.forward" in r for r in tempa.eager_reasons(fast))


# -- groups: one pair of processes runs several scenarios (a spawn costs seconds) -------------

def run_all(scenarios, rank, world):
    import tempa
    for scenario in scenarios:
        tempa.reset()
        _optimizers.clear()
        scenario(rank, world)


def ddp_scenarios(rank, world):
    run_all([ddp_buckets, ddp_no_sync_accumulation, ddp_options], rank, world)


def fsdp_scenarios(rank, world):
    run_all([fsdp_whole_model, fsdp_per_block, fsdp_activation_checkpointing], rank, world)
