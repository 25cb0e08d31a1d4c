"""The command line: python3 tools/fork.py [--base VERSION] CMD (see tools/fork.py)."""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .check import check_each
from .compare import compare_exports
from .core import Fork, ForkError
from .export import export
from .series import lint_series, read_series, stacks_of
from .tree import import_tree, materialize
from .wheel import base_requirements, diffstat, install, overlay


def main(argv: list[str] | None = None, fork: Fork | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fork.py", description="Build tool for the SGLang Gemma-4 fork: a pinned upstream wheel + PR stacks of patches.")
    ap.add_argument("--base", metavar="VERSION",
                    help="the upstream release to build on (default: tools/upstream.json's; "
                         "others are in bases/)")
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("materialize", help="upstream wheel + series, one commit per step")
    p.add_argument("dir", type=Path)
    p.add_argument("--force", action="store_true", help="replace a non-empty DIR")
    p.add_argument("--upto", metavar="STEP", help="apply only the steps before STEP")
    p = sub.add_parser("install", help="build the fork wheel and pip install it into the venv")
    p.add_argument("--venv", default=".venv")
    p.add_argument("--no-deps-check", action="store_true")
    p = sub.add_parser("export", help="per-stack folders of git-am-able patches (with their "
                       "tests) + cover letters")
    p.add_argument("outdir", type=Path)
    p.add_argument("--force", action="store_true", help="replace a non-empty OUTDIR")
    p = sub.add_parser("import", help="write a materialized tree's commits back as the series")
    p.add_argument("dir", type=Path)
    p = sub.add_parser("overlay", help="only changed/new files as DIR/sglang/...")
    p.add_argument("dir", type=Path)
    p = sub.add_parser("check", help="materialize and verify; --each checks every step")
    p.add_argument("--each", action="store_true",
                   help="per step: git am, byte-compile and import what it touches, run its tests")
    p.add_argument("--python", help="interpreter that imports and tests (default: this one)")
    p.add_argument("--stack", help="with --each: run the tests of this stack only")
    p.add_argument("--no-tests", action="store_true", help="with --each: apply and import only")
    p.add_argument("--from", dest="start", metavar="STEP",
                   help="with --each: only apply the steps before STEP (to resume)")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="with --each: check N steps at once, each in a worktree of its own")
    p.add_argument("--last-stack-in-suite", action="store_true",
                   help="with --each: leave the last step's tests and its stack's to the "
                   "suite that runs next on the same tree (make test); also those of the "
                   "last stack with tests, when only stacks no test is marked for follow it")
    p.add_argument("--no-preload", action="store_true",
                   help="with --each: start every test run as a new Python process "
                   "(default: forked from one that has imported the third-party modules)")
    p.add_argument("--stack-tests-in-suite", action="store_true",
                   help="with --each: leave every stack's tests without a step to the suite "
                   "(make test); steps' own tests and proofs still run")
    sub.add_parser("diffstat", help="files and +/- lines per step")
    p = sub.add_parser("requirements", help="this base's CPU requirements (the default "
                       "base's with this base's pins), written to FILE")
    p.add_argument("file", type=Path)
    p = sub.add_parser("compare", help="export at REV (with REV's own tool) and here, and "
                       "compare every step's tree")
    p.add_argument("rev", help="a commit of this repository, e.g. main~1")
    args = ap.parse_args(argv)
    try:
        fork = fork or Fork(base=args.base)
        if args.cmd == "materialize":
            materialize(fork, args.dir, force=args.force, upto=args.upto)
        elif args.cmd == "install":
            install(fork, args.venv, deps_check=not args.no_deps_check)
        elif args.cmd == "export":
            export(fork, args.outdir, force=args.force)
        elif args.cmd == "import":
            written = import_tree(fork, args.dir)
            print(f"imported {args.dir}: {len(written)} patches rewritten"
                  + "".join(f"\n  {w}" for w in written))
        elif args.cmd == "overlay":
            for rel in overlay(fork, args.dir):
                print(rel)
        elif args.cmd == "check" and args.each:
            t0 = time.monotonic()
            reports = check_each(fork, args.python, run_tests=not args.no_tests,
                                 stack=args.stack, start=args.start, jobs=args.jobs,
                                 last_stack_in_suite=args.last_stack_in_suite,
                                 stack_tests_in_suite=args.stack_tests_in_suite,
                                 preload=not args.no_preload,
                                 log=lambda m: print(m, flush=True))
            print(f"ok: all {len(reports)} steps apply, import and pass their tests "
                  f"({sum(r.tests for r in reports)} test selections, "
                  f"{sum(len(r.proofs) for r in reports)} fail one step earlier; "
                  f"{time.monotonic() - t0:.0f} s, {args.jobs} at once)")
        elif args.cmd == "check":
            problems = lint_series(read_series(fork))
            if problems:
                raise ForkError("patch messages:\n  " + "\n  ".join(problems))
            with tempfile.TemporaryDirectory() as tmp:
                res = materialize(fork, Path(tmp) / "tree", quiet=True)
            print(f"ok: {fork.pin['name']} {fork.pin['version']} + {len(res.steps)} steps "
                  f"in {len(stacks_of(res.steps))} stacks apply; python/ holds their "
                  f"{len(res.created)} new files")
        elif args.cmd == "diffstat":
            print(diffstat(fork))
        elif args.cmd == "requirements":
            args.file.parent.mkdir(parents=True, exist_ok=True)
            args.file.write_text(base_requirements(fork))
        elif args.cmd == "compare":
            print(compare_exports(fork, args.rev))
    except ForkError as e:
        print(f"fork.py: error: {e}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as e:
        print(f"fork.py: error: command failed ({e.returncode}): {e.cmd}", file=sys.stderr)
        return 1
    return 0
