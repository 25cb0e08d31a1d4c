"""Which tests belong to which step (pytest.mark.stack, read statically), and which of
them a base runs."""
from __future__ import annotations

import ast
import re

from dataclasses import dataclass

from .core import TEST_DIRS, Fork, ForkError
from .series import Step, read_series


@dataclass
class MarkedTest:
    nodeid: str              # test/srt/test_x.py::test_y (or ::TestClass)
    stack: str
    step: str | None = None  # None: after the stack's last step
    fails_before: bool = False
    suite_only: bool = False  # a soak of the whole fork: not part of any step's check
    bases: tuple[str, ...] | None = None  # the releases whose code it tests (None: all)


def _stack_mark(decorators) -> dict | None:
    """The arguments of a pytest.mark.stack(...) among these expressions, or None."""
    for d in decorators:
        for node in (d.elts if isinstance(d, (ast.List, ast.Tuple)) else [d]):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "stack" and ast.unparse(node.func.value)
                    in ("pytest.mark", "mark")):
                if len(node.args) != 1 or not isinstance(node.args[0], ast.Constant):
                    raise ForkError(f"pytest.mark.stack takes one literal stack name: "
                                    f"{ast.unparse(node)}")
                kw = {k.arg: ast.literal_eval(k.value) for k in node.keywords}
                bad = set(kw) - {"step", "fails_before", "suite_only", "bases"}
                if bad:
                    raise ForkError(f"pytest.mark.stack: unknown argument(s) {sorted(bad)}")
                if "bases" in kw and (not isinstance(kw["bases"], (tuple, list)) or not all(
                        isinstance(b, str) for b in kw["bases"]) or not kw["bases"]):
                    raise ForkError(f"pytest.mark.stack: bases is a tuple of release versions: "
                                    f"{ast.unparse(node)}")
                if kw.get("suite_only") and (kw.get("step") or kw.get("fails_before")):
                    raise ForkError(f"pytest.mark.stack: a suite_only test is checked by no "
                                    f"step, so it takes no step or fails_before: {ast.unparse(node)}")
                return {"stack": node.args[0].value, **kw}
    return None


def collect_marked_tests(fork: Fork) -> tuple[list[MarkedTest], list[str]]:
    """Every test function/class of TEST_DIRS with the stack it belongs to, read from the
    source (importing a test module at a step before its feature would fail). Returns
    the tests and the test files without any marker."""
    tests, unmarked = [], []
    for d in TEST_DIRS:
        for path in sorted((fork.root / d).glob("test_*.py")):
            rel = path.relative_to(fork.root).as_posix()
            mod = ast.parse(path.read_text(), rel)
            module_mark = None
            for node in mod.body:
                if (isinstance(node, ast.Assign) and len(node.targets) == 1
                        and isinstance(node.targets[0], ast.Name)
                        and node.targets[0].id == "pytestmark"):
                    module_mark = _stack_mark([node.value])
            found = False
            for node in mod.body:
                is_test = ((isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                            and node.name.startswith("test"))
                           or (isinstance(node, ast.ClassDef) and node.name.startswith("Test")))
                if not is_test:
                    continue
                mark = _stack_mark(node.decorator_list) or module_mark
                if mark is None:
                    continue
                found = True
                tests.append(MarkedTest(f"{rel}::{node.name}", mark["stack"], mark.get("step"),
                                        bool(mark.get("fails_before", False)),
                                        bool(mark.get("suite_only", False)),
                                        tuple(mark["bases"]) if "bases" in mark else None))
            if not found:
                unmarked.append(rel)
    return tests, unmarked


def validate_marks(tests: list[MarkedTest], steps: list[Step]) -> None:
    stacks = {s.stack for s in steps}
    names = {s.name: s.stack for s in steps}
    for t in tests:
        if t.stack not in stacks:
            raise ForkError(f"{t.nodeid}: unknown stack {t.stack!r} (stacks: {sorted(stacks)})")
        if t.step is not None and names.get(t.step) != t.stack:
            raise ForkError(f"{t.nodeid}: {t.step!r} is not a step of stack {t.stack!r}")


def known_bases(fork: Fork) -> list[str]:
    """The default base's release and those in bases/."""
    default = Fork(root=fork.root, cache_dir=fork.cache_dir).pin["version"]
    return [default] + sorted(p.parent.name for p in (fork.root / "bases").glob("*/upstream.json"))


NOT_YET_PORTED_RE = re.compile(r"^#\s*not yet ported:\s*(\S+)\s*$")


def not_yet_ported(fork: Fork, steps: list[Step]) -> set[tuple[str, str]]:
    """(stack, step) of each step that this base's series declares not ported yet
    (`# not yet ported: NN-stack/NNNN-name.patch`, a line of the default series)."""
    if fork.base is None:
        return set()
    pd = fork.rel(fork.patches_dir)
    default = {s.line: s for s in read_series(Fork(root=fork.root, cache_dir=fork.cache_dir),
                                              need_files=False)}
    stacks, names = {s.stack for s in steps}, {s.name for s in steps}
    pending = set()
    for n, line in enumerate((fork.patches_dir / "series").read_text().splitlines(), 1):
        m = NOT_YET_PORTED_RE.match(line.strip())
        if not m:
            continue
        s = default.get(m[1])
        if s is None:
            raise ForkError(f"{pd}/series:{n}: {m[1]} is not a step of the default series")
        if s.stack not in stacks or s.name in names:
            raise ForkError(f"{pd}/series:{n}: {m[1]} is declared not yet ported, but "
                            + ("its stack is not in this series (a stack not ported needs "
                               "no declaration)" if s.stack not in stacks
                               else "this series has that step"))
        pending.add((s.stack, s.name))
    return pending


def tests_of_base(fork: Fork, tests: list[MarkedTest], steps: list[Step]
                  ) -> tuple[list[MarkedTest], list[MarkedTest]]:
    """(the tests this base's series runs, those it leaves out, counted).

    A base leaves out the tests of a stack it has not ported yet, and a test whose
    ``bases`` name other releases only (it tests upstream code this release does not
    have, or a step only another base's series has). A step may also be absent from
    another base because that release already has the fix or no longer needs it: its
    tests then run with their stack's tests, where they must pass, as a regression check
    of upstream's code. The default base's series has every stack and every step that
    its tests name."""
    version, bases = fork.pin["version"], known_bases(fork)
    for t in tests:
        unknown = sorted(set(t.bases or ()) - set(bases))
        if unknown:
            raise ForkError(f"{t.nodeid}: bases={unknown} are not releases of this fork "
                            f"({', '.join(bases)})")
    here = [t for t in tests if t.bases is None or version in t.bases]
    elsewhere = [t for t in tests if not (t.bases is None or version in t.bases)]
    if fork.base is None:
        validate_marks(here, steps)
        return here, elsewhere
    stacks, names = {s.stack for s in steps}, {s.name for s in steps}
    pending = not_yet_ported(fork, steps)
    partial = {stack for stack, _ in pending}
    kept, left_out = [], list(elsewhere)
    for t in here:
        if t.stack not in stacks or (t.stack, t.step) in pending or (
                t.step is None and t.stack in partial):
            left_out.append(t)
        elif t.step is not None and t.step not in names:
            kept.append(MarkedTest(t.nodeid, t.stack))
        else:
            kept.append(t)
    return kept, left_out


def left_out_why(fork: Fork, left_out: list[MarkedTest], steps: list[Step]) -> str:
    """One line: how many tests this base leaves out, and why."""
    version, stacks = fork.pin["version"], {s.stack for s in steps}
    other = [t for t in left_out if t.bases is not None and version not in t.bases]
    unported = sorted({t.stack for t in left_out if t not in other and t.stack not in stacks})
    in_part = [t for t in left_out if t not in other and t.stack in stacks]
    why = []
    if unported:
        why.append(f"of stacks not ported to sglang {version} yet: " + ", ".join(unported))
    if in_part:
        why.append(f"{len(in_part)} of steps not ported yet ("
                   + ", ".join(sorted({t.stack for t in in_part})) + ")")
    if other:
        why.append(f"{len(other)} marked for other releases only ("
                   + ", ".join(sorted({"/".join(t.bases) for t in other})) + ")")
    return f"{len(left_out)} tests left out, " + "; ".join(why)
