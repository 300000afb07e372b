"""``VariantTarget``: what ``entry.GraphVariants`` builds a graph's variants with.

A graph is compiled as up to two variants, chosen per call: inference (no autograd) and
training (forward + backward in one autograd node). The steps that make them are the same
for every target (trace to ATen, the layout policy, the joint graph and its partition,
``pipeline.plan_graph``'s passes); what differs is data and a few methods of one object,
declared here and implemented by three classes:

  CpuTarget          (this file)        C++ kernels at the example's sizes
  gpu.GpuTarget      (gpu/backend.py)   Triton kernels, CUDA graphs and autotuning by mode
  DynamicTarget      (dynamic.py)       either renderer, shape-generic: the variant traced at
                                        a grid of sizes and fitted into one template
                                        (GpuDynamicTarget, gpu/dynamic.py: its Triton hooks)

``GraphVariants`` calls only the methods below, never asks which class it holds, and a
target answers with what it does by data (``shape_generic``) where the steps differ.
"""
from __future__ import annotations

import torch

from ..configuration import config
from .. import logs
from .lower.layout import CONV_LAYOUTS


class VariantTarget:
    """The interface (and the defaults of a target at fixed sizes)."""
    name = "cpu"                 # the device kind its kernels run on
    # A shape-generic target traces more sizes itself: ``bind`` hands it the prepared graph,
    # it keeps per-build state (a copy is bound for each build), and it makes output views
    # per shape (``keep_output_views``)
    shape_generic = False

    def decomps(self) -> dict:
        """The decomposition table the ATen trace runs under."""
        raise NotImplementedError

    def compile_graph(self, gm, num_outputs: int, mutated: list, n_in: int, label: str):
        """A functional ATen graph (an inference variant) -> (call, CompiledGraphInfo)."""
        raise NotImplementedError

    def build_training(self, joint, n_in: int, single: bool):
        """A partitioned joint graph -> (autograd callable, forward info, backward info)."""
        raise NotImplementedError

    def conv_layout(self) -> str:
        """The convolution layout policy (one of CONV_LAYOUT_OPTIONS). Eager's by default:
        a shape-generic target has none (a conversion that is a no-op at one size is not at
        another)."""
        return "eager"

    def bind(self, pgm, examples, info) -> "VariantTarget":
        """The target for building ``pgm``'s variants from ``examples`` (a fixed-size one is
        itself)."""
        return self

    def keep_output_views(self, aliases, variant: str) -> None:
        """Outputs eager returns as views: a shape-generic target makes them per shape.
        Called only where ``shape_generic``."""
        raise NotImplementedError


class CpuTarget(VariantTarget):
    """C++ kernels (gcc) at the example's sizes; training through tempa's native autograd node.

    ``freezing`` (options={"freezing": True}): the inference variant's GEMMs may read the
    graph's parameters packed once (lower/matmul.py _packed_linear); ``params``: which inputs
    are parameters, once bound to a graph's examples. Training variants never pack: their
    weights change every step."""
    name = "cpu"

    def __init__(self, freezing: bool = False, params: frozenset = frozenset(), info=None):
        self.freezing = freezing
        self.params = params
        self.info = info                 # the graph's BackendInfo, once bound

    def bind(self, pgm, examples, info) -> "CpuTarget":
        if not self.freezing:
            return self
        return CpuTarget(True, frozenset(i for i, t in enumerate(examples)
                                         if isinstance(t, torch.nn.Parameter)), info)

    def decomps(self) -> dict:
        from .lower.decomps import table
        return table()

    def compile_graph(self, gm, num_outputs, mutated, n_in, label):
        from .compile_graph import compile_graph
        # a weight the graph itself writes would be packed again on every call
        pack = self.params - set(mutated)
        call, info = compile_graph(gm, num_outputs, mutated, n_in, label, pack_weights=pack)
        if self.freezing:
            _say_packed(self.info, info)
        return call, info

    def build_training(self, joint, n_in, single):
        from .autograd import build_training
        return build_training(joint, n_in, single, native_node=True, saved_layouts=True)

    def conv_layout(self) -> str:
        return conv_layout_option("cpu_conv_layout")


FREEZING_CONTRACT = "in-place changes through .data are not seen"


def _say_packed(backend_info, graph_info) -> None:
    """options={"freezing": True}: how many weights an inference graph packs, and the
    option's contract (runtime/packed_weights.py), in tempa_info.notes and on the perf log."""
    line = f"freezing: {len(graph_info.packed_weights)} weights packed; {FREEZING_CONTRACT}"
    if backend_info is not None:
        backend_info.notes.append(line)
    logs.get("perf").info("tempa backend: %s", line)


# The config values of a convolution layout policy: layout.CONV_LAYOUTS for every graph, or
# "inference": channels-last in inference graphs, eager's layouts in training ones. Why the
# GPU's default: on the H200 (bf16, torchvision ResNet-50 b32) channels-last took its
# inference from 3.06 to 1.99 ms a call in reduce-overhead, and its training step from 17.0
# to 38.0 ms (BatchNorm's statistics over channels-last activations become column
# reductions run on few Triton programs; benchmarks/gpu_layout_ab.py).
# "measured": in inference graphs, channels-last where its convolutions (with the
# conversions it adds) are timed faster at compile time (lower/layout_timing.py), else
# eager's layouts; training graphs keep eager's.
CONV_LAYOUT_OPTIONS = CONV_LAYOUTS + ("inference", "measured")
_warned: set = set()


def conv_layout_option(name: str) -> str:
    """The config option ``name`` (gpu_conv_layout, cpu_conv_layout): one of
    CONV_LAYOUT_OPTIONS; another value is said once and taken as "eager"."""
    value = getattr(config, name)
    if value in CONV_LAYOUT_OPTIONS:
        return value
    msg = f"tempa: config.{name}={value!r} is not one of {CONV_LAYOUT_OPTIONS}; using 'eager'"
    if msg not in _warned:
        _warned.add(msg)
        logs.warn(msg)
    return "eager"
