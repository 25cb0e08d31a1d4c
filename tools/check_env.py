#!/usr/bin/env python3
"""Fail early, with the reason, when this machine cannot build the fork's venv."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from fork import Fork, ForkError, pick_key  # noqa: E402

try:
    # The same check `fork.py install` makes, before minutes go into the venv.
    pick_key(Fork(), None, strict=True)
except ForkError as e:
    sys.exit(f"error: {e} (for example: make test PY=python3.11)")
if sys.version_info[:2] != (3, 11):
    print(
        "warning: requirements-cpu.txt was locked on Python 3.11; "
        f"Python {sys.version.split()[0]} may need other wheels.",
        file=sys.stderr,
    )
