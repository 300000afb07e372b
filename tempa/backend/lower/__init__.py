"""Lowering: torch-level FX -> functional ATen FX (trace.py) -> loop IR (lowerings.py)."""
