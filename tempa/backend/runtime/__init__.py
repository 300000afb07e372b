"""Runtime: building C++ with gcc (build.py) and the on-disk artifact cache (diskcache.py)."""
