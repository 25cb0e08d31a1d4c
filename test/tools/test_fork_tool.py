"""Tests for tools/fork.py against a tiny fake upstream wheel (no network, CPU only)."""
import base64
import csv
import hashlib
import importlib.util
import io
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("fork", REPO / "tools" / "fork.py")
fork = importlib.util.module_from_spec(_spec)
sys.modules["fork"] = fork  # dataclasses look the module up while the class is built
_spec.loader.exec_module(fork)

WHEEL_NAME = "sglang-0.5.17-cp311-cp311-manylinux_2_34_x86_64.whl"
MODEL = "".join(f"line{i} = {i}\n" for i in range(1, 41))
UPSTREAM = {
    "sglang/__init__.py": "__version__ = '0.5.17'\n",
    "sglang/srt/models/gemma.py": MODEL,
    "sglang/srt/old.py": "to be deleted\nsecond\n",
    "sglang/srt/nonl.py": "a\nb\nlast without newline",
    "sglang/srt/server/_core.cpython-311-x86_64-linux-gnu.so": b"\x7fELF\x00\x01binary",
}
DIST = "sglang-0.5.17.dist-info/"
DIST_FILES = {
    "METADATA": "Metadata-Version: 2.4\nName: sglang\nVersion: 0.5.17\nSummary: fake\n",
    "WHEEL": "Wheel-Version: 1.0\nGenerator: fake\nRoot-Is-Purelib: false\n"
             "Tag: cp311-cp311-manylinux_2_34_x86_64\n",
    "entry_points.txt": "[console_scripts]\nsglang = sglang.cli:main\n",
    "top_level.txt": "sglang\n",
    "licenses/LICENSE": "Apache-2.0\n",
    "RECORD": "stale,,\n",
}
GIT_ID = ["-c", "user.name=Test", "-c", "user.email=test@example.invalid",
          "-c", "commit.gpgsign=false", "-c", "core.autocrlf=false"]


def git(cwd, *args):
    return subprocess.run(["git", *GIT_ID, *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


def make_wheel(path: Path) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in UPSTREAM.items():
            info = zipfile.ZipInfo(name)
            if name.endswith(".so"):
                info.external_attr = 0o100755 << 16
            z.writestr(info, data)
        for name, data in DIST_FILES.items():
            z.writestr(DIST + name, data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(buf.getvalue())
    return buf.getvalue()


@pytest.fixture
def env(tmp_path):
    """A fake fork repo + pin + pre-seeded cache; returns a fork.Fork."""
    root, cache = tmp_path / "repo", tmp_path / "cache"
    data = make_wheel(tmp_path / "remote" / WHEEL_NAME)
    cache.mkdir()
    shutil.copy(tmp_path / "remote" / WHEEL_NAME, cache / WHEEL_NAME)
    spec = {"filename": WHEEL_NAME, "sha256": hashlib.sha256(data).hexdigest(),
            "url": (tmp_path / "remote" / WHEEL_NAME).as_uri()}
    (root / "tools").mkdir(parents=True)
    (root / "patches").mkdir()
    (root / "patches" / "series").write_text("# series\n")
    (root / "test" / "srt").mkdir(parents=True)
    pin = {"name": "sglang", "version": "0.5.17", "local_version": "yoco.3",
           "wheels": {"cp311-x86_64": spec, fork.interpreter_key(): spec}}
    (root / "tools" / "upstream.json").write_text(json.dumps(pin))
    return fork.Fork(root=root, cache_dir=cache)


def pristine_repo(path: Path) -> Path:
    """A git checkout of pristine upstream in the upstream layout (python/sglang/...)."""
    for name, data in UPSTREAM.items():
        p = path / "python" / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data if isinstance(data, bytes) else data.encode())
    git(path, "init", "-q")
    git(path, "add", "-A")
    git(path, "commit", "-qm", "upstream")
    return path


def add_step(f, line, edit, subject, body="Why it is needed.", letter=True):
    """Author step `line` (NN-stack/NNNN-name.patch) the way a developer does: materialize,
    commit the edit, import."""
    with open(f.patches_dir / "series", "a") as s:
        s.write(line + "\n")
    if letter:
        d = f.patches_dir / line.split("/")[0]
        d.mkdir(parents=True, exist_ok=True)
        (d / "cover-letter.md").write_text(f"# {line.split('/')[0]}\n")
    tree = f.root.parent / "edit"
    fork.materialize(f, tree, upto=line, force=True, quiet=True)
    edit(tree)
    git(tree, "add", "-A")
    git(tree, "commit", "-qm", f"{subject}\n\n{body}")
    fork.import_tree(f, tree)
    shutil.rmtree(tree)


def write(rel, text):
    def edit(tree):
        p = tree / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return edit


def both(*edits):
    def edit(tree):
        for e in edits:
            e(tree)
    return edit


GEMMA = "python/sglang/srt/models/gemma.py"
YOCO = "python/sglang/srt/yoco.py"


@pytest.fixture
def two_stacks(env):
    add_step(env, "01-fixes/0001-gemma-line-22.patch",
             write(GEMMA, MODEL.replace("line22 = 22\n", "line22 = 'patched'\n")), "fix(gemma): line 22")
    add_step(env, "02-yoco/0001-yoco-module.patch", write(YOCO, "X = 1\n"), "feat(yoco): module")
    add_step(env, "02-yoco/0002-yoco-grows.patch",
             both(write(YOCO, "X = 1\nY = X + 1\n"), lambda t: (t / "python/sglang/srt/old.py").unlink()),
             "feat(yoco): module grows")
    return env


def test_each_step_carries_its_modules_at_that_steps_content(two_stacks, tmp_path):
    env = two_stacks
    assert [s.id for s in fork.read_series(env)] == [
        "fixes/gemma-line-22", "yoco/yoco-module", "yoco/yoco-grows"]
    # python/ holds the final content, once: the step that adds the module names it, and
    # the later step that changes it records only the lines its change replaced
    assert (env.root / YOCO).read_text() == "X = 1\nY = X + 1\n"
    first = (env.root / "patches/02-yoco/0001-yoco-module.patch").read_text()
    assert f"\n{fork.ADDS_HEADER}: {YOCO}\n" in first and "X = 1" not in first
    grows = (env.root / "patches/02-yoco/0002-yoco-grows.patch").read_text()
    assert "yoco.py" not in grows and "+++ /dev/null" in grows  # old.py's removal stays
    record = json.loads((env.root / "patches/02-yoco/0002-yoco-grows.replaced.json").read_text())
    [[at, size, old, pre, post, anchor]] = record[YOCO]["replaced"]
    # line 2 is new, found by the hash of it and its line of context; no final text kept
    assert (at, size, old, pre, post) == (1, 1, [], 1, 0) and len(anchor) == 64
    part = fork.materialize(env, tmp_path / "part", upto="yoco-grows")
    assert (part.dest / YOCO).read_text() == "X = 1\n"
    assert (part.dest / "python/sglang/srt/old.py").exists()
    full = fork.materialize(env, tmp_path / "full")
    assert (full.dest / YOCO).read_text() == "X = 1\nY = X + 1\n"
    assert not (full.dest / "python/sglang/srt/old.py").exists()
    assert "line22 = 'patched'" in (full.dest / GEMMA).read_text()
    assert full.created == [YOCO]
    log = git(full.dest, "log", "--format=%s", f"{fork.BASE_TAG}..").split("\n")[:3]
    assert log == ["feat(yoco): module grows", "feat(yoco): module", "fix(gemma): line 22"]
    assert (full.dest / "python/sglang/srt/server/_core.cpython-311-x86_64-linux-gnu.so"
            ).stat().st_mode & 0o111


def test_a_module_is_edited_in_place_and_lands_in_its_step(two_stacks, tmp_path):
    """An edit of a module under python/ lands in the step that adds it, also where a
    later step changes the module, unless it is on the lines that step changed (or their
    context): then the record says so (rework through materialize, rebase, import); a
    file no step adds is refused."""
    big = "python/sglang/srt/big.py"
    lines = "".join(f"B{i} = {i}\n" for i in range(12))
    add_step(two_stacks, "03-big/0001-big.patch", write(big, lines), "feat: big")
    (two_stacks.root / big).write_text('"""Doc."""\n' + lines)
    full = fork.materialize(two_stacks, tmp_path / "full")
    assert git(full.dest, "show", f"HEAD:{big}") == '"""Doc."""\n' + lines
    assert git(full.dest, "show", f"HEAD~1:{YOCO}") == "X = 1\nY = X + 1\n"
    # above and below the lines the later step changed: both land in the adding step
    (two_stacks.root / YOCO).write_text('"""Doc."""\nX = 1\nY = X + 1\n# end\n')
    moved = fork.materialize(two_stacks, tmp_path / "moved")
    assert git(moved.dest, "show", f"HEAD~2:{YOCO}") == '"""Doc."""\nX = 1\n# end\n'
    assert (moved.dest / YOCO).read_text() == '"""Doc."""\nX = 1\nY = X + 1\n# end\n'
    (two_stacks.root / YOCO).write_text("X = 1\nY = X + 2\n")
    with pytest.raises(fork.ForkError, match=r"yoco.py \(step 02-yoco/0002-yoco-grows.patch\): "
                                              "the lines that step changed near line 2"):
        fork.materialize(two_stacks, tmp_path / "out")
    (two_stacks.root / YOCO).write_text("X = 1\nY = X + 1\n")
    (two_stacks.root / "python/sglang/srt/stray.py").write_text("")
    with pytest.raises(fork.ForkError, match="python/sglang/srt/stray.py is added by no step"):
        fork.materialize(two_stacks, tmp_path / "out")
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.tmp-*"))
    # a new file written into a patch is refused: it lives under python/
    p = two_stacks.root / "patches/01-fixes/0001-gemma-line-22.patch"
    p.write_text(p.read_text() + "diff --git a/python/x.py b/python/x.py\nnew file mode 100644\n")
    assert any("adds a file inside the patch" in m
               for m in fork.lint_series(fork.read_series(two_stacks)))
    # and so is a later step's change to a module an earlier step adds: it is a record
    g = two_stacks.root / "patches/02-yoco/0002-yoco-grows.patch"
    g.write_text(g.read_text() + f"diff --git a/{YOCO} b/{YOCO}\n--- a/{YOCO}\n+++ b/{YOCO}\n")
    assert any(f"changes {YOCO}, a module an earlier step adds" in m
               for m in fork.lint_series(fork.read_series(two_stacks)))


def test_a_step_that_does_not_apply_names_itself(two_stacks, tmp_path):
    p = two_stacks.root / "patches/01-fixes/0001-gemma-line-22.patch"
    p.write_text(p.read_text().replace(" line21 = 21\n", " line21 = 0\n"))
    with pytest.raises(fork.ForkError) as e:
        fork.materialize(two_stacks, tmp_path / "out")
    assert "01-fixes/0001-gemma-line-22.patch does not apply" in str(e.value)
    assert "models/gemma.py" in str(e.value)
    assert fork.main(["check"], fork=two_stacks) == 1


def test_series_lint_flags_empty_messages_and_history(env):
    add_step(env, "01-a/0001-one.patch", write(YOCO, "A = 1\n"), "feat: one", body="")
    add_step(env, "01-a/0002-two.patch", write(YOCO, "A = 2\n"), "perf: two",
             body="Faster on the H200 (run 14). Not yet measured.")
    problems = "\n".join(fork.lint_series(fork.read_series(env)))
    assert "0001-one.patch: empty commit message" in problems
    assert "H200" in problems and "run" in problems and "not yet measured" in problems
    assert fork.main(["check"], fork=env) == 1


def test_series_rejects_interleaved_stacks(env):
    (env.root / "patches/series").write_text("01-a/0001-x.patch\n02-b/0001-y.patch\n"
                                              "01-a/0002-z.patch\n")
    with pytest.raises(fork.ForkError, match="listed together"):
        fork.read_series(env, need_files=False)


def test_export_writes_a_folder_per_stack_that_git_am_applies(two_stacks, tmp_path):
    names = fork.export(two_stacks, tmp_path / "exp")
    assert names == ["01-fixes/0001-gemma-line-22.patch", "02-yoco/0001-yoco-module.patch",
                     "02-yoco/0002-yoco-grows.patch"]
    assert (tmp_path / "exp/01-fixes/cover-letter.md").read_text() == "# 01-fixes\n"
    repo = pristine_repo(tmp_path / "am")
    for stack in ("01-fixes", "02-yoco"):  # stack by stack, as a reviewer does
        git(repo, "am", *sorted(str(p) for p in (tmp_path / "exp" / stack).glob("*.patch")))
    mat = fork.materialize(two_stacks, tmp_path / "mat").dest
    files = lambda d: {p.relative_to(d).as_posix(): p.read_bytes()  # noqa: E731
                       for p in d.rglob("*") if p.is_file() and ".git" not in p.parts}
    assert files(repo) == files(mat)
    (two_stacks.root / "patches/02-yoco/cover-letter.md").unlink()
    with pytest.raises(fork.ForkError, match="02-yoco/cover-letter.md is missing"):
        fork.export(two_stacks, tmp_path / "exp2")


def test_export_carries_each_steps_tests_and_what_they_need(two_stacks, tmp_path):
    """An exported series is what a reviewer runs: each patch adds the tests marked for
    its step (a stack's test without a step with the stack's last step), the helpers and
    conftest.py they need with the first test that needs them, without the fork's own
    pytest.mark.stack and conftest selection, and without tests this base leaves out."""
    srt = two_stacks.root / "test" / "srt"
    (srt / "conftest.py").write_text(
        "import sys\n\nFIXTURE = 1\n\n\n"
        f"# ---- {fork.EXPORT_CUT}\nimport fork_tool\n")
    (srt / "helper.py").write_text("H = 2\n")
    (srt / "unused_helper.py").write_text("U = 3\n")
    (srt / "test_gemma_fix.py").write_text(
        "import pytest\n\n"
        'pytestmark = pytest.mark.stack("fixes")\n\n\n'
        "def test_line_22():\n    assert True\n")
    (srt / "test_yoco.py").write_text(
        "import pytest\n\nfrom helper import H\n\n\n"
        '@pytest.mark.stack("yoco", step="yoco-module", fails_before=True)\n'
        "def test_module():\n    assert H == 2\n\n\n"
        "# grows\n"
        '@pytest.mark.stack("yoco", step="yoco-grows")\n'
        "def test_grows():\n    assert True\n\n\n"
        '@pytest.mark.stack("yoco", step="yoco-grows", bases=("0.5.23",))\n'
        "def test_elsewhere():\n    assert False\n")
    (two_stacks.root / "bases" / "0.5.23").mkdir(parents=True)
    (two_stacks.root / "bases/0.5.23/upstream.json").write_text(
        json.dumps({**two_stacks.pin, "version": "0.5.23"}))
    fork.export(two_stacks, tmp_path / "exp")
    exp = tmp_path / "exp"

    def added(patch):
        return re.findall(r"^diff --git a/(\S+)", (exp / patch).read_text(), re.M)

    assert added("01-fixes/0001-gemma-line-22.patch") == [
        GEMMA, "test/srt/conftest.py", "test/srt/test_gemma_fix.py"]
    assert added("02-yoco/0001-yoco-module.patch") == [
        YOCO, "test/srt/helper.py", "test/srt/test_yoco.py"]
    assert added("02-yoco/0002-yoco-grows.patch")[-1] == "test/srt/test_yoco.py"
    repo = pristine_repo(tmp_path / "am")
    git(repo, "am", *sorted(str(p) for p in (exp / "01-fixes").glob("*.patch")))
    assert (repo / "test/srt/conftest.py").read_text() == "import sys\n\nFIXTURE = 1\n"
    assert "stack" not in (repo / "test/srt/test_gemma_fix.py").read_text()
    git(repo, "am", str(exp / "02-yoco/0001-yoco-module.patch"))
    first = (repo / "test/srt/test_yoco.py").read_text()
    assert "def test_module" in first and "grows" not in first
    git(repo, "am", str(exp / "02-yoco/0002-yoco-grows.patch"))
    last = (repo / "test/srt/test_yoco.py").read_text()
    assert "def test_module" in last and "# grows\ndef test_grows" in last
    assert "test_elsewhere" not in last and "pytest.mark.stack" not in last
    assert not (repo / "test/srt/unused_helper.py").exists()
    compile(last, "test_yoco.py", "exec")


def test_import_round_trips_and_rewrites_only_what_changed(two_stacks, tmp_path):
    tree = fork.materialize(two_stacks, tmp_path / "edit").dest
    assert fork.import_tree(two_stacks, tree) == []  # format-patch of git am is identical
    # rework the first yoco step under the later one, as `git rebase -i` leaves it
    git(tree, "checkout", "-q", "-b", "rework", "HEAD~1")
    (tree / "python/sglang/srt/extra.py").write_text("E = 1\n")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "--amend", "--no-edit")
    git(tree, "cherry-pick", "main")
    assert fork.import_tree(two_stacks, tree) == ["02-yoco/0001-yoco-module.patch"]
    assert (two_stacks.root / YOCO).read_text() == "X = 1\nY = X + 1\n"
    assert (two_stacks.root / "python/sglang/srt/extra.py").read_text() == "E = 1\n"
    assert f"{fork.ADDS_HEADER}: python/sglang/srt/extra.py\n" in (
        two_stacks.root / "patches/02-yoco/0001-yoco-module.patch").read_text()
    fork.materialize(two_stacks, tmp_path / "again")
    (two_stacks.root / "patches/series").write_text("01-fixes/0001-gemma-line-22.patch\n")
    with pytest.raises(fork.ForkError, match="3 commits after fork-base, patches/series lists 1"):
        fork.import_tree(two_stacks, tree)


def marked_test(env, name, body, mark):
    (env.root / "test/srt" / name).write_text(
        f"import pytest\n\npytestmark = pytest.mark.stack({mark})\n\n\n{body}")


def mark_step_and_stack_tests(env):
    """A step test of yoco-grows (which must fail before it) and a stack test of fixes."""
    marked_test(env, "test_yoco.py", "def test_y():\n    from sglang.srt import yoco\n"
                "    assert yoco.Y == 2\n", '"yoco", step="yoco-grows", fails_before=True')
    marked_test(env, "test_fix.py", "def test_fix():\n    import sglang, pathlib\n"
                "    p = pathlib.Path(sglang.__file__).parent / 'srt/models/gemma.py'\n"
                "    assert 'patched' in p.read_text()\n", '"fixes"')


def test_check_each_runs_each_steps_tests_on_its_tree(two_stacks):
    env = two_stacks
    mark_step_and_stack_tests(env)
    lines = []
    reports = fork.check_each(env, log=lines.append)
    assert [(r.step.name, r.tests, r.proofs) for r in reports] == [
        ("gemma-line-22", 1, []), ("yoco-module", 0, []),
        ("yoco-grows", 1, ["test/srt/test_yoco.py::test_y"])]
    assert lines[-1].startswith("ok 02-yoco/0002-yoco-grows.patch: 1 modules import, 1 tests")
    # make test: the suite runs the whole series next, so the last step's tests are left
    # to it; its proof still fails just before it
    lines = []
    reports = fork.check_each(env, last_stack_in_suite=True, log=lines.append)
    assert [(r.step.name, r.tests, r.proofs) for r in reports] == [
        ("gemma-line-22", 1, []), ("yoco-module", 0, []),
        ("yoco-grows", 0, ["test/srt/test_yoco.py::test_y"])]
    assert ("1 tests of 02-yoco/0002-yoco-grows.patch (its own and its stack's) are left to "
            "the suite, which runs them on the same tree") in lines
    # a soak runs in the suite only: no step's check runs it, even one that would fail
    marked_test(env, "test_soak.py", "def test_soak():\n    assert False\n",
                '"fixes", suite_only=True')
    reports = fork.check_each(env, log=lambda m: None)
    assert [r.tests for r in reports] == [1, 0, 1]
    marked_test(env, "test_soak.py", "def test_soak():\n    pass\n",
                '"fixes", step="gemma-line-22", suite_only=True')
    with pytest.raises(fork.ForkError, match="suite_only test is checked by no step"):
        fork.check_each(env, log=lambda m: None)


def test_an_untested_stack_at_the_end_leaves_the_last_tested_stack_to_the_suite(two_stacks):
    """make test: a fork-only stack no test is marked for (a benchmark hook) comes last;
    the suite runs the whole series, so the end of the stack before it runs there only."""
    env = two_stacks
    mark_step_and_stack_tests(env)
    add_step(env, "03-bench/0001-bench-hook.patch",
             write("python/sglang/srt/bench_hook.py", "ON = False\n"), "feat(bench): hook")
    lines = []
    reports = fork.check_each(env, last_stack_in_suite=True, log=lines.append)
    assert [(r.step.name, r.tests, r.proofs) for r in reports] == [
        ("gemma-line-22", 1, []), ("yoco-module", 0, []),
        ("yoco-grows", 0, ["test/srt/test_yoco.py::test_y"]), ("bench-hook", 0, [])]
    assert ("1 tests of 02-yoco/0002-yoco-grows.patch (its own and its stack's) are left to "
            "the suite, which runs them on the whole series (the steps after it carry no "
            "tests)") in lines
    # without the option, every step's and stack's tests run on their own tree
    reports = fork.check_each(env, log=lambda m: None)
    assert [r.tests for r in reports] == [1, 0, 1, 0]
    # once the last stack has a test of its own, only its end is left to the suite
    marked_test(env, "test_bench.py", "def test_b():\n    pass\n", '"bench"')
    reports = fork.check_each(env, last_stack_in_suite=True, log=lambda m: None)
    assert [r.tests for r in reports] == [1, 0, 1, 0]


def test_stack_tests_can_be_left_to_the_suite(two_stacks):
    """make test: the stacks' tests without a step run in the suite only; each step's
    own tests and proofs still run at the step."""
    env = two_stacks
    mark_step_and_stack_tests(env)
    lines = []
    reports = fork.check_each(env, stack_tests_in_suite=True, log=lines.append)
    assert [(r.step.name, r.tests, r.proofs) for r in reports] == [
        ("gemma-line-22", 0, []), ("yoco-module", 0, []),
        ("yoco-grows", 1, ["test/srt/test_yoco.py::test_y"])]
    assert ("1 stack tests of fixes are left to the suite, which runs them on the whole "
            "series") in lines


def second_base(env, version="0.5.99") -> "fork.Fork":
    """bases/VERSION/ next to the default base (same fake wheel, its own empty series)."""
    d = env.root / "bases" / version
    (d / "patches").mkdir(parents=True)
    (d / "patches" / "series").write_text("")
    pin = {**env.pin, "version": version}
    (d / "upstream.json").write_text(json.dumps(pin))
    return fork.Fork(root=env.root, cache_dir=env.cache_dir, base=version)


def test_a_second_base_ports_some_stacks_and_shares_the_modules(two_stacks, tmp_path):
    env = two_stacks
    assert fork.Fork(root=env.root, cache_dir=env.cache_dir, base="0.5.17").base is None
    with pytest.raises(fork.ForkError, match=r"no base '9.9'.*other bases: none"):
        fork.Fork(root=env.root, base="9.9")
    other = second_base(env)
    assert other.patches_dir == env.root / "bases/0.5.99/patches"
    mark_step_and_stack_tests(env)
    # one step, where the default base needed two: its module is the shared one
    add_step(other, "02-yoco/0001-yoco-module.patch", write(YOCO, "X = 1\nY = X + 1\n"),
             "feat(yoco): module")
    assert not (other.own_python / "sglang").exists()
    lines = []
    reports = fork.check_each(other, log=lines.append)
    # the fixes stack is not ported: its test is counted, not run; yoco-grows is not a
    # step there (upstream has it), so its test runs with the stack and must pass
    assert lines[0] == "1 tests left out, of stacks not ported to sglang 0.5.99 yet: fixes"
    assert [(r.step.name, r.tests, r.proofs) for r in reports] == [("yoco-module", 1, [])]
    # a module that has to differ on this base is its own copy; the shared one stays
    add_step(other, "02-yoco/0002-yoco-differs.patch", write(YOCO, "X = 2\n"),
             "feat(yoco): differs here")
    assert (other.own_python / "sglang/srt/yoco.py").read_text() == "X = 2\n"
    assert (env.root / YOCO).read_text() == "X = 1\nY = X + 1\n"
    fork.materialize(other, tmp_path / "out")
    fork.materialize(env, tmp_path / "default")
    (other.own_python / "sglang/srt/stray.py").write_text("")
    with pytest.raises(fork.ForkError, match="bases/0.5.99/python/sglang/srt/stray.py is added by no step"):
        fork.materialize(other, tmp_path / "out2")


def test_a_base_without_a_later_stack_keeps_the_shared_module_as_it_was_there(two_stacks,
                                                                              tmp_path):
    """A later stack of the default base edits a shared module; a base that has not ported
    that stack leaves the module as the default series has it before that stack, and needs
    no copy of that earlier content."""
    env = two_stacks
    add_step(env, "03-more/0001-yoco-more.patch", write(YOCO, "X = 1\nY = X + 1\nZ = 3\n"),
             "feat(yoco): more")
    other = second_base(env)
    add_step(other, "02-yoco/0001-yoco-module.patch", write(YOCO, "X = 1\nY = X + 1\n"),
             "feat(yoco): module")
    assert not (other.own_python / "sglang").exists()
    fork.materialize(other, tmp_path / "out")  # verifies the mirror
    # content the default series never has at those stacks is this base's own copy
    add_step(other, "02-yoco/0002-yoco-differs.patch", write(YOCO, "X = 1\nY = 2\n"),
             "feat(yoco): differs here")
    assert (other.own_python / "sglang/srt/yoco.py").read_text() == "X = 1\nY = 2\n"
    (other.own_python / "sglang/srt/yoco.py").unlink()
    with pytest.raises(fork.ForkError, match=r"0002-yoco-differs.patch\): the lines that step changed"):
        fork.materialize(other, tmp_path / "out2")


def test_a_base_holds_only_the_steps_and_files_that_differ_there(two_stacks, tmp_path):
    """Another base is a delta: a step whose change is the default base's applies from
    the default base's patch (no copy); a step that differs in one file keeps only that
    file's change and takes the others from the default base's patch."""
    env = two_stacks
    other = second_base(env)
    (other.patches_dir / "series").write_text(
        "01-fixes/0001-gemma-line-22.patch\n02-yoco/0001-yoco-module.patch\n")
    tree = fork.materialize(env, tmp_path / "default").dest
    git(tree, "reset", "-q", "--hard", "HEAD~1")  # this base's series: the first two steps
    fork.import_tree(other, tree)
    assert not list(other.patches_dir.glob("*/*.patch"))  # both are the default's
    # the same step on this base changes gemma.py as the default does, and old.py too
    git(tree, "checkout", "-q", f"{fork.BASE_TAG}~0")
    edit = MODEL.replace("line22 = 22\n", "line22 = 'patched'\n")
    (tree / GEMMA).write_text(edit)
    (tree / "python/sglang/srt/old.py").write_text("to be deleted\nchanged here\n")
    git(tree, "commit", "-qam", "fix(gemma): line 22\n\nWhy it is needed here.")
    (tree / YOCO).write_text("X = 1\n")
    git(tree, "add", "-A")
    git(tree, "commit", "-qm", "feat(yoco): module\n\nWhy it is needed.")
    fork.import_tree(other, tree)
    own = other.patches_dir / "01-fixes/0001-gemma-line-22.patch"
    text = own.read_text()
    assert f"{fork.SHARED_HEADER}: {GEMMA}" in text and "line22" not in text
    assert "+changed here" in text
    assert not (other.patches_dir / "02-yoco/0001-yoco-module.patch").exists()
    out = fork.materialize(other, tmp_path / "out").dest
    assert (out / GEMMA).read_text() == edit
    assert git(out, "log", "--format=%T") == git(tree, "log", "--format=%T")
    # a message of its own over the same change is kept, with no diff
    git(tree, "checkout", "-q", f"{fork.BASE_TAG}~0")
    (tree / GEMMA).write_text(edit)
    git(tree, "commit", "-qam", "fix(gemma): line 22\n\nSaid for this release.")
    (tree / YOCO).write_text("X = 1\n")
    git(tree, "add", "-A")
    git(tree, "commit", "-qm", "feat(yoco): module\n\nWhy it is needed.")
    fork.import_tree(other, tree)
    text = own.read_text()
    assert "Said for this release." in text and "diff --git" not in text
    out = fork.materialize(other, tmp_path / "out", force=True).dest
    assert git(out, "log", "--format=%T") == git(tree, "log", "--format=%T")


def test_compare_finds_the_same_trees_across_a_change_of_layout(two_stacks, tmp_path):
    """compare REV exports at REV with REV's own tool and here, and compares every step's
    tree: a change that keeps the steps passes, one that changes a step names it."""
    env = two_stacks
    for part in ("fork.py", "forklib"):
        src = REPO / "tools" / part
        (shutil.copytree if src.is_dir() else shutil.copy)(src, env.root / "tools" / part)
    for d in ("01-fixes", "02-yoco"):
        (env.root / "patches" / d / "cover-letter.md").write_text(f"# {d}\n")
    git(env.root, "init", "-q")
    git(env.root, "add", "-A")
    git(env.root, "commit", "-qm", "before")
    p = env.patches_dir / "02-yoco/0002-yoco-grows.patch"
    p.write_text(p.read_text().replace("Why it is needed.", "Why it is needed, said again."))
    assert "same tree at each of their 3 steps" in fork.compare_exports(env, "HEAD")
    fix = env.patches_dir / "01-fixes/0001-gemma-line-22.patch"
    fix.write_text(fix.read_text().replace("+line22 = 'patched'", "+line22 = 'other'"))
    with pytest.raises(fork.ForkError, match="differ at:\n  01-fixes/0001-gemma-line-22.patch"):
        fork.compare_exports(env, "HEAD")


def test_a_stack_ported_in_part_leaves_out_the_tests_of_its_steps_not_ported_yet(two_stacks):
    """A base that has a stack in part declares each step it lacks yet (a comment in its
    series): that step's tests and the stack's tests without a step are left out and
    counted; a step neither listed nor declared is upstream's, and its tests run."""
    env = two_stacks
    mark_step_and_stack_tests(env)  # test_y: step yoco-grows; test_f: stack fixes
    marked_test(env, "test_stack.py", "def test_s():\n    assert False\n", '"yoco"')
    other = second_base(env)
    add_step(other, "02-yoco/0001-yoco-module.patch", write(YOCO, "X = 1\n"), "feat(yoco): module")
    series = other.patches_dir / "series"
    series.write_text(series.read_text()
                      + "# not yet ported: 02-yoco/0002-yoco-grows.patch\n")
    lines = []
    reports = fork.check_each(other, log=lines.append)
    assert lines[0] == ("3 tests left out, of stacks not ported to sglang 0.5.99 yet: fixes; "
                        "2 of steps not ported yet (yoco)")
    assert [(r.step.name, r.tests) for r in reports] == [("yoco-module", 0)]
    for bad, why in (("02-yoco/0009-nothing.patch", "not a step of the default series"),
                     ("01-fixes/0001-gemma-line-22.patch", "its stack is not in this series"),
                     ("02-yoco/0001-yoco-module.patch", "this series has that step")):
        series.write_text("02-yoco/0001-yoco-module.patch\n# not yet ported: " + bad + "\n")
        with pytest.raises(fork.ForkError, match=why):
            fork.check_each(other, log=lambda m: None)


def test_a_test_of_one_release_runs_on_that_base_only(two_stacks):
    """bases=: a test of upstream code only one release has (here a step only the second
    base's series has) runs there, its proof included; the other base leaves it out and
    counts it. A release that is no base is an error."""
    env = two_stacks
    other = second_base(env)
    add_step(other, "02-yoco/0001-yoco-module.patch", write(YOCO, "X = 1\n"), "feat(yoco): module")
    add_step(other, "02-yoco/0002-newer-fix.patch", write(YOCO, "X = 1\nZ = 3\n"),
             "fix(yoco): code only the newer release has")
    marked_test(env, "test_newer.py", "def test_z():\n    from sglang.srt import yoco\n"
                "    assert yoco.Z == 3\n",
                '"yoco", step="newer-fix", fails_before=True, bases=("0.5.99",)')
    lines = []
    reports = fork.check_each(env, log=lines.append)
    assert lines[0] == "1 tests left out, 1 marked for other releases only (0.5.99)"
    assert sum(r.tests for r in reports) == 0 and not any(r.proofs for r in reports)
    reports = fork.check_each(other, log=lambda m: None)
    assert [(r.step.name, r.tests, r.proofs) for r in reports] == [
        ("yoco-module", 0, []), ("newer-fix", 1, ["test/srt/test_newer.py::test_z"])]
    marked_test(env, "test_newer.py", "def test_z():\n    pass\n", '"yoco", bases=("9.9",)')
    with pytest.raises(fork.ForkError, match=r"bases=\['9.9'\] are not releases of this fork "
                                              r"\(0.5.17, 0.5.99\)"):
        fork.check_each(env, log=lambda m: None)


def test_check_each_with_two_jobs_checks_each_step_on_its_own_tree(two_stacks):
    """--jobs 2: the same steps, tests and proofs as one at a time, each on its own tree
    (a stack test runs after its stack, a step test on its step, a proof just before)."""
    env = two_stacks
    mark_step_and_stack_tests(env)
    marked_test(env, "test_stack.py", "def test_s():\n    from sglang.srt import yoco\n"
                "    assert yoco.Y == 2\n", '"yoco"')
    lines = []
    reports = fork.check_each(env, jobs=2, log=lines.append)
    assert [(r.step.name, r.tests, r.proofs) for r in reports] == [
        ("gemma-line-22", 1, []), ("yoco-module", 0, []),
        ("yoco-grows", 2, ["test/srt/test_yoco.py::test_y"])]
    assert "  1 stack tests of test/srt/test_stack.py pass after 02-yoco/0002-yoco-grows.patch" in lines
    assert sorted(line.split(":")[0] for line in lines if line.startswith("ok ")) == [
        "ok 01-fixes/0001-gemma-line-22.patch", "ok 02-yoco/0001-yoco-module.patch",
        "ok 02-yoco/0002-yoco-grows.patch"]
    # a stack test that needs a later step fails its stack's check, also with two jobs
    # (by what it reads: one that names a later step's module fails before any test runs)
    marked_test(env, "test_stack.py", "def test_s():\n    import sglang, pathlib\n"
                "    assert (pathlib.Path(sglang.__file__).parent / 'srt/yoco.py').exists()\n",
                '"fixes"')
    with pytest.raises(fork.ForkError, match="01-fixes/0001-gemma-line-22.patch: its tests fail"):
        fork.check_each(env, jobs=2, log=lambda m: None)


HELPERS = """import pytest


def _y():
    from sglang.srt.yoco import Y
    return Y


@pytest.mark.stack("yoco", step="yoco-module")
def test_x():
    from sglang.srt.yoco import X
    assert X == 1{uses_y}


@pytest.mark.stack("yoco", step="yoco-grows")
def test_y():
    assert _y() == 2
"""


def test_a_helper_enters_with_the_first_test_that_uses_it(two_stacks):
    """A step's exported tests name only what its tree has: a helper that names a later
    step's code is carried from the step whose test uses it; a test (or a helper it
    uses) that names it earlier fails check --each statically, naming file, name, step."""
    env = two_stacks
    srt = env.root / "test/srt"
    (srt / "test_helpers.py").write_text(HELPERS.format(uses_y=""))
    steps = fork.read_series(env)
    files = [f.get("test/srt/test_helpers.py", b"").decode() for f in fork.exported_tests(env, steps)]
    assert files[0] == "" and "def test_x" in files[1]
    assert "_y" not in files[1] and "import pytest" not in files[1]
    assert "def _y():" in files[2] and "def test_y" in files[2]
    fork.check_each(env, run_tests=False, log=lambda m: None)
    (srt / "test_helpers.py").write_text(HELPERS.format(uses_y="\n    assert _y() == 2"))
    with pytest.raises(fork.ForkError, match=r"test/srt/test_helpers.py:2: sglang.srt.yoco.Y "
                                             r"is not in the tree of step 02-yoco/0001-yoco-module"):
        fork.check_each(env, run_tests=False, log=lambda m: None)


def test_step_names_resolve_modules_names_submodules_and_module_attributes(two_stacks, tmp_path):
    tree = fork.materialize(two_stacks, tmp_path / "t", quiet=True).dest
    src = ("import sglang.srt.models.gemma\nfrom sglang.srt import models, yoco\n"
           "from sglang.srt.yoco import X, Y, Z\nfrom sglang.srt import gone\n"
           "def f():\n    import sglang.srt.missing as m\n    return yoco.X + yoco.W + yoco.__name__\n")
    assert fork.step_name_problems(tree, {"test/srt/t.py": src.encode()}, "last") == [
        f"test/srt/t.py:{n}: sglang.srt.{name} is not in the tree of step last"
        for n, name in ((3, "yoco.Z"), (4, "gone"), (6, "missing"), (7, "yoco.W"))]


def test_export_keeps_only_its_releases_branch():
    src = ("from release import RELEASE\n\n\ndef f():\n    if RELEASE >= (0, 5, 23):\n"
           "        # new\n        from sglang.srt import new\n        return new.x\n"
           "    else:\n        return 1\n\n\ndef g():\n    if not RELEASE < (0, 5, 23):\n"
           "        return 2\n\n\nCASES = (1,) + (() if RELEASE >= (0, 5, 23) else (3,))\n")
    old = fork.release_source(src, "t.py", (0, 5, 17))
    assert old == ("\n\ndef f():\n    return 1\n\n\ndef g():\n    pass\n\n\n"
                   "CASES = (1,) + ((3,))\n")
    new = fork.release_source(src, "t.py", (0, 5, 23))
    assert "from release import RELEASE" not in new and "return 1" not in new
    assert "def f():\n    # new\n    from sglang.srt import new\n    return new.x\n" in new
    assert "def g():\n    return 2\n" in new and "CASES = (1,) + (())\n" in new
    with pytest.raises(fork.ForkError, match="no elif"):
        fork.release_source("if RELEASE < (0, 5, 23):\n    a = 1\nelif x:\n    a = 2\n",
                            "t.py", (0, 5, 23))


def test_check_each_fails_a_test_that_passes_before_its_step(two_stacks):
    marked_test(two_stacks, "test_weak.py", "def test_w():\n    assert True\n",
                '"yoco", step="yoco-grows", fails_before=True')
    with pytest.raises(fork.ForkError, match="pass.*before step 02-yoco/0002-yoco-grows"):
        fork.check_each(two_stacks, log=lambda m: None)


def test_check_each_catches_an_import_of_a_later_step(env):
    add_step(env, "01-a/0001-uses-later.patch", write(YOCO, "from sglang.srt import later\n"),
             "feat: uses later")
    add_step(env, "01-a/0002-later.patch", write("python/sglang/srt/later.py", "L = 1\n"),
             "feat: later")
    fork.materialize(env, env.root.parent / "ok", quiet=True)  # the final tree is fine
    with pytest.raises(fork.ForkError, match="0001-uses-later.patch: a module it touches "
                                              "does not import"):
        fork.check_each(env, log=lambda m: None)


def test_check_each_imports_a_tested_steps_modules_in_its_tests_process(two_stacks):
    """A step with tests imports its touched modules in the tests' process (one sglang
    import, not two); a module that does not import still fails as such, even where the
    step's own test never imports it."""
    env = two_stacks
    marked_test(env, "test_grows.py", "def test_g():\n    pass\n", '"yoco", step="yoco-grows"')
    reports = fork.check_each(env, log=lambda m: None)
    assert [(r.step.name, r.imported, r.tests) for r in reports][-1] == ("yoco-grows", 1, 1)
    add_step(env, "02-yoco/0003-broken.patch", write(YOCO, "import not_a_module_anywhere\n"),
             "feat(yoco): broken import")
    marked_test(env, "test_broken.py", "def test_b():\n    pass\n", '"yoco", step="broken"')
    with pytest.raises(fork.ForkError, match="0003-broken.patch: a module it touches does "
                                              "not import:(.|\n)*not_a_module_anywhere"):
        fork.check_each(env, log=lambda m: None)


def test_check_each_wants_every_test_file_marked(two_stacks):
    (two_stacks.root / "test/srt/test_orphan.py").write_text("def test_o():\n    pass\n")
    with pytest.raises(fork.ForkError, match="no pytest.mark.stack.*test_orphan.py"):
        fork.check_each(two_stacks, log=lambda m: None)
    marked_test(two_stacks, "test_orphan.py", "def test_o():\n    pass\n", '"nope"')
    with pytest.raises(fork.ForkError, match="unknown stack 'nope'"):
        fork.check_each(two_stacks, log=lambda m: None)


def test_sha_mismatch_and_download(env, tmp_path):
    cached = env.cache_dir / WHEEL_NAME
    cached.write_bytes(cached.read_bytes() + b"junk")
    with pytest.raises(fork.ForkError, match="sha256 mismatch"):
        fork.fetch_wheel(env, "cp311-x86_64")
    assert not cached.exists()
    # cache now empty: downloads once from the (file://) url
    assert fork.fetch_wheel(env, "cp311-x86_64") == cached and cached.exists()
    # unreachable url: clear message with url and cache path
    cached.unlink()
    (tmp_path / "remote" / WHEEL_NAME).unlink()
    with pytest.raises(fork.ForkError) as e:
        fork.fetch_wheel(env, "cp311-x86_64")
    assert "could not be downloaded" in str(e.value) and str(cached) in str(e.value)
    assert "remote/" + WHEEL_NAME in str(e.value)


def test_install_wheel_record_and_version(env, tmp_path):
    add_step(env, "01-a/0001-gemma.patch", both(
        write(GEMMA, MODEL.replace("line22 = 22\n", "line22 = 'patched'\n")),
        write(YOCO, "YOCO = 1\n")), "fix: gemma")
    (env.root / "python/sglang/srt/__pycache__").mkdir()
    (env.root / "python/sglang/srt/__pycache__/yoco.cpython-311.pyc").write_bytes(b"x")
    res = fork.materialize(env, tmp_path / "tree")
    whl = fork.build_wheel(res.dest, res.wheel, env.pin, tmp_path / "dist")
    assert whl.name == "sglang-0.5.17+yoco.3-cp311-cp311-manylinux_2_34_x86_64.whl"
    with zipfile.ZipFile(whl) as z:
        names = set(z.namelist())
        di = "sglang-0.5.17+yoco.3.dist-info/"
        assert "Version: 0.5.17+yoco.3\n" in z.read(di + "METADATA").decode()
        assert z.read(di + "WHEEL").decode() == DIST_FILES["WHEEL"]
        assert {di + "entry_points.txt", di + "top_level.txt", di + "licenses/LICENSE"} <= names
        assert "sglang/srt/yoco.py" in names and not any("__pycache__" in n for n in names)
        assert b"line22 = 'patched'" in z.read("sglang/srt/models/gemma.py")
        rows = list(csv.reader(io.StringIO(z.read(di + "RECORD").decode())))
        assert {r[0] for r in rows} == names
        for path, digest, size in rows:
            if path == di + "RECORD":
                assert digest == size == ""
                continue
            data = z.read(path)
            b64 = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert digest == "sha256=" + b64 and int(size) == len(data)
        so = z.getinfo("sglang/srt/server/_core.cpython-311-x86_64-linux-gnu.so")
        assert (so.external_attr >> 16) & 0o111


def test_overlay_lists_only_changed_and_new(two_stacks, tmp_path):
    changed = fork.overlay(two_stacks, tmp_path / "ov")
    assert changed == ["sglang/srt/models/gemma.py", "sglang/srt/yoco.py"]
    got = sorted(p.relative_to(tmp_path / "ov").as_posix()
                 for p in (tmp_path / "ov").rglob("*") if p.is_file())
    assert got == changed


def test_refuses_non_empty_dest(env, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out/keep").write_text("x")
    with pytest.raises(fork.ForkError, match="--force"):
        fork.materialize(env, tmp_path / "out")
    fork.materialize(env, tmp_path / "out", force=True)
    assert not (tmp_path / "out/keep").exists()


def test_real_series_reads_as_stacks_and_exports_with_cover_letters(tmp_path):
    """The project's own series: named stacks in dependency order, each with its cover
    letter; the export applied stack by stack with `git am` onto pristine 0.5.17 gives
    exactly what `materialize` gives (uses the wheel `make install` cached)."""
    real = fork.Fork()
    steps = fork.read_series(real)
    assert [d for d, _ in fork.stacks_of(steps)] == [
        "01-cpu-reference", "02-generic-fixes", "03-yoco-flag", "04-yoco-model",
        "05-yoco-mtp", "06-frozen-kv-mtp-speed", "07-bench-support"]
    assert fork.lint_series(steps) == []
    mat, exp, pristine = tmp_path / "mat", tmp_path / "exp", tmp_path / "pristine"
    assert fork.main(["materialize", str(mat)], fork=real) == 0
    assert fork.main(["export", str(exp)], fork=real) == 0
    wheel = next(real.cache_dir.glob("sglang-0.5.17-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        members = [m for m in z.namelist() if m.startswith("sglang/")]
        z.extractall(pristine / "python", members)
    git(pristine, "init", "-q")
    git(pristine, "add", "-A")
    git(pristine, "commit", "-qm", "sglang 0.5.17")
    for stack, _ in fork.stacks_of(steps):
        letter = (exp / stack / "cover-letter.md").read_text()
        for section in ("## Motivation", "## Modifications", "## Accuracy Tests",
                        "## Benchmark & Profiling", "## Checklist"):
            assert section in letter, (stack, section)
        git(pristine, "am", "-q", *sorted(str(p) for p in (exp / stack).glob("*.patch")))
    diff = subprocess.run(
        ["diff", "-r", "-q", "-x", ".git", "-x", "__pycache__", str(pristine / "python"),
         str(mat / "python")], capture_output=True, text=True)
    assert diff.returncode == 0, diff.stdout
    # the exported series carries every test file the series' check runs
    kept, _ = fork.tests_of_base(real, fork.collect_marked_tests(real)[0], steps)
    assert sorted(p.relative_to(pristine).as_posix() for p in
                  (pristine / "test/srt").glob("test_*.py")) == sorted(
        {t.nodeid.split("::")[0] for t in kept})
    assert (pristine / "test/srt/conftest.py").is_file()


def test_preloaded_interpreter_runs_each_command_as_a_new_process_would(tmp_path):
    """check --each forks its Python runs from an interpreter that imported third-party
    modules first: each run still gets its own cwd, environment, sys.path, arguments and
    exit code, and loads sglang from its tree (never a copy loaded before the fork)."""
    tree = tmp_path / "tree" / "python" / "sglang"
    tree.mkdir(parents=True)
    (tree / "__init__.py").write_text("import os\nWHERE = __file__\nSEEN = os.environ['PROBE']\n")
    interp = fork._Interpreter(sys.executable, ["json", "email.message"], tmp_path)
    assert interp.proc is not None
    script = ("import os, sys, sglang\n"
              "print(sglang.WHERE, sglang.SEEN, sys.argv[1:], os.getcwd(), 'email.message' in sys.modules)\n"
              "print('to stderr', file=sys.stderr)\n"
              "sys.exit(int(sys.argv[1]))\n")
    env = dict(fork._tree_env(tmp_path / "tree"), PROBE="7")
    for rc in (0, 3):
        res = interp.run(["-c", script, str(rc), "x"], tmp_path, env)
        assert res.returncode == rc and res.stderr.strip().endswith("to stderr"), res
        assert res.stdout.split() == [str(tree / "__init__.py"), "7", f"['{rc}',", "'x']",
                                      str(tmp_path), "True"]
    res = interp.run(["-c", "raise ValueError('boom')"], tmp_path, env)
    assert res.returncode == 1 and "ValueError: boom" in res.stderr
    res = interp.run(["-m", "json.tool", "--help"], tmp_path, env)
    assert res.returncode == 0 and "usage:" in res.stdout
    interp.close()
    # a preload list that imports sglang itself: runs fall back to new processes
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sglang.py").write_text("")
    saved = dict(fork.os.environ)
    fork.os.environ["PYTHONPATH"] = str(tmp_path / "site")
    try:
        other = fork._Interpreter(sys.executable, ["sglang"], tmp_path)
    finally:
        fork.os.environ.clear()
        fork.os.environ.update(saved)
    assert other.proc is None
    res = other.run(["-c", script, "5", "y"], tmp_path, env)
    assert res.returncode == 5 and str(tree / "__init__.py") in res.stdout


def test_check_runs_cache_bytecode_never_a_stale_one(tmp_path):
    """check --each's runs cache the bytecode of what they import, the step's tree
    included; a checkout drops the entries of the files it changes, so a run never gets
    another version's code (not even one of the same size and mtime second), and the
    folders it empties, so a package it removes does not import."""
    check = sys.modules["forklib.check"]
    tree = tmp_path / "tree"
    pkg = tree / "python" / "sglang"
    (pkg / "sub" / "deeper").mkdir(parents=True)
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(git + ["init", "-q"], check=True)
    revs = []
    for v in ("1", "2"):
        (pkg / "__init__.py").write_text(f"V = {v}\n")
        for init in (pkg / "sub" / "__init__.py", pkg / "sub" / "deeper" / "__init__.py"):
            if v == "2":
                init.write_text("")
        subprocess.run(git + ["add", "-A"], check=True)
        subprocess.run(git + ["commit", "-q", "-m", v], check=True)
        revs.append(subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True,
                                   check=True).stdout.strip())
    interp = fork._Interpreter(sys.executable, ["json"], tmp_path)
    assert interp.proc is not None
    env = fork._tree_env(tree, write_bytecode=True)
    script = ("import sglang\ntry:\n    import sglang.sub.deeper\nexcept ImportError:\n"
              "    print(sglang.V, 'no sub')\nelse:\n    print(sglang.V, 'sub')\n")
    for rev, want in ((revs[0], "1 no sub"), (revs[1], "2 sub"), (revs[0], "1 no sub"),
                      (revs[0], "1 no sub"), (revs[1], "2 sub")):
        check._checkout(tree, rev)
        fork.os.utime(pkg / "__init__.py", (1e9, 1e9))  # one mtime for both versions
        res = interp.run(["-c", script], tmp_path, env)
        assert res.returncode == 0 and res.stdout.strip() == want, res
        assert list((pkg / "__pycache__").glob("__init__.*.pyc"))
    interp.close()


def test_a_base_lists_only_the_pins_that_differ(env):
    """A base's requirements-cpu.txt holds only its own pins; `requirements` writes the
    default base's list with those in place (and any new one at the end)."""
    (env.root / "requirements-cpu.txt").write_text("# cpu\naaa==1.0\nBbb_c==2.0\nccc==3.0\n")
    other = second_base(env)
    (other.base_dir / "requirements-cpu.txt").write_text("# differs\nbbb-c==2.5\nddd==4.0\n")
    assert fork.base_requirements(other) == "# cpu\naaa==1.0\nbbb-c==2.5\nccc==3.0\nddd==4.0\n"
    assert fork.base_requirements(env) == "# cpu\naaa==1.0\nBbb_c==2.0\nccc==3.0\n"
    assert fork.main(["--base", "0.5.99", "requirements", str(env.root / "r.txt")],
                     fork=other) == 0
    assert (env.root / "r.txt").read_text().splitlines()[2] == "bbb-c==2.5"


def test_every_real_module_can_be_edited_in_place(tmp_path):
    """Each of the project's new modules, on each base, takes a line appended in place:
    the series still builds every step's content, and the line is there from the step
    that adds the module on (no later step's record refuses the edit)."""
    root = tmp_path / "repo"
    for part in ("tools", "patches", "python", "bases"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    edited = sorted(p for p in root.glob("**/python/**/*.py"))
    for p in edited:
        p.write_text(p.read_text() + "# edited in place\n")
    for base in (None, *sorted(p.name for p in (root / "bases").iterdir() if p.is_dir())):
        f = fork.Fork(root=root, base=base)
        steps = fork.read_series(f)
        contents = fork.step_contents(f, steps)
        seen = {rel for mods in contents.values() for rel in mods}
        assert seen, base
        for name, mods in contents.items():
            for rel, data in mods.items():
                assert data.endswith(b"# edited in place\n"), (base, name, rel)
