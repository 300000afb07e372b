"""Session-wide test set-up.

- HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE: the zoo builds HuggingFace models from configs
  with random weights; any attempt to reach the network is a bug and must fail fast.
- TRITON_INTERPRET=1 on machines without CUDA, set before anything imports triton (some
  library imports it early, and Triton reads the variable once): the GPU backend's
  interpreter tests (tests/backend/test_gpu.py) need it, whichever tests ran first.
- The repository root goes on sys.path so every test imports the zoo one way,
  `from tests.models import zoo`, whatever pytest's rootdir handling does.
"""

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

try:
    import torch
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:
    pass

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
