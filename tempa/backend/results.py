"""What a compiled graph's call returns beyond its values, as eager returns it: the version
counters of the inputs it wrote bumped (``GraphVariants._version_bumps`` counts them), and
an output that eager returns as an input itself being that input. Generated per graph as
one small function, with no per-call loops."""
from __future__ import annotations

import torch

from ..sourcefiles import source_file


def bumping_versions(call, bumps: tuple):
    """``call`` bumping the version counter of its argument ``j`` once per ``j`` in
    ``bumps`` (``GraphVariants._version_bumps``), after the graph wrote them."""
    if not bumps:
        return call
    # generated: the bumped arguments as one tuple display (a generator over ``bumps`` cost
    # ~0.4 µs a call, a tenth of a small training step's compiled forward)
    return with_eager_results(call, bumps, {}, 0)


def with_eager_results(call, mutated: tuple, same: dict, n_outputs: int):
    """``call`` bumping the version counters of the inputs it wrote (``mutated``: an input
    index per bump) and returning, at output ``i`` of ``same``, input ``same[i]`` itself.
    Generated per graph: the result is one tuple display (``(args[0], outs[1])``), not a
    list rebuilt item by item on every call (~0.15 µs of a small model's call)."""
    lines = ["def with_eager_results(*args):", "    outs = call(*args)"]
    if mutated:
        # (one bump per item, an input repeated per write; a tensor itself would be bumped
        # per element)
        lines.append(f"    bump(({''.join(f'args[{j}], ' for j in mutated)}))")
    if same:
        items = "".join(f"args[{same[i]}], " if i in same else f"outs[{i}], " for i in range(n_outputs))
        # (outputs past the user's, if a target returns any, pass through)
        lines.append(f"    return ({items}) + outs[{n_outputs}:]")
    else:
        lines.append("    return outs")
    ns = {"call": call, "bump": torch._C._increment_version}
    src = "\n".join(lines) + "\n"
    exec(compile(src, source_file(src, "eager results"), "exec"), ns)
    return ns["with_eager_results"]
