"""How a ``Frame``'s run loop is left other than by returning.

The interpreted code's own exception that its frame does not handle travels as
``_PyException`` (so that one that is not an ``Exception``, ``GeneratorExit`` raised by the
code, still reaches the code's handlers while a real Ctrl-C during capture does not); a
generator's ``yield`` stops its frame with ``_Suspend``; ``_MAX_INSTRUCTIONS`` ends an
endless loop. Raised by the opcode handlers and caught by the run loop
(``interpreter.py``), by ``GeneratorRun`` and by ``capture.py``.
"""
from __future__ import annotations

_MAX_INSTRUCTIONS = 5_000_000


class _PyException(Exception):
    """A Python exception raised by the interpreted code and not handled in its frame."""

    def __init__(self, exc: BaseException):
        super().__init__(repr(exc))
        self.exc = exc


class _Suspend(Exception):
    """YIELD_VALUE of a generator run step by step: the frame stops, resumable."""
