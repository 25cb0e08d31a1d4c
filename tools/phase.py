#!/usr/bin/env python3
"""Run a command as a named phase and print how long it took: `phase.py NAME CMD...`.

`make test` runs its phases through this so a CI log shows what each one costs."""
import subprocess
import sys
import time

name, cmd = sys.argv[1], sys.argv[2:]
t0 = time.monotonic()
rc = subprocess.call(cmd)
print(f"[phase] {name}: {time.monotonic() - t0:.0f} s (exit {rc})", flush=True)
sys.exit(rc)
