"""compare REV: the exported series at another commit of this repository (built by that
commit's own tool) and here have the same tree at every step. A change to how the fork
is kept (its layout, the tool) must not change what a reviewer receives."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from .core import Fork, ForkError, git
from .export import export
from .tree import create_base


def exported_trees(fork: Fork, outdir: Path, work: Path) -> list[tuple[str, str]]:
    """(patch, tree hash) after each patch of an export, applied with git am onto the wheel."""
    create_base(fork, work)
    out = []
    for line in (outdir / "series").read_text().split():
        res = git(work, "am", "-q", "--keep-cr", str(outdir / line), check=False)
        if res.returncode:
            raise ForkError(f"{outdir / line} does not apply: {res.stderr.strip()}")
        out.append((line, git(work, "rev-parse", "HEAD^{tree}").stdout.strip()))
    return out


def compare_exports(fork: Fork, rev: str) -> str:
    with tempfile.TemporaryDirectory(prefix="fork-compare-") as tmp:
        tmp = Path(tmp)
        at_rev = tmp / "at-rev"
        git(fork.root, "worktree", "add", "-q", "--detach", str(at_rev), rev)
        try:
            cmd = [sys.executable, str(at_rev / "tools" / "fork.py"),
                   *(["--base", fork.base] if fork.base else []), "export", str(tmp / "before")]
            res = subprocess.run(cmd, cwd=at_rev, capture_output=True, text=True,
                                 env=dict(os.environ, SGLANG_FORK_CACHE=str(fork.cache_dir)))
            if res.returncode:
                raise ForkError(f"export at {rev} failed:\n{res.stderr[-3000:]}")
        finally:
            git(fork.root, "worktree", "remove", "--force", str(at_rev), check=False)
        export(fork, tmp / "after")
        before = exported_trees(fork, tmp / "before", tmp / "tree-before")
        after = exported_trees(fork, tmp / "after", tmp / "tree-after")
    version = fork.pin["version"]
    if [t for _, t in before] != [t for _, t in after]:
        rows = [f"  {a[0] if a else '-'} {a[1][:12] if a else '-'}  "
                f"{b[0] if b else '-'} {b[1][:12] if b else '-'}"
                for a, b in zip(before + [None] * len(after), after + [None] * len(before))
                if (a or b) and (a is None or b is None or a[1] != b[1])]
        raise ForkError(f"sglang {version}: the exported series at {rev} ({len(before)} steps) "
                        f"and here ({len(after)} steps) differ at:\n" + "\n".join(rows))
    return (f"sglang {version}: the exported series at {rev} and here have the same tree at "
            f"each of their {len(after)} steps")
