#!/usr/bin/env python3
"""Fail early, with the reason, when this machine cannot build the fork's venv."""

import json
import sys
from pathlib import Path

pins = json.loads((Path(__file__).parent / "upstream.json").read_text())["wheels"]
tag = f"cp{sys.version_info[0]}{sys.version_info[1]}"
if not any(key.startswith(tag + "-") for key in pins):
    have = ", ".join(sorted({k.split("-")[0] for k in pins}))
    sys.exit(
        f"error: Python {sys.version.split()[0]} found, but tools/upstream.json pins "
        f"sglang wheels only for {have}; run with PY=python3.11 (make test PY=python3.11)."
    )
if sys.version_info[:2] != (3, 11):
    print(
        "warning: requirements-cpu.txt was locked on Python 3.11; "
        f"Python {sys.version.split()[0]} may need other wheels.",
        file=sys.stderr,
    )
