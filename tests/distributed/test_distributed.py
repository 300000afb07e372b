"""DDP and FSDP2 with tempa-compiled models, 2 gloo processes on the CPU: gradients and
parameters after 3 optimizer steps equal eager DDP's / FSDP2's, and the compiled path ran
(kernels in each process, one graph per DDP bucket, no eager fallback, no recompile)."""
import pytest

from tests.distributed import scenarios
from tests.distributed.launcher import run_in_processes


@pytest.mark.parametrize("scenario", [
    scenarios.ddp_scenarios,    # bucket split, no_sync + gradient accumulation, options
    scenarios.fsdp_scenarios,   # whole model, per block, activation checkpointing
], ids=lambda s: s.__name__)
def test_distributed(scenario):
    run_in_processes(scenario)
