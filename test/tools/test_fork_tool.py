"""Tests for tools/fork.py against a tiny fake upstream wheel (no network, CPU only)."""
import base64
import csv
import hashlib
import importlib.util
import io
import json
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
MODEL = "".join(f"line {i}\n" for i in range(1, 41))
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
    pin = {"name": "sglang", "version": "0.5.17", "local_version": "yoco.3",
           "wheels": {"cp311-x86_64": spec, fork.interpreter_key(): spec}}
    (root / "tools" / "upstream.json").write_text(json.dumps(pin))
    return fork.Fork(root=root, cache_dir=cache)


def add_patch(f, name, text, modules=""):
    (f.root / "patches" / name).write_text(text)
    with open(f.root / "patches" / "series", "a") as s:
        s.write(f"{name} {modules}\n")


def add_module(f, rel, text):
    p = f.root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)


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


def format_patch(tmp_path, edit, subject) -> str:
    """Make a real `git format-patch` mail for `edit(tree)` on pristine upstream."""
    repo = pristine_repo(tmp_path / "authoring")
    edit(repo)
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", subject)
    out = git(repo, "format-patch", "-1", "--stdout")
    shutil.rmtree(repo)
    return out


OFFSET_PATCH = """\
From: Dev <dev@example.invalid>
Subject: [PATCH] fix(gemma): tweak line 22

---
diff --git a/python/sglang/srt/models/gemma.py b/python/sglang/srt/models/gemma.py
--- a/python/sglang/srt/models/gemma.py
+++ b/python/sglang/srt/models/gemma.py
@@ -10,3 +10,3 @@ class Gemma:
 line 21
-line 22
+line 22 patched
 line 23
-- 
2.43.0
"""


def test_patch_applies_with_offset(env, tmp_path):
    add_patch(env, "0001-gemma.patch", OFFSET_PATCH)
    res = fork.materialize(env, tmp_path / "out")
    text = (tmp_path / "out/python/sglang/srt/models/gemma.py").read_text()
    assert text == MODEL.replace("line 22\n", "line 22 patched\n")
    assert res.patches[0].subject == "fix(gemma): tweak line 22"
    assert (tmp_path / "out/python/sglang/srt/server/_core.cpython-311-x86_64-linux-gnu.so"
            ).stat().st_mode & 0o111


def test_bad_hunk_names_patch_file_hunk(env, tmp_path):
    bad = OFFSET_PATCH.replace(" line 23\n", " line 23\n+new\n", 1).replace(
        "@@ -10,3 +10,3 @@", "@@ -10,3 +10,4 @@").replace(" line 21\n", " line 2l\n")
    add_patch(env, "0001-ok.patch", OFFSET_PATCH.replace("22", "30").replace("line 21", "line 29")
              .replace("line 23", "line 31"))
    add_patch(env, "0002-bad.patch", bad)
    with pytest.raises(fork.ForkError) as e:
        fork.materialize(env, tmp_path / "out")
    msg = str(e.value)
    assert "0002-bad.patch" in msg and "python/sglang/srt/models/gemma.py" in msg
    assert "hunk #1 @@ -10,3 +10,4 @@ class Gemma:" in msg
    # the context line that did not match, located at the best partial match (offset 11)
    assert "gemma.py:21: expected 'line 2l\\n', found 'line 21\\n'" in msg
    assert not (tmp_path / "out").exists()  # no half tree
    assert not list(tmp_path.glob(".out.tmp-*"))
    # CLI: non-zero exit and the same message
    assert fork.main(["materialize", str(tmp_path / "out")], fork=env) == 1


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
    add_patch(env, "0001-gemma.patch", OFFSET_PATCH)
    add_module(env, "python/sglang/srt/yoco.py", "YOCO = 1\n")
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
        assert b"line 22 patched" in z.read("sglang/srt/models/gemma.py")
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


def test_export_git_am_equals_materialize(env, tmp_path):
    def edit(repo):
        p = repo / "python/sglang/srt/nonl.py"
        p.write_text(p.read_text().replace("b\n", "b2\n") + " edited")
        (repo / "python/sglang/srt/old.py").unlink()
        (repo / "python/sglang/srt/created.py").write_text("CREATED = True\n")
    add_patch(env, "0001-gemma.patch", OFFSET_PATCH, "python/sglang/srt/layers/")
    add_patch(env, "0002-misc.patch", format_patch(tmp_path, edit, "chore: misc edits\n\nbody"))
    add_module(env, "python/sglang/srt/layers/yoco.py", "X = 1\n")
    add_module(env, "python/sglang/srt/layers/nonl.py", "no trailing newline")
    add_module(env, "python/sglang/srt/extra.py", "EXTRA = 2\n")
    add_module(env, "python/sglang/srt/empty.py", "")
    mat = fork.materialize(env, tmp_path / "mat").dest
    assert not (mat / "python/sglang/srt/old.py").exists()
    assert (mat / "python/sglang/srt/nonl.py").read_text() == "a\nb2\nlast without newline edited"

    names = fork.export(env, tmp_path / "exp")
    assert names == ["0001-fix-gemma-tweak-line-22.patch", "0002-chore-misc-edits.patch",
                     "0003-feat-add-remaining-fork-modules.patch"]
    assert (tmp_path / "exp/series").read_text().split() == names
    first = (tmp_path / "exp" / names[0]).read_text()
    assert "From: Dev <dev@example.invalid>" in first and fork.FIXED_DATE in first
    assert "index 0000000.." + fork.git_blob_sha(b"X = 1\n") in first

    repo = pristine_repo(tmp_path / "am")
    git(repo, "am", *[str(tmp_path / "exp" / n) for n in names])
    log = git(repo, "log", "--format=%s|%an", "-3").splitlines()
    assert log == ["feat: add remaining fork modules|SGLang YOCO fork",
                   "chore: misc edits|Test", "fix(gemma): tweak line 22|Dev"]
    shutil.rmtree(repo / ".git")
    files = lambda d: {p.relative_to(d).as_posix(): p.read_bytes()  # noqa: E731
                       for p in d.rglob("*") if p.is_file()}
    assert files(repo) == files(mat)


def test_overlay_lists_only_changed_and_new(env, tmp_path):
    add_patch(env, "0001-gemma.patch", OFFSET_PATCH)
    add_module(env, "python/sglang/srt/yoco.py", "Y = 1\n")
    changed = fork.overlay(env, tmp_path / "ov")
    assert changed == ["sglang/srt/models/gemma.py", "sglang/srt/yoco.py"]
    got = sorted(p.relative_to(tmp_path / "ov").as_posix()
                 for p in (tmp_path / "ov").rglob("*") if p.is_file())
    assert got == changed


def test_new_module_colliding_with_upstream_errors(env, tmp_path):
    add_module(env, "python/sglang/srt/models/gemma.py", "copied\n")
    with pytest.raises(fork.ForkError, match=r"srt/models/gemma.py also exists upstream"):
        fork.materialize(env, tmp_path / "out")


def test_refuses_non_empty_dest(env, tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out/keep").write_text("x")
    with pytest.raises(fork.ForkError, match="--force"):
        fork.materialize(env, tmp_path / "out")
    fork.materialize(env, tmp_path / "out", force=True)
    assert not (tmp_path / "out/keep").exists()


def test_cli_check_diffstat_upto(env, tmp_path, capsys):
    add_patch(env, "0001-gemma.patch", OFFSET_PATCH)
    add_patch(env, "0002-bad.patch", OFFSET_PATCH.replace(" line 21\n", " nope\n"))
    assert fork.main(["check"], fork=env) == 1
    assert "0002-bad.patch" in capsys.readouterr().err
    assert fork.main(["diffstat"], fork=env) == 0
    assert "python/sglang/srt/models/gemma.py  +1 -1" in capsys.readouterr().out
    # --upto stops before the named patch (for reworking it)
    assert fork.main(["materialize", "--upto", "0002-bad.patch", str(tmp_path / "m")],
                     fork=env) == 0
    assert "line 22 patched" in (tmp_path / "m/python/sglang/srt/models/gemma.py").read_text()


def test_real_series_exports_with_git_am_equal_to_materialize(tmp_path):
    """The project's own series: `export` applied with `git am` onto pristine
    0.5.17 gives exactly what `materialize` gives (uses the cached wheel that
    `make install` downloaded)."""
    real = fork.Fork()
    mat, exp, pristine = tmp_path / "mat", tmp_path / "exp", tmp_path / "pristine"
    fork.main(["materialize", str(mat)], fork=real)
    fork.main(["export", str(exp)], fork=real)
    wheel = next(real.cache_dir.glob("sglang-0.5.17-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        members = [m for m in z.namelist() if m.startswith("sglang/")]
        z.extractall(pristine / "python", members)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(pristine)]
    subprocess.run(git + ["init", "-q"], check=True)
    subprocess.run(git + ["add", "-A"], check=True)
    subprocess.run(git + ["commit", "-qm", "sglang 0.5.17"], check=True)
    patches = sorted(str(p) for p in exp.glob("*.patch"))
    assert len(patches) >= 10
    subprocess.run(git + ["am", "-q"] + patches, check=True)
    diff = subprocess.run(
        ["diff", "-r", "-q", "-x", ".git", str(pristine / "python"), str(mat / "python")],
        capture_output=True, text=True,
    )
    assert diff.returncode == 0, diff.stdout
