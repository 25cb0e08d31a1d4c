"""export: each stack as git-am-able patches that carry their new files and tests."""
from __future__ import annotations

import ast
import operator
import re
import shutil
import sys
import tempfile
from pathlib import Path

from .core import TEST_DIRS, Fork, ForkError, git, prepare_dest
from .marks import _stack_mark, collect_marked_tests, tests_of_base
from .names import _Modules, check_step_names
from .series import Step, read_series, stacks_of
from .tree import apply_step, create_base, step_contents, verify_modules


# conftest.py of a test folder: from the line with this text on, the fork's own test
# selection (which tests a base runs, in what order), which an exported series leaves out.
EXPORT_CUT = "the fork's own test selection (tools/fork.py export leaves it out)"


def _is_test_node(node) -> bool:
    return ((isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
             and node.name.startswith("test"))
            or (isinstance(node, ast.ClassDef) and node.name.startswith("Test")))


def _is_stack_mark(node) -> bool:
    return _stack_mark([node]) is not None


# Top-level functions a test file defines for pytest itself: kept with any test.
PYTEST_HOOKS = ("setup_module", "teardown_module", "setup_function", "teardown_function")


def _defined(node) -> set[str]:
    """The names a top-level helper binds (a def, class or assignment), else empty: a
    statement of any other kind stays with every test."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        auto = any("autouse" in ast.unparse(d) for d in node.decorator_list)
        if auto or node.name.startswith("pytest_") or node.name in PYTEST_HOOKS:
            return set()
        return {node.name}
    targets = (node.targets if isinstance(node, ast.Assign) else
               [node.target] if isinstance(node, ast.AnnAssign) else [])
    names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    if not targets or not all(isinstance(n, (ast.Name, ast.Tuple, ast.List, ast.Store,
                                             ast.Starred))
                              for t in targets for n in ast.walk(t)):
        return set()
    return set() if names & {"pytestmark", "__all__"} else names


def _referenced(node, skip=lambda n: False) -> set[str]:
    """Every name ``node`` may reach a helper by: names it reads, parameters (pytest
    fixtures are requested by name) and strings that are names (usefixtures,
    getfixturevalue); not inside the nodes ``skip`` picks."""
    out, todo = set(), [node]
    while todo:
        n = todo.pop()
        if skip(n):
            continue
        todo += ast.iter_child_nodes(n)
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.arg):
            out.add(n.arg)
        elif isinstance(n, ast.Constant) and isinstance(n.value, str) \
                and n.value.isidentifier():
            out.add(n.value)
    return out


def _span(lines: list[str], body: list, i: int) -> range:
    """0-based lines of top-level statement body[i]: its decorators and its own comment
    right above it, up to the next statement's decorators, comments and the blank lines
    before them."""
    node = body[i]
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    while start > 1 and lines[start - 2].lstrip().startswith("#"):
        start -= 1
    stop = len(lines)
    if i + 1 < len(body):
        nxt = body[i + 1]
        stop = min([nxt.lineno] + [d.lineno for d in getattr(nxt, "decorator_list", [])]) - 1
        while stop > node.end_lineno and lines[stop - 1].lstrip().startswith("#"):
            stop -= 1
        while stop > node.end_lineno and lines[stop - 1].strip():
            stop -= 1
    return range(start - 1, max(stop, node.end_lineno))


def exported_test_source(src: str, rel: str, carried: set[str]) -> str:
    """A test file as an exported series carries it: its top-level tests in ``carried``
    (the others removed, with their decorators), the helpers (top-level functions,
    classes and assignments) those tests reach, and no pytest.mark.stack, which only
    this fork's per-step check reads. A helper enters with the first test that uses it:
    one a later step's (or another release's) test uses may name what only that step
    (release) has. An import only the removed code used goes with it."""
    mod = ast.parse(src, rel)
    lines = src.splitlines(keepends=True)
    drop: set[int] = set()  # 0-based line numbers
    body = mod.body
    removed: set[int] = set()  # indexes into body
    marks: set[int] = set()  # pytestmark = pytest.mark.stack(...), left out
    for i, node in enumerate(body):
        if _is_test_node(node) and node.name not in carried:
            removed.add(i)
        elif _is_test_node(node):
            for d in node.decorator_list:
                if _is_stack_mark(d):
                    drop.update(range(d.lineno - 1, d.end_lineno))
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1
              and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "pytestmark"
              and _stack_mark([node.value]) is not None):
            if not _is_stack_mark(node.value):
                raise ForkError(f"{rel}:{node.lineno}: export leaves out pytest.mark.stack, "
                                "so write it as its own `pytestmark = pytest.mark.stack(...)`")
            drop.update(range(node.lineno - 1, node.end_lineno))
            if node.end_lineno < len(lines) and not lines[node.end_lineno].strip():
                drop.add(node.end_lineno)
            marks.add(i)
    # Helpers: kept where a kept statement (a carried test, any statement that is not a
    # helper) reaches them, transitively.
    helpers = {i: _defined(n) for i, n in enumerate(body)
               if not _is_test_node(n) and not isinstance(n, (ast.Import, ast.ImportFrom))
               and _defined(n)}
    by_name: dict[str, list[int]] = {}
    for i, names in helpers.items():
        for name in names:
            by_name.setdefault(name, []).append(i)
    imports = [i for i, n in enumerate(body) if isinstance(n, (ast.Import, ast.ImportFrom))]
    kept = {i for i in range(len(body)) if i not in removed and i not in helpers
            and i not in imports and i not in marks}
    todo = list(kept)
    while todo:
        for name in _referenced(body[todo.pop()]):
            for j in by_name.get(name, ()):
                if j not in kept:
                    kept.add(j)
                    todo.append(j)
    removed |= set(helpers) - kept
    # An import whose every name the removed code used, and the kept code does not.
    # (a kept test's stack marks go: `import pytest` may have been for them only)
    used = set().union(*(_referenced(body[i], _is_stack_mark) for i in kept))
    gone = set().union(*(_referenced(body[i]) for i in removed | marks),
                       *(_referenced(d) for i in kept for d in
                         getattr(body[i], "decorator_list", ()) if _is_stack_mark(d)))
    for i in imports:
        bound = {(a.asname or a.name).split(".")[0] for a in body[i].names}
        if "*" not in bound and bound <= gone and not bound & used:
            removed.add(i)
    for i in removed:
        drop.update(_span(lines, body, i))
    kept_src = "".join(l for n, l in enumerate(lines) if n not in drop)
    # no run of more than two blank lines where statements were taken out between others
    kept_src = re.sub(r"\n{4,}", "\n\n\n", kept_src)
    return kept_src.rstrip("\n") + "\n" if kept_src.strip() else kept_src


# Test code that differs between releases is written `if RELEASE >= (0, 5, 23):` (an if
# statement or a conditional expression), RELEASE from test/srt/release.py: an export
# keeps only its release's branch, so a reviewer of one release reads its code only.
RELEASE = "RELEASE"
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt,
            ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge}


def _release_guard(test, version: tuple) -> bool | None:
    """The value of a test on RELEASE (``RELEASE >= (0, 5, 23)``, or ``not`` it) on
    ``version``; None for any other test."""
    negated = False
    while isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, negated = test.operand, not negated
    if not (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name)
            and test.left.id == RELEASE and len(test.ops) == 1
            and type(test.ops[0]) in _COMPARE):
        return None
    other = tuple(ast.literal_eval(test.comparators[0]))
    return _COMPARE[type(test.ops[0])](version, other) != negated


def _offset(lines: list[str], lineno: int, col: int) -> int:
    """Character offset of an ast position (col is in UTF-8 bytes)."""
    return sum(map(len, lines[:lineno - 1])) + len(lines[lineno - 1].encode()[:col].decode())


def _choose(src: str, rel: str, tree, node, value: bool) -> str:
    """``src`` with release test ``node`` replaced by the branch ``value`` picks."""
    lines = src.splitlines(keepends=True)
    if isinstance(node, ast.IfExp):
        branch = node.body if value else node.orelse
        start = _offset(lines, node.lineno, node.col_offset)
        end = _offset(lines, node.end_lineno, node.end_col_offset)
        return src[:start] + ast.get_source_segment(src, branch) + src[end:]
    where = f"{rel}:{node.lineno}"
    if node.body[0].lineno == node.lineno:
        raise ForkError(f"{where}: a release test's branch starts on a line of its own")
    first, last = node.lineno + 1, node.end_lineno  # 1-based, the body and any else
    if node.orelse:
        if lines[node.orelse[0].lineno - 1].lstrip().startswith("elif"):
            raise ForkError(f"{where}: a release test takes no elif (nest an if in the else)")
        else_at = next(n for n in range(node.body[-1].end_lineno + 1, node.orelse[0].lineno)
                       if lines[n - 1].lstrip().startswith("else"))
        block = (first, else_at - 1) if value else (else_at + 1, last)
    else:
        block = (first, last) if value else (first, first - 1)
    indent = len(lines[node.lineno - 1]) - len(lines[node.lineno - 1].lstrip())
    chosen = node.body if value else node.orelse
    kept = lines[block[0] - 1:block[1]]
    if chosen:
        inner = lines[chosen[0].lineno - 1]
        cut = len(inner) - len(inner.lstrip()) - indent
        kept = [l[min(cut, len(l) - len(l.lstrip(" "))):] if l.strip() else l for l in kept]
    else:  # the block the test stood alone in would be empty
        alone = any(getattr(p, f, None) == [node] for p in ast.walk(tree)
                    for f in ("body", "orelse", "finalbody"))
        kept = [" " * indent + "pass\n"] if alone else []
    return "".join(lines[:node.lineno - 1] + kept + lines[node.end_lineno:])


def release_source(src: str, rel: str, version: tuple) -> str:
    """``src`` as release ``version``'s export carries it: each release test resolved to
    its branch, and RELEASE's import gone where nothing reads it any more."""
    while True:
        tree = ast.parse(src, rel)
        found = next(((n, v) for n in ast.walk(tree) if isinstance(n, (ast.If, ast.IfExp))
                      and (v := _release_guard(n.test, version)) is not None), None)
        if found is None:
            break
        src = _choose(src, rel, tree, *found)
    if any(isinstance(n, ast.Name) and n.id == RELEASE for n in ast.walk(tree)):
        return src
    lines = src.splitlines(keepends=True)
    for node in tree.body:  # its import, where nothing reads it
        if isinstance(node, ast.ImportFrom) and [a.name for a in node.names] == [RELEASE]:
            for n in range(node.lineno - 1, node.end_lineno):
                lines[n] = ""
    return re.sub(r"\n{4,}", "\n\n\n", "".join(lines))


def _files_under(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix != ".pyc")


def test_file_deps(fork: Fork, rel: str, src: str | None = None) -> set[str]:
    """The repository files that test file or helper ``rel`` needs next to it: the modules
    it imports from its test folder (or from a folder it puts on sys.path), the files and
    folders it names by os.path.join from its own folder, and the folder's conftest.py.
    ``src``: its source as exported (else the file's)."""
    root = fork.root.resolve()
    path = root / rel
    test_dir = next((root / d for d in TEST_DIRS if rel.startswith(d + "/")), path.parent)
    deps: set[Path] = set()
    import_dirs = [path.parent, test_dir]
    tree = ast.parse(path.read_text() if src is None else src, rel)
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("path.join")):
            continue
        parts = [a.value for a in node.args if isinstance(a, ast.Constant)
                 and isinstance(a.value, str)]
        if not parts:
            continue
        target = path.parent.joinpath(*parts).resolve()
        if not target.exists() and parts[0] != "..":  # a path from the repository's root
            target = root.joinpath(*parts).resolve()
        if target == root or root not in target.parents or test_dir.is_relative_to(target):
            continue
        if target.is_file():
            deps.add(target)
        elif target.is_dir():
            if target.is_relative_to(test_dir) or not any(target.glob("*.py")):
                deps.update(_files_under(target))
            else:  # a folder of modules put on sys.path: those it imports from there
                import_dirs.append(target)
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module] if isinstance(node, ast.ImportFrom) and node.module
                 and not node.level else [])
        for name in names:
            top = name.split(".")[0]
            for d in import_dirs:
                for cand in (d / f"{top}.py", d / top / "__init__.py"):
                    if cand.is_file() and cand.resolve() != path:
                        deps.add(cand.resolve())
    if (test_dir / "conftest.py").is_file() and path != test_dir / "conftest.py":
        deps.add(test_dir / "conftest.py")
    return {p.relative_to(root).as_posix() for p in deps}


def exported_tests(fork: Fork, steps: list[Step]) -> list[dict[str, bytes]]:
    """For each step, the test files (and what they need) an exported series has once that
    step is applied: {path: content}. A test enters with the step it is marked for (a
    stack's test without a step, with its stack's last step); a test file enters with its
    first test and grows by the tests of later steps; a test this base leaves out is in no
    file. What a test file needs (helpers, its folder's conftest.py, files it reads) enters
    with the first file that needs it, at its final content."""
    tests, _ = collect_marked_tests(fork)
    kept, _ = tests_of_base(fork, tests, steps)
    index = {s.name: i for i, s in enumerate(steps)}
    last = {st[0].stack: index[st[-1].name] for _, st in stacks_of(steps)}
    at: dict[str, dict[str, int]] = {}  # test file -> {top-level test: step index}
    for t in kept:
        rel, name = t.nodeid.split("::", 1)
        at.setdefault(rel, {})[name] = index[t.step] if t.step else last[t.stack]
    version = tuple(int(p) for p in fork.pin["version"].split(".")[:3])
    released: dict[str, str] = {}  # file -> its source with this release's branches only
    deps_of: dict[tuple[str, str], set[str]] = {}

    def content(rel: str, i: int) -> bytes:
        """File ``rel`` as the export has it after step i."""
        data = (fork.root / rel).read_bytes()
        if not rel.endswith(".py"):
            return data
        if rel not in released:
            released[rel] = release_source(data.decode(), rel, version)
        src, name = released[rel], rel.rsplit("/", 1)[-1]
        if name.startswith("test_") and any(rel.startswith(d + "/") for d in TEST_DIRS):
            carried = {n for n, j in at.get(rel, {}).items() if j <= i}
            src = exported_test_source(src, rel, carried)
        elif name == "conftest.py":
            cut = src.find(EXPORT_CUT)
            if cut >= 0:
                src = src[:src.rfind("\n", 0, cut) + 1].rstrip("\n") + "\n"
        return src.encode()

    out: list[dict[str, bytes]] = []
    for i in range(len(steps)):
        # what the files need, as exported: a helper only removed code used is not carried
        files: dict[str, bytes] = {}
        todo = sorted(rel for rel, names in at.items() if min(names.values()) <= i)
        while todo:
            rel = todo.pop()
            if rel in files:
                continue
            files[rel] = content(rel, i)
            if rel.endswith(".py"):
                key = (rel, files[rel].decode())
                if key not in deps_of:
                    deps_of[key] = test_file_deps(fork, rel, key[1])
                todo += sorted(deps_of[key])
        out.append(dict(sorted(files.items())))
    return out


def export(fork: Fork, outdir: Path, force: bool = False) -> list[str]:
    """OUTDIR/NN-stack/: the stack's patches (git am, in order) and cover-letter.md.
    A reviewer applies stacks 1..k-1 and reviews stack k.  Each exported patch is the
    step's patch plus the tests it is marked for, in the repository's test layout, and
    what they need (exported_tests); the series is built by `git am` of every step onto
    a fresh copy of the wheel, so an export never holds a patch that does not apply."""
    outdir = Path(outdir)
    prepare_dest(outdir, force)
    steps = read_series(fork)
    for stack_dir, _ in stacks_of(steps):
        letter = fork.patches_dir / stack_dir / "cover-letter.md"
        if not letter.is_file():
            raise ForkError(f"{fork.rel(letter)} is missing: each stack is "
                            "a pull request and needs its description")
    carried = exported_tests(fork, steps)
    mails = []
    with tempfile.TemporaryDirectory(prefix="fork-export-") as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        create_base(fork, tree)
        before: dict[str, bytes] = {}
        contents = step_contents(fork, steps)
        modules = _Modules(tree)
        for s, files in zip(steps, carried):
            apply_step(tree, s, contents.get(s.name))
            changed = sorted(r for r, data in files.items() if before.get(r) != data)
            for rel in changed:
                (tree / rel).parent.mkdir(parents=True, exist_ok=True)
                (tree / rel).write_bytes(files[rel])
            if changed:
                git(tree, "add", "--", *changed)
                git(tree, "commit", "-q", "--amend", "--no-edit", "--allow-empty")
            check_step_names(tree, files, s.line, modules)
            before = files
            mails.append(git(tree, "format-patch", "-1", "--stdout", "--zero-commit",
                             "--no-signature", "HEAD").stdout)
        verify_modules(fork, tree, steps)
    if outdir.exists():
        shutil.rmtree(outdir)
    outdir.mkdir(parents=True)
    written = []
    for stack_dir, st in stacks_of(steps):
        (outdir / stack_dir).mkdir()
        shutil.copy2(fork.patches_dir / stack_dir / "cover-letter.md",
                     outdir / stack_dir / "cover-letter.md")
    numbers: dict[str, int] = {}
    for s, mail in zip(steps, mails):  # numbered by place: another base's own steps too
        numbers[s.stack_dir] = numbers.get(s.stack_dir, 0) + 1
        line = f"{s.stack_dir}/{numbers[s.stack_dir]:04d}-{s.name}.patch"
        (outdir / line).write_text(mail, errors="surrogateescape")
        written.append(line)
    (outdir / "series").write_text("".join(w + "\n" for w in written))
    tests = sum(1 for r in carried[-1] if r.rsplit("/", 1)[-1].startswith("test_"))
    print(f"exported {len(written)} patches in {len(stacks_of(steps))} stacks into {outdir}, "
          f"with {tests} test files and {len(carried[-1]) - tests} files they need; apply "
          f"onto a clean tree stack by stack: git am {outdir}/01-*/*.patch, ...",
          file=sys.stderr)
    return written
