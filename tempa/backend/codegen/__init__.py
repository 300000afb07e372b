"""Codegen: kernel groups -> C++ (cpp.py); the call sequence -> a Python wrapper (wrapper.py)."""
