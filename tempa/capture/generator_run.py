"""A generator made in captured code, run one ``yield`` at a time (``GeneratorRun``).

Its ``Frame`` stops at each ``yield`` (``frame_exits._Suspend``) and resumes where it
stopped, so the generator's code and its consumer's interleave as in eager. Made by
``calls_inline.py`` (a call of a generator function, ``@contextmanager``'s generator).
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .frame_exits import _PyException

if TYPE_CHECKING:
    from .interpreter import Frame


class GeneratorRun:
    """A generator made in captured code: its frame run one step at a time, as CPython
    runs a generator, so its code and its consumer's interleave as in eager (a generator
    reading a list its consumer appends to sees each append). ``send`` resumes it at its
    ``yield`` (the value sent is the yield's result), ``throw`` raises an exception there
    (``@contextmanager``'s exit). Exceptions come out as Python's would (``StopIteration``
    at the end). Its items are never taken early: one alive when the capture ends is
    refused (``values.has_pending_calls``)."""
    runs_code = True

    def __init__(self, frame: "Frame"):
        self.frame = frame
        self.next_index = 0        # where to continue; None once finished
        self.started = False

    def __iter__(self):
        return self

    def __next__(self):
        return self.send(None)

    def send(self, value):
        frame = self.frame
        if self.next_index is None:
            raise StopIteration
        if self.started:
            frame.push(value)
        elif value is not None:
            raise TypeError("can't send non-None value to a just-started generator")
        self.started = True
        return self._continue(self.next_index)

    def throw(self, exc: BaseException):
        if self.next_index is None or not self.started:
            self.next_index = None
            raise exc
        frame = self.frame
        try:
            index = frame._raise(exc, frame.current)   # raised at the suspended yield
        except _PyException:
            index = None
        if index is None:   # not handled in the generator: it comes back out, unchanged
            self.next_index = None
            raise exc
        return self._continue(index)

    def close(self):
        if self.next_index is not None and self.started:
            try:
                self.throw(GeneratorExit())
            except (GeneratorExit, StopIteration):
                return
            raise RuntimeError("generator ignored GeneratorExit")
        self.next_index = None

    def _continue(self, index: int):
        frame = self.frame
        failure = None
        frame.tracer.depth += 1   # (a generator that makes generators: recursion's limit)
        try:
            frame.run(index)
        except _PyException as e:
            failure = e.exc
        finally:
            frame.tracer.depth -= 1
        if failure is not None:   # raised here, outside the except: no added __context__
            self.next_index = None
            if isinstance(failure, StopIteration):   # PEP 479 (3.12+ does it in bytecode)
                raise RuntimeError("generator raised StopIteration") from failure
            raise failure
        if frame.done:
            self.next_index = None
            raise StopIteration(frame.result)
        self.next_index = frame.current.index + 1
        return frame.suspended_value
