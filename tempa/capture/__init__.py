"""The frontend: symbolic execution of CPython bytecode into torch.fx graphs with guards."""
