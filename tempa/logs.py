"""Log channels, like torch's TORCH_LOGS: TEMPA_LOGS=graphs,guards,recompiles,breaks,code,perf.

Each channel is a standard ``logging`` logger named ``tempa.<channel>``; a channel named in
``tempa.config.logs`` (or TEMPA_LOGS) is switched on at INFO level with a plain handler.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings

CHANNELS = ("graphs", "guards", "recompiles", "breaks", "code", "perf", "fallbacks")

_handler = None


def get(channel: str) -> logging.Logger:
    return logging.getLogger("tempa." + channel)


def parse(spec: str) -> dict[str, int]:
    """``"graphs,+guards"`` -> {channel: level}. ``+name`` is verbose (DEBUG), as in
    TORCH_LOGS; ``all`` is every channel. An unknown name is an error that lists the valid
    ones: a typo (``grpahs``) silently logging nothing is what the user would least expect."""
    levels: dict[str, int] = {}
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        verbose = item.startswith("+")
        name = item.lstrip("+")
        level = logging.DEBUG if verbose else logging.INFO
        if name == "all":
            levels.update((c, level) for c in CHANNELS)
        elif name in CHANNELS:
            levels[name] = level
        else:
            raise ValueError(f"TEMPA_LOGS: unknown log channel {name!r}; the channels are "
                             f"{', '.join(CHANNELS)} (or all; +name for verbose)")
    return levels


def enable(spec: str) -> None:
    """Switch on the comma-separated channels in ``spec`` (see ``parse``)."""
    global _handler
    levels = parse(spec)
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("[tempa.%(channel)s] %(message)s"))
        _handler.addFilter(_add_channel)
    for name, level in levels.items():
        logger = get(name)
        logger.setLevel(level)
        if _handler not in logger.handlers:
            logger.addHandler(_handler)


def _add_channel(record: logging.LogRecord) -> bool:
    record.channel = record.name.split(".", 1)[-1]
    return True


def on(channel: str) -> bool:
    return get(channel).isEnabledFor(logging.INFO)



_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# the user's frame of the call being compiled: compile workers run in threads of their
# own, whose stacks do not reach the user's code
_compiling_for = None


def user_frame():
    """The innermost frame outside tempa, its generated entries (``<tempa entry ...>``),
    FX code and torch (whose ``Module.__call__`` sits between the user and tempa)."""
    torch = sys.modules.get("torch")
    skipped = (_PACKAGE_DIR, "<tempa", "<eval_with_key") + \
        ((os.path.dirname(torch.__file__) + os.sep,) if torch else ())
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(skipped):
        frame = frame.f_back
    return frame


@contextlib.contextmanager
def compiling_for(frame):
    """Warnings raised while compiling (in any thread) point at ``frame``."""
    global _compiling_for
    outer, _compiling_for = _compiling_for, frame
    try:
        yield
    finally:
        _compiling_for = outer


def warn(message: str, category=RuntimeWarning) -> None:
    """``warnings.warn`` attributed to the user's line (``stacklevel`` cannot say it: the
    depth from tempa's code to the user's differs per path, and per thread)."""
    frame = _compiling_for or user_frame()
    if frame is None:
        warnings.warn(message, category, stacklevel=2)
        return
    g = frame.f_globals
    warnings.warn_explicit(message, category, frame.f_code.co_filename, frame.f_lineno,
                           module=g.get("__name__", "<unknown>"),
                           registry=g.setdefault("__warningregistry__", {}))
