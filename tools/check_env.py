#!/usr/bin/env python3
"""Fail early, with the reason, when this machine cannot build the fork's venv."""

import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from fork import Fork, ForkError, pick_key  # noqa: E402

# The installed .venv takes about 6.4 GB (torch's CUDA build and its nvidia-*
# libraries are most of it), plus the fork's wheel build; pip runs with
# --no-cache-dir, so downloads are not kept a second time.
NEED_BYTES = 7 * 1024**3


def disk_error(where: Path, free_bytes: int, need_bytes: int = NEED_BYTES) -> str | None:
    """The message for too little free disk at `where`, or None when there is enough."""
    if free_bytes >= need_bytes:
        return None
    gib = 1024**3
    return (
        f"error: {free_bytes / gib:.1f} GiB free on the disk of {where}, and the venv needs "
        f"about {need_bytes / gib:.0f} GiB (pip would stop with 'No space left on device'). "
        "Free space there (old clones, venvs, ~/.cache/pip) and run make again."
    )


def main(argv: list[str] | None = None) -> None:
    # The venv about to be made (Makefile: $(VENV)); .venv when not given.
    args = sys.argv[1:] if argv is None else argv
    venv = Path(args[0]) if args else Path(".venv")
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
    here = Path.cwd()
    if (here / venv).exists():
        return  # an update of an existing venv needs far less than a new one
    msg = disk_error(here, shutil.disk_usage(here).free)
    if msg:
        sys.exit(msg)


if __name__ == "__main__":
    main()
