"""check --each: every step applies, imports what it touches and passes its tests."""
from __future__ import annotations

import concurrent.futures
import os
import queue
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from .core import BASE_TAG, Fork, ForkError, git
from .export import exported_tests
from .marks import collect_marked_tests, left_out_why, tests_of_base
from .names import _Modules, check_step_names
from .probes import (COMPILE_PROBE, IMPORT_FAILED, IMPORT_PROBE, _Interpreter, _tree_env,
                     forget_bytecode, preload_names, python_modules)
from .series import Step, lint_series, read_series, stacks_of
from .tree import step_contents, apply_step, changed_files, create_base, verify_modules


@dataclass
class StepReport:
    step: Step
    seconds: float
    imported: int
    tests: int
    proofs: list[str]


@dataclass
class _Job:
    """One unit of check work on one step's tree; a step has one job that probes it (its
    touched modules, its proofs, its own tests) and, with jobs > 1, one job per test file
    of the stack tests that run after it, so long engine files spread over the workers."""
    step: Step
    before: str                 # commit just before the step (where proofs must fail)
    after: str                  # commit with the step applied
    probe: bool
    tests: list[str]
    proofs: list[str] = field(default_factory=list)


def _pytest(fork: Fork, interp: _Interpreter, tree: Path, nodeids: list[str],
            import_first: list[str] | None = None) -> subprocess.CompletedProcess:
    args = ["-q", "-p", "no:cacheprovider", "-x", *nodeids]
    if import_first:
        cmd = ["-c", IMPORT_PROBE, *import_first, "--", *args]
    else:
        cmd = ["-m", "pytest", *args]
    return interp.run(cmd, fork.root, _tree_env(tree, write_bytecode=True))


# The check's runs cache the bytecode of what they import, the step's tree included (a
# checkout keeps the tree's __pycache__ folders and drops what it changed): compiling
# sglang's modules from source cost each run about 2 s of CPU, and each engine process
# it started more.
def _checkout(tree: Path, rev: str) -> None:
    changed = git(tree, "diff", "-z", "--name-only", "--no-renames", rev).stdout.split("\0")
    git(tree, "checkout", "-q", "--detach", "-f", rev)
    git(tree, "clean", "-q", "-f", "-d", "-x", "-e", "__pycache__")
    forget_bytecode(tree, [p for p in changed if p])


def _run_job(fork: Fork, python: str, interp: _Interpreter, tree: Path, cwd: Path,
             job: _Job) -> tuple[int, int]:
    """Check one job in ``tree`` (a worktree this job has to itself); returns (modules
    imported, tests run) or raises ForkError with the cause."""
    s = job.step
    if job.proofs:
        _checkout(tree, job.before)
        res = _pytest(fork, interp, tree, job.proofs)
        if res.returncode in (0, 5):
            raise ForkError(f"{', '.join(job.proofs)} pass(es) before step {s.line} "
                            "exists; a test marked fails_before must fail there:\n"
                            + res.stdout[-3000:])
    _checkout(tree, job.after)
    mods: list[str] = []
    if job.probe:
        touched = [p for p, st in changed_files(tree, f"{job.before}..{job.after}").items()
                   if st != "D"]
        py = [p for p in touched if p.endswith(".py")]
        if py:
            res = subprocess.run([python, "-c", COMPILE_PROBE, *(str(tree / p) for p in py)],
                                 capture_output=True, text=True)
            if res.returncode:
                raise ForkError(f"step {s.line}: a file it touches does not compile:\n"
                                + res.stderr[-4000:])
        mods = python_modules(py)
        if mods and not job.tests:  # else imported by the tests' process, below
            res = interp.run(["-c", IMPORT_PROBE, *mods], cwd,
                             _tree_env(tree, write_bytecode=True))
            if res.returncode:
                raise ForkError(f"step {s.line}: a module it touches does not import:\n"
                                + res.stderr[-6000:])
    if job.tests:
        res = _pytest(fork, interp, tree, job.tests, import_first=mods)
        if res.returncode == IMPORT_FAILED:
            raise ForkError(f"step {s.line}: a module it touches does not import:\n"
                            + res.stderr[-6000:])
        if res.returncode:
            raise ForkError(f"step {s.line}: its tests fail:\n{res.stdout[-8000:]}"
                            f"{res.stderr[-2000:]}")
    return len(mods), len(job.tests)


def check_each(fork: Fork, python: str | None = None, run_tests: bool = True,
               stack: str | None = None, start: str | None = None, jobs: int = 1,
               last_stack_in_suite: bool = False, stack_tests_in_suite: bool = False,
               preload: bool = True, log=print) -> list[StepReport]:
    """Every step is a working tree: applied in order with git am, each step's touched
    modules byte-compile and import from the tree, and its tests pass there (those
    marked fails_before also fail just before it).

    All steps are applied first (one commit each), so a patch that does not apply fails
    before any test runs; the checks then run on ``jobs`` worktrees at once, each job
    checking out the commit it needs. The steps' checks are independent of each other,
    and a test mostly keeps one core busy (Python, or the Triton interpreter); on a
    2-core machine two jobs each run about 30 % slower than one alone, so the whole
    check takes about two thirds of the wall time of one job at a time.

    ``last_stack_in_suite``: the last step's tree is the whole series, which the suite
    runs next (``make test``) from the installed fork; the last step's own tests and its
    stack's are left to it instead of running twice on the same code (its proofs still
    run here, on the tree before it). Stacks at the series' end that no test is marked
    for (0.5.17's fork-only benchmark hooks, behind a switch that is off by default)
    change nothing those tests reach, so the end of the last stack with tests is left
    to the suite too.

    ``stack_tests_in_suite`` (``make test``, for CI time): every stack's tests without a
    step (its engine and server runs, the long ones) are left to the suite, which runs
    them on the whole series; each step's own tests and every proof still run here.

    ``preload``: each job's Python runs are forked from an interpreter that has imported
    the third-party modules the series' code imports (PRELOADED); sglang and the tests
    still load from the step's tree in each run."""
    python = os.path.abspath(python) if python else sys.executable
    steps = read_series(fork)
    problems = lint_series(steps)
    if problems:
        raise ForkError("patch messages:\n  " + "\n  ".join(problems))
    tests, unmarked = collect_marked_tests(fork)
    if unmarked:
        raise ForkError("test files with no pytest.mark.stack (which stack do they test?): "
                        + ", ".join(unmarked))
    tests, left_out = tests_of_base(fork, tests, steps)
    if left_out:
        log(left_out_why(fork, left_out, steps))
    last_of_stack = {st[-1].name for _, st in stacks_of(steps)}
    in_suite = set()
    if last_stack_in_suite and steps:
        in_suite.add(steps[-1].name)
        tested = {t.stack for t in tests}
        last_tested = [st for _, st in stacks_of(steps) if st[0].stack in tested][-1:]
        in_suite.update(st[-1].name for st in last_tested)
    first_of_stack = {st[0].name for _, st in stacks_of(steps)}
    if start is not None and start not in {s.name for s in steps}:
        raise ForkError(f"--from {start}: not a step of {fork.rel(fork.patches_dir)}/series")
    jobs = max(1, jobs)
    with tempfile.TemporaryDirectory(prefix="fork-each-") as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        create_base(fork, tree)
        plan: list[_Job] = []
        checked: list[Step] = []
        skipping = start is not None
        before = git(tree, "rev-parse", "HEAD").stdout.strip()
        contents = step_contents(fork, steps)
        # what an export carries at each step: its tests may name only what the step has
        carried, modules = exported_tests(fork, steps), _Modules(tree)
        for s, files in zip(steps, carried):
            apply_step(tree, s, contents.get(s.name))
            check_step_names(tree, files, s.line, modules)
            after = git(tree, "rev-parse", "HEAD").stdout.strip()
            skipping = skipping and s.name != start
            if not skipping:  # --from: the steps before it are only applied
                checked.append(s)
                selected = run_tests and (stack is None or s.stack == stack)
                own = [t.nodeid for t in tests if t.stack == s.stack and t.step == s.name]
                of_stack = [t.nodeid for t in tests if t.stack == s.stack and t.step is None
                            and s.name in last_of_stack and not t.suite_only]
                # fails_before: a step test just before its step, a stack test just
                # before its stack's first step.
                proofs = [t.nodeid for t in tests if t.stack == s.stack and t.fails_before and (
                    t.step == s.name or (t.step is None and s.name in first_of_stack))]
                if not selected:
                    own, of_stack, proofs = [], [], []
                if stack_tests_in_suite and of_stack and s.name not in in_suite:
                    log(f"{len(of_stack)} stack tests of {s.stack} are left to the suite, "
                        "which runs them on the whole series")
                    of_stack = []
                if s.name in in_suite and (own or of_stack):
                    where = ("the same tree" if s is steps[-1] else
                             "the whole series (the steps after it carry no tests)")
                    log(f"{len(own) + len(of_stack)} tests of {s.line} (its own and its "
                        f"stack's) are left to the suite, which runs them on {where}")
                    own, of_stack = [], []
                if jobs == 1:
                    plan.append(_Job(s, before, after, True, own + of_stack, proofs))
                else:
                    plan.append(_Job(s, before, after, True, own, proofs))
                    by_file: dict[str, list[str]] = {}
                    for nodeid in of_stack:
                        by_file.setdefault(nodeid.split("::")[0], []).append(nodeid)
                    plan += [_Job(s, before, after, False, ids) for ids in by_file.values()]
            before = after
        verify_modules(fork, tree, steps)
        if jobs > 1:  # stack tests (engine runs, the long ones) first, later stacks first
            order = {s.name: i for i, s in enumerate(steps)}
            plan.sort(key=lambda j: (j.probe, -order[j.step.name] if not j.probe
                                     else order[j.step.name]))
        names = []
        if preload and any(j.probe or j.tests for j in plan):
            touched = [p for p, st in changed_files(tree, f"{BASE_TAG}..HEAD").items()
                       if st != "D" and p.endswith(".py")]
            names = preload_names(python, tree, python_modules(touched))
        free: "queue.Queue[tuple[Path, _Interpreter]]" = queue.Queue()
        interps = []
        for i in range(min(jobs, len(plan)) or 1):
            wt = Path(tmp) / f"worktree-{i}"
            git(tree, "worktree", "add", "-q", "--detach", str(wt), "HEAD")
            interps.append(_Interpreter(python, names, Path(tmp)))
            free.put((wt, interps[-1]))
        left = {s.name: sum(1 for j in plan if j.step is s) for s in checked}
        done: dict[str, StepReport] = {s.name: StepReport(s, 0.0, 0, 0, []) for s in checked}

        def run(job: _Job) -> _Job:
            wt, interp = free.get()
            try:
                t0 = time.monotonic()
                mods, ran = _run_job(fork, python, interp, wt, Path(tmp), job)
            finally:
                free.put((wt, interp))
            rep = done[job.step.name]
            rep.seconds += time.monotonic() - t0
            rep.imported += mods
            rep.tests += ran
            rep.proofs += job.proofs
            return job

        with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
            futures = [pool.submit(run, j) for j in plan]
            try:
                for fut in concurrent.futures.as_completed(futures):
                    job = fut.result()  # the first failure stops the check
                    if not job.probe:  # progress: stack tests end long before their step
                        log(f"  {len(job.tests)} stack tests of {job.tests[0].split('::')[0]}"
                            f" pass after {job.step.line}")
                    left[job.step.name] -= 1
                    if left[job.step.name] == 0:
                        rep = done[job.step.name]
                        log(f"ok {rep.step.line}: {rep.imported} modules import, {rep.tests} "
                            "tests pass" + (f", {len(rep.proofs)} fail one step earlier"
                                            if rep.proofs else "")
                            + f" ({rep.seconds:.0f} s)")
            except BaseException:
                for f in futures:
                    f.cancel()
                raise
            finally:
                for interp in interps:
                    interp.close()
    return [done[s.name] for s in checked]
