#!/usr/bin/env python3
"""Run a command as a named phase and print how long it took: `phase.py NAME CMD...`.

`make test` runs its phases through this so a CI log shows what each one costs. Under
`.ci/run` (CI_START and CI_BUDGET_S set), a phase that ends past the budget also prints
a warning line, so later work sees the budget before it is spent."""
import os
import subprocess
import sys
import time


def budget_warning(now: float) -> str | None:
    """The warning line once CI has run past CI_BUDGET_S seconds since CI_START, else None."""
    try:
        start, budget = float(os.environ["CI_START"]), float(os.environ["CI_BUDGET_S"])
    except (KeyError, ValueError):
        return None
    spent = now - start
    if spent <= budget:
        return None
    return (f"[phase] WARNING: CI has run {spent:.0f} s, past its {budget:.0f} s budget "
            f"({budget / 60:.0f} minutes for both bases; a run past 90 minutes lands "
            "nothing): see .humanize/stacks/ci-time.md")


if __name__ == "__main__":
    name, cmd = sys.argv[1], sys.argv[2:]
    t0 = time.monotonic()
    rc = subprocess.call(cmd)
    print(f"[phase] {name}: {time.monotonic() - t0:.0f} s (exit {rc})", flush=True)
    line = budget_warning(time.time())
    if line:
        print(line, flush=True)
    sys.exit(rc)
