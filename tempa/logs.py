"""Log channels, like torch's TORCH_LOGS: TEMPA_LOGS=graphs,guards,recompiles,breaks,code,perf.

Each channel is a standard ``logging`` logger named ``tempa.<channel>``; a channel named in
``tempa.config.logs`` (or TEMPA_LOGS) is switched on at INFO level with a plain handler.
"""
from __future__ import annotations

import logging
import sys

CHANNELS = ("graphs", "guards", "recompiles", "breaks", "code", "perf", "fallbacks")

_handler = None


def get(channel: str) -> logging.Logger:
    return logging.getLogger("tempa." + channel)


def enable(spec: str) -> None:
    """Switch on the comma-separated channels in ``spec`` ("all" switches on every one)."""
    global _handler
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if "all" in names:
        names = list(CHANNELS)
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("[tempa.%(channel)s] %(message)s"))
        _handler.addFilter(_add_channel)
    for name in names:
        logger = get(name)
        logger.setLevel(logging.INFO)
        if _handler not in logger.handlers:
            logger.addHandler(_handler)


def _add_channel(record: logging.LogRecord) -> bool:
    record.channel = record.name.split(".", 1)[-1]
    return True


def on(channel: str) -> bool:
    return get(channel).isEnabledFor(logging.INFO)
