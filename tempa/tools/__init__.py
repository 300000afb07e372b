"""The measurement and inspection logic behind the `tempa` command line (tempa/cli.py).

    load.py      the FILE.py / module:attr convention: find the model and its example inputs
    bench.py     eager vs compiled timing, first-call cost cold and warm, break-even, verdict
    firstcall.py the subprocess that times one first call (cold or warm disk cache)
    explain.py   graphs, breaks with source lines, guards, recompiles, fallbacks, kernels
    cache.py     the on-disk cache: where, how big, how many entries; clear it

These modules use tempa's public API only (tempa.compile, stats, reset, explain, entries),
reading a few documented internals as a fallback where a public accessor is still missing.
"""
