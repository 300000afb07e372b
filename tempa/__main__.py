"""`python -m tempa ...` is the `tempa` command (tempa/cli.py)."""
import sys

from .cli import main

sys.exit(main())
