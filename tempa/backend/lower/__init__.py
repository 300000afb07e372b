"""Lowering: torch-level FX -> functional ATen FX (trace.py; joint.py for training, layout.py
the convolution layouts) -> loop IR (lowerings.py)."""
