"""Every tempa option in one place: its default, its TEMPA_* environment override, and why.

Read an option as ``tempa.config.recompile_limit``; set it in code with
``tempa.config.recompile_limit = 4`` or from the shell with ``TEMPA_RECOMPILE_LIMIT=4``.
"""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field, fields


def _default_cache_dir() -> str:
    # Per-user, never a shared world-writable path: a cache entry is code we load and run.
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tempa")


@dataclass
class Config:
    # How many cache entries one code object may build before tempa stops capturing it and
    # runs it eagerly (torch.compile's limit is 8 too).
    recompile_limit: int = 8
    # Where compiled artifacts (C++ shared objects, Triton kernels, autotune results) live.
    cache_dir: str = field(default_factory=_default_cache_dir)
    # Use the on-disk cache at all (off: every process compiles from scratch).
    disk_cache: bool = True
    # Comma-separated log channels: graphs,guards,recompiles,breaks,code,perf (like TORCH_LOGS).
    logs: str = ""
    # Raise instead of falling back to eager when capture or compilation fails (for debugging).
    raise_on_failure: bool = False
    # Verbose errors: keep tempa's internal frames in tracebacks.
    debug: bool = False
    # gcc executable for the CPU backend.
    cxx: str = "g++"
    # Call generated C++ through tempa's small CPython extension (built once with gcc and the
    # Python headers) instead of ctypes: ~1 µs less per segment call. Off: always ctypes.
    fast_calls: bool = True
    # Check an entry's tensor guards in one call into tempa's small C++ extension (built once
    # with g++ and c10's headers) instead of one Python attribute read per field: ~0.7 µs less
    # per tensor per call. Off (or where it cannot be built): the same guards in Python.
    fast_guards: bool = True
    # Give a compiled training graph's outputs their history through tempa's native autograd
    # node (a C++ extension over torch's autograd headers, built once in the background,
    # ~15-30 s) instead of an autograd.Function: ~3-4 µs less per grad-mode call. Off (or
    # until it is built, or where it cannot be): autograd.Function, the same answers.
    native_autograd: bool = True
    # Automatic dynamic shapes: after a size changes once, recapture with that dim symbolic.
    automatic_dynamic_shapes: bool = True
    # Capture at all. Off (TEMPA_CAPTURE=0): every call of compiled code runs eagerly and no
    # counter moves, as if tempa were absent. `make test-capture-off` runs the capture tests
    # so: a test that still passes then checks nothing about capture.
    capture: bool = True
    # Time each compiled function (a function, a forward, a resume function after a graph
    # break; read when it is compiled) against eager once, on its live inputs: its first
    # calls alternate between the two as under stance "auto" (tempa/stance.py). A function
    # measured slower than eager is named on the fallbacks log channel, in
    # tempa.stance_decisions() and by `tempa explain`; it keeps running its compiled code
    # (stance "auto" switches it to eager). Off by default: the trial's eager calls change
    # which path runs for a few calls, which tests and profiles of the compiled code see.
    measure_against_eager: bool = False
    # The layout 4-D convolutions run in on CUDA: "channels_last" (NHWC, what cuDNN's bf16
    # tensor-core kernels want; the ops between convolutions follow), "eager" (the layouts
    # eager gives them) or "inference" (channels-last in inference graphs only: measured
    # faster there and slower in training, backend/variant_target.py CONV_LAYOUT_OPTIONS). What the
    # caller sees keeps eager's layouts either way (lower/layout.py CONV_LAYOUTS).
    # TEMPA_GPU_CONV_LAYOUT=eager for an A/B measurement.
    gpu_conv_layout: str = "inference"
    # The same choice for the C++ backend, default "measured": an inference graph runs its
    # convolutions channels-last where they (with the conversions that adds) are timed
    # faster at compile time, else in eager's layouts (lower/layout_timing.py: oneDNN's
    # depthwise convolutions are several times faster NHWC; MobileNetV2 b2 128x128 went from
    # 1.5x to 1.9x eager). Training graphs keep eager's layouts. Each CPU convolution site
    # also times contiguous against its traced layout (lower/matmul.py).
    # TEMPA_CPU_CONV_LAYOUT=eager for an A/B measurement.
    cpu_conv_layout: str = "measured"
    # GPU reductions with few results over many values (BatchNorm's statistics, a bias
    # gradient, a sum over everything) split in two kernels, so they fill the GPU's SMs
    # (lower/reductions.py split_plan). TEMPA_GPU_SPLIT_REDUCTIONS=0 for an A/B measurement.
    gpu_split_reductions: bool = True


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off", "")


def _coerce(value: str, like):
    """The environment string as the option's type; ValueError when it is not one."""
    if isinstance(like, bool):
        word = value.strip().lower()
        if word not in _TRUE + _FALSE:
            raise ValueError(f"expected one of {', '.join(_TRUE + _FALSE[:-1])}")
        return word in _TRUE
    if isinstance(like, int):
        try:
            return int(value)
        except ValueError:
            raise ValueError("expected an integer") from None
    return value


def _from_environment() -> Config:
    cfg = Config()
    for f in fields(cfg):
        name = "TEMPA_" + f.name.upper()
        env = os.environ.get(name)
        if env is None:
            continue
        try:
            setattr(cfg, f.name, _coerce(env, getattr(cfg, f.name)))
        except ValueError as e:
            # Importing tempa must not fail over a typo in the shell; say which variable.
            warnings.warn(f"{name}={env!r} ignored ({e}); using the default "
                          f"{getattr(cfg, f.name)!r}", stacklevel=2)
    return cfg


config = _from_environment()
