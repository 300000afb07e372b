"""Small helpers the case files share."""
import torch

from .harness import Case, State

_GEN = torch.Generator().manual_seed(1234)


def rnd(*shape, dtype=torch.float32, requires_grad=False):
    """A reproducible random tensor (a private generator: importing the cases does not
    touch torch's global RNG)."""
    t = torch.randn(*shape, generator=_GEN).to(dtype)
    return t.requires_grad_(requires_grad)


def fn_case(case_id, fn, *steps, **options) -> Case:
    """A case for a pure function: the state is just the function."""
    return Case(case_id, lambda: State(fn=fn), list(steps), **options)


def module_case(case_id, make, *steps, **options) -> Case:
    """A case for a module built by make() (under the case's seed)."""
    return Case(case_id, lambda: State(fn=make()), list(steps), **options)
