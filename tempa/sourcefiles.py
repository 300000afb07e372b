"""Generated Python that tracebacks, ``pdb`` and ``inspect`` can show.

Code tempa generates (capture's entries, the backend's wrappers) is compiled under a file
name registered with ``linecache``, so a traceback through it prints its lines and a
debugger steps through them, as through the user's own code. Torch-free: capture and the
backend both use it.
"""
import hashlib
import linecache


def source_file(src: str, what: str) -> str:
    """A file name for generated Python ``src``, registered with linecache
    (``<tempa wrapper inference 1a2b3c4d5e>``; the hash keeps two sources apart). An entry
    without a modification time stays until the process ends (``linecache.checkcache``
    keeps it)."""
    name = f"<tempa {what} {hashlib.sha1(src.encode()).hexdigest()[:10]}>"
    linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    return name
