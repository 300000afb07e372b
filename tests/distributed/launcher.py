"""Run a scenario in 2 processes on the CPU (gloo), as DDP/FSDP2 training runs.

``run_in_processes(scenario)`` starts ``world`` processes with torch.multiprocessing (spawn),
each joining one gloo process group on a free local port, and calls ``scenario(rank,
world)``; an assertion failing in any process fails the test with that process's
traceback. A run past ``timeout`` seconds is killed and fails.
"""
from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

WORLD = 2


def require_gloo():
    import torch.distributed as dist
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, scenario):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)   # two processes on a two-core CI machine
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        scenario(rank, world)
    finally:
        dist.destroy_process_group()


def run_in_processes(scenario, world: int = WORLD, timeout: float = 120.0) -> None:
    require_gloo()
    context = mp.start_processes(_worker, args=(world, _free_port(), scenario), nprocs=world,
                                 join=False, start_method="spawn")
    try:
        import time
        deadline = time.monotonic() + timeout
        while not context.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                pytest.fail(f"distributed scenario {scenario.__name__} ran past {timeout} s")
    finally:
        for p in context.processes:
            if p.is_alive():
                p.kill()
