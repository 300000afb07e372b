"""tempa's differential soundness harness (see README.md)."""
