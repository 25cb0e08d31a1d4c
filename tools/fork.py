#!/usr/bin/env python3
"""Build tool for the SGLang Gemma-4 fork: a pinned upstream wheel + PR stacks of patches.

The fork is not a copy of SGLang.  It is:
  * tools/upstream.json   the pinned upstream release: one wheel per interpreter, with sha256
  * patches/series        the steps in order, one `NN-stack/NNNN-slug.patch` a line ('#'
                          comments and blank lines ignored).  A stack is a folder of
                          patches/ that a reviewer takes as one pull request; stacks are
                          listed in dependency order, and each depends only on those above.
  * patches/NN-stack/     `git format-patch` mails, one concern each, plus cover-letter.md
                          (the pull request's description).  A patch carries everything its
                          step adds, new modules included, at the content they have at that
                          step: every step is a working tree.
  * python/...            the new modules at their final content, as plain files to read.
                          They are a mirror of what the series creates: `check` fails when
                          one differs, and `import` rewrites them.

Patches are applied with git's own `git am` onto a git repository of the wheel's files in
upstream's layout (python/sglang/...): exact context, line offsets tolerated, no fuzz, as a
reviewer applies them.  Nothing here re-implements patching.

Another upstream release is a base of its own, bases/VERSION/ (`--base VERSION`, before
the command): its pinned wheel, requirements, series, cover letters and the few new
modules that must differ there. Its series may not have every stack yet: tests of the
missing stacks are left out of its check and counted, as are tests marked for other
releases only (`bases=`: they test upstream code this release does not have). A stack
ported in part names each step it does not have yet in its series as a comment,
`# not yet ported: NN-stack/NNNN-name.patch` (the default series' line): that step's
tests, and its stack's tests without a step, are left out and counted. A step of a
ported stack that is neither listed nor declared so is one upstream already has (or that
this release does not need): its tests run with its stack's, as a regression check.

Commands (python3 tools/fork.py [--base VERSION] CMD --help):
  materialize DIR      the wheel's sglang/ as a git repo in DIR, one commit per step
  install              materialize into build/tree, build build/dist/sglang-V+local-*.whl,
                       pip install it into the venv (default .venv)
  check [--each]       materialize and verify the mirror; --each also checks every step:
                       byte-compile and import what it touches, run its tests (see below);
                       --jobs N checks N steps at once, each in a git worktree of its own
  export OUTDIR        one folder per stack: git-am-able patches + cover-letter.md; each
                       patch also adds its step's tests (test/srt/) and what they need
  import DIR           write DIR's commits back into the series (authoring, below)
  overlay DIR          only changed/new files as DIR/sglang/..., to copy over site-packages
  diffstat             files and +/- lines per step

Tests name the step they belong to with a marker that `check --each` reads statically:
    pytestmark = pytest.mark.stack("yoco-model")                    # the stack's last step
    @pytest.mark.stack("yoco-model", step="back-half-cuda-graphs")  # that step
    @pytest.mark.stack(..., fails_before=True)   # must fail before it (see below)
    @pytest.mark.stack("yoco-model", suite_only=True)  # a soak: in the suite only
    @pytest.mark.stack(..., bases=("0.5.23",))   # tests code only that release has
A stack's name is its folder without the number; a step's name is its patch file's
name without number and suffix.  Step tests run right after their step, stack tests
after the stack's last step.  `fails_before` ones also run on the tree just before
their step (a stack test: just before the stack's first step), where they must fail:
a test that passes before its feature exists tests nothing.  `suite_only` marks a soak
of the whole fork (minutes of mixed load): no step's check runs it, the suite does, and
its stack says on which bases it runs.  Every test file of
test/srt carries a marker, so no product test goes unowned.

Authoring (reworking any step, or adding one):
    python3 tools/fork.py materialize build/edit       # one commit per step
    cd build/edit
    git rebase -i fork-base     # edit/reword/insert commits; new files go in the commit
                                # of the step that adds them
    cd ../..
    # a new step: add its line to patches/series at its place first
    python3 tools/fork.py import build/edit            # rewrites patches + python/ mirror
    python3 tools/fork.py check --each
"""
from __future__ import annotations

import argparse
import ast
import base64
import concurrent.futures
import csv
import hashlib
import io
import json
import os
import platform
import queue
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FALLBACK_KEY = "cp311-x86_64"
BASE_TAG = "fork-base"
# Fixed identity and dates: materialized trees and their commits are reproducible.
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "sglang-fork", "GIT_AUTHOR_EMAIL": "sglang-fork@example.invalid",
    "GIT_COMMITTER_NAME": "sglang-fork", "GIT_COMMITTER_EMAIL": "sglang-fork@example.invalid",
    "GIT_AUTHOR_DATE": "2024-01-01T00:00:00+0000",
    "GIT_COMMITTER_DATE": "2024-01-01T00:00:00+0000",
}
TEST_DIRS = ("test/srt",)


class ForkError(Exception):
    """A user-facing failure; main() prints it and exits 1."""


@dataclass
class Fork:
    """Where things are; tests point this at a temp repo / pin / cache.

    ``base`` picks the upstream release the series is built on: None (or the default
    pin's version) is tools/upstream.json with patches/ and python/; another release
    lives in bases/VERSION/ (upstream.json, patches/, requirements-cpu.txt, and python/
    for the few new modules whose content differs there; the others are shared)."""
    root: Path = ROOT
    pin_path: Path | None = None
    cache_dir: Path | None = None
    base: str | None = None

    def __post_init__(self):
        self.root = Path(self.root)
        self.cache_dir = Path(self.cache_dir or os.environ.get("SGLANG_FORK_CACHE")
                              or Path.home() / ".cache" / "sglang-fork")
        default_pin = self.root / "tools" / "upstream.json"
        if self.base is not None and default_pin.is_file() and \
                self.base == json.loads(default_pin.read_text())["version"]:
            self.base = None
        if self.base is None:
            self.base_dir = self.root
            self.pin_path = Path(self.pin_path or default_pin)
        else:
            self.base_dir = self.root / "bases" / self.base
            if not (self.base_dir / "upstream.json").is_file():
                known = sorted(p.parent.name for p in (self.root / "bases").glob("*/upstream.json"))
                raise ForkError(f"no base {self.base!r}: bases/{self.base}/upstream.json does "
                                f"not exist (other bases: {', '.join(known) or 'none'})")
            self.pin_path = Path(self.pin_path or self.base_dir / "upstream.json")

    @property
    def pin(self) -> dict:
        return json.loads(self.pin_path.read_text())

    @property
    def patches_dir(self) -> Path:
        return self.base_dir / "patches"

    @property
    def own_mirror(self) -> Path:
        """Where this base's new modules live when they differ from the shared python/."""
        return self.base_dir / "python"

    def rel(self, path: Path) -> str:
        return Path(path).relative_to(self.root).as_posix()


# ----------------------------------------------------------------------------- wheel cache

def interpreter_key(version=None, machine=None) -> str:
    v = version or sys.version_info
    return f"cp{v[0]}{v[1]}-{machine or platform.machine()}"


def pick_key(fork: Fork, key: str | None, strict: bool) -> str:
    """Wheel key for this interpreter.  The .py files are identical across wheels, so
    non-install commands may fall back to another pinned wheel."""
    wheels = fork.pin["wheels"]
    key = key or interpreter_key()
    if key in wheels:
        return key
    if strict:
        raise ForkError(f"no upstream wheel is pinned for interpreter {key!r} in {fork.pin_path} "
                        f"(pinned: {', '.join(sorted(wheels))}); use a matching Python or pin one")
    fallback = FALLBACK_KEY if FALLBACK_KEY in wheels else sorted(wheels)[0]
    print(f"note: no wheel pinned for {key}; using {fallback} (same .py files)", file=sys.stderr)
    return fallback


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_wheel(fork: Fork, key: str) -> Path:
    """Return the cached, sha256-verified upstream wheel, downloading it once."""
    spec = fork.pin["wheels"][key]
    path = fork.cache_dir / spec["filename"]
    if not path.exists():
        fork.cache_dir.mkdir(parents=True, exist_ok=True)
        part = path.with_name(path.name + ".part")
        print(f"downloading {spec['url']}", file=sys.stderr)
        try:
            with urllib.request.urlopen(spec["url"], timeout=60) as r, open(part, "wb") as f:
                shutil.copyfileobj(r, f, 1 << 20)
        except (urllib.error.URLError, OSError) as e:
            part.unlink(missing_ok=True)
            raise ForkError(f"the upstream wheel could not be downloaded from {spec['url']} ({e}); "
                            f"check the network, or pre-seed the cache by placing the file at "
                            f"{path}") from None
        part.replace(path)
    got = sha256_file(path)
    if got != spec["sha256"]:
        path.unlink()
        raise ForkError(f"sha256 mismatch for {path}: expected {spec['sha256']}, got {got}; "
                        f"the file was deleted, run again to re-download")
    return path


def unpack_package(wheel: Path, name: str, dest: Path) -> None:
    """Extract the wheel's NAME/ into dest/python/NAME, keeping executable bits."""
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            if info.is_dir() or not info.filename.startswith(name + "/"):
                continue
            target = dest / "python" / safe_rel(info.filename)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(info))
            if (info.external_attr >> 16) & 0o111:
                target.chmod(0o755)


def safe_rel(path: str) -> Path:
    p = Path(path)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise ForkError(f"refusing unsafe path {path!r}")
    return p


# ----------------------------------------------------------------------------- series

STEP_RE = re.compile(r"^(\d\d)-([a-z0-9][a-z0-9-]*)/(\d{4})-([a-z0-9][a-z0-9-]*)\.patch$")


@dataclass
class Step:
    line: str       # as listed: 04-yoco-model/0002-yoco-gemma4-branch.patch
    stack_dir: str  # 04-yoco-model
    stack: str      # yoco-model
    name: str       # yoco-gemma4-branch
    path: Path

    @property
    def id(self) -> str:
        return f"{self.stack}/{self.name}"


def read_series(fork: Fork, need_files: bool = True) -> list[Step]:
    series = fork.patches_dir / "series"
    pd = fork.rel(fork.patches_dir)
    if not series.exists():
        raise ForkError(f"{series} does not exist")
    steps: list[Step] = []
    for n, line in enumerate(series.read_text().splitlines(), 1):
        line = line.split("#")[0].strip()
        if not line:
            continue
        m = STEP_RE.match(line)
        if not m:
            raise ForkError(f"{pd}/series:{n}: {line!r} is not NN-stack/NNNN-name.patch")
        step = Step(line, f"{m[1]}-{m[2]}", m[2], m[4], fork.patches_dir / line)
        if need_files and not step.path.is_file():
            raise ForkError(f"{pd}/series:{n} lists {line}, but {pd}/{line} does not exist")
        steps.append(step)
    seen_names: dict[str, str] = {}
    stack_order: list[str] = []
    for s in steps:
        if s.name in seen_names:
            raise ForkError(f"step name {s.name!r} is used twice ({seen_names[s.name]}, {s.line})")
        seen_names[s.name] = s.line
        if s.stack_dir not in stack_order:
            stack_order.append(s.stack_dir)
        elif stack_order[-1] != s.stack_dir:
            raise ForkError(f"{pd}/series: {s.line} comes after another stack; a stack's "
                            "steps must be listed together")
    if stack_order != sorted(stack_order):
        raise ForkError(f"{pd}/series: stacks must be listed in folder order: {stack_order}")
    listed = {s.line for s in steps}
    for p in sorted(fork.patches_dir.glob("*/*.patch")):
        rel = p.relative_to(fork.patches_dir).as_posix()
        if rel not in listed:
            print(f"warning: {pd}/{rel} is not listed in {pd}/series (ignored)",
                  file=sys.stderr)
    return steps


def stacks_of(steps: list[Step]) -> list[tuple[str, list[Step]]]:
    out: list[tuple[str, list[Step]]] = []
    for s in steps:
        if not out or out[-1][0] != s.stack_dir:
            out.append((s.stack_dir, []))
        out[-1][1].append(s)
    return out


def patch_message(path: Path) -> tuple[str, str]:
    """(subject, body) of a format-patch mail."""
    text = path.read_text(errors="surrogateescape")
    head, _, rest = text.partition("\n\n")
    subject = ""
    for m in re.finditer(r"^Subject: (.*(?:\n[ \t].*)*)", head, re.M):
        subject = re.sub(r"\s*\n\s+", " ", m[1])
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)
    body = rest.split("\n---\n", 1)[0] if "\n---\n" in rest else ""
    return subject, body.strip()


def lint_series(steps: list[Step]) -> list[str]:
    """Problems a reviewer would flag in the messages: empty bodies, history references."""
    problems = []
    for s in steps:
        subject, body = patch_message(s.path)
        if not subject:
            problems.append(f"{s.line}: no Subject")
        if not body:
            problems.append(f"{s.line}: empty commit message (say what and why)")
        for pat in (r"\brun \d+\b", r"\bruns \d+", r"\bH200\b", r"not yet measured",
                    r"\bpatch \d{4}\b"):
            if re.search(pat, subject + "\n" + body, re.I):
                problems.append(f"{s.line}: message cites {pat!r} (evidence goes in the "
                                "cover letter)")
    return problems


# ----------------------------------------------------------------------------- git trees

def git(cwd: Path, *args: str, check: bool = True, input: str | None = None
        ) -> subprocess.CompletedProcess:
    env = {**os.environ, **GIT_IDENTITY, "GIT_CONFIG_NOSYSTEM": "1"}
    cmd = ["git", "-c", "commit.gpgsign=false", "-c", "core.autocrlf=false",
           "-c", "init.defaultBranch=main", "-c", "gc.auto=0", *args]
    res = subprocess.run(cmd, cwd=cwd, env=env, input=input, capture_output=True, text=True,
                         errors="surrogateescape")
    if check and res.returncode:
        raise ForkError(f"git {' '.join(args)} failed in {cwd}:\n{res.stdout}{res.stderr}")
    return res


def prepare_dest(dest: Path, force: bool) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())) and not force:
        raise ForkError(f"{dest} exists and is not empty; pass --force to replace it")


def create_base(fork: Fork, dest: Path, key: str | None = None, strict: bool = False) -> Path:
    """The wheel's package as a git repository in upstream's layout, tagged fork-base."""
    pin = fork.pin
    wheel = fetch_wheel(fork, pick_key(fork, key, strict))
    unpack_package(wheel, pin["name"], dest)
    git(dest, "init", "-q")
    (dest / ".git" / "info").mkdir(parents=True, exist_ok=True)
    (dest / ".git" / "info" / "exclude").write_text("__pycache__/\n*.pyc\n")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", f"{pin['name']} {pin['version']} (wheel files)")
    git(dest, "tag", BASE_TAG)
    return wheel


def apply_step(tree: Path, step: Step) -> None:
    """`git am` one step; on failure leave the tree as it was and say why."""
    res = git(tree, "am", "-q", "--keep-cr", str(step.path), check=False)
    if res.returncode:
        git(tree, "am", "--abort", check=False)
        raise ForkError(f"step {step.line} does not apply (git am, exact context):\n"
                        f"{(res.stdout + res.stderr).strip()}\n"
                        "rebuild it on the steps before it: tools/fork.py materialize, "
                        "git rebase -i, tools/fork.py import")


def changed_files(tree: Path, rev_range: str) -> dict[str, str]:
    """{path: status letter} of what rev_range changes (A added, M modified, D deleted)."""
    out = git(tree, "diff", "--name-status", "--no-renames", rev_range).stdout
    return {line.split("\t", 1)[1]: line[0] for line in out.splitlines() if line}


@dataclass
class Materialized:
    dest: Path
    wheel: Path
    steps: list[Step]
    created: list[str] = field(default_factory=list)  # new files of the whole series


def materialize(fork: Fork, dest: Path, key: str | None = None, force: bool = False,
                strict: bool = False, quiet: bool = False, upto: str | None = None,
                check_mirror: bool = True) -> Materialized:
    """Apply the series (or the steps before ``upto``) onto the wheel in a git repo."""
    dest = Path(dest).resolve()
    prepare_dest(dest, force)
    steps = read_series(fork, need_files=not upto)
    if upto:  # stop before this step, to rework it (its patch may not exist yet)
        names = [s.line for s in steps] + [s.name for s in steps]
        if upto not in names:
            raise ForkError(f"--upto {upto}: not a step of {fork.rel(fork.patches_dir)}/series")
        steps = steps[:names.index(upto) % len(steps)]
        for s in steps:
            if not s.path.is_file():
                raise ForkError(f"the series lists {s.line}, but {fork.rel(s.path)} "
                                "does not exist")
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:  # build next to dest and swap in, so a failure leaves no half tree
        wheel = create_base(fork, tmp, key, strict)
        for s in steps:
            apply_step(tmp, s)
            if not quiet:
                print(f"applied {s.line}", file=sys.stderr)
        created = sorted(p for p, st in changed_files(tmp, f"{BASE_TAG}..HEAD").items()
                         if st == "A")
        if check_mirror and not upto:
            verify_mirror(fork, tmp, created)
        if dest.exists():
            shutil.rmtree(dest) if dest.is_dir() else dest.unlink()
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not quiet:
        print(f"materialized {fork.pin['name']} {fork.pin['version']} + {len(steps)} steps "
              f"into {dest}", file=sys.stderr)
    return Materialized(dest, wheel, steps, created)


def mirror_files(fork: Fork, base: Path | None = None) -> list[str]:
    """The files under ``base``/python (default: the shared python/), as python/... paths."""
    base = (fork.root if base is None else base) / "python"
    if not base.is_dir():
        return []
    return sorted(p.relative_to(base.parent).as_posix() for p in base.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def mirror_path(fork: Fork, rel: str) -> Path:
    """Where the mirror of a new file ``rel`` (python/...) is: this base's own copy if it
    has one, else the shared python/."""
    own = fork.base_dir / rel
    return own if fork.base is not None and own.is_file() else fork.root / rel


def shared_at_ported_stacks(fork: Fork, rel: str) -> bytes | None:
    """A shared new module as the default series leaves it after the stacks this base's
    series has: a base that has not ported a later stack that edits the module needs no
    copy of its earlier content. None when the default series does not create it."""
    default = Fork(root=fork.root, cache_dir=fork.cache_dir)
    ported = {s.stack_dir for s in read_series(fork, need_files=False)}
    steps = read_series(default)
    if all(s.stack_dir in ported for s in steps):
        shared = fork.root / rel
        return shared.read_bytes() if shared.is_file() else None
    with tempfile.TemporaryDirectory(prefix="staged-mirror-") as tmp:
        git(Path(tmp), "init", "-q")
        for s in steps:
            if s.stack_dir in ported:  # a patch not touching rel applies as a no-op
                git(Path(tmp), "apply", f"--include={rel}", str(s.path))
        out = Path(tmp) / rel
        return out.read_bytes() if out.is_file() else None


def expected_mirror(fork: Fork, rel: str) -> tuple[str, bytes | None]:
    """(where, content) a new module ``rel`` must have at the end of this base's series:
    the base's own copy if it has one, else the shared module at its ported stacks."""
    own = fork.base_dir / rel
    if fork.base is not None and own.is_file():
        return fork.rel(own), own.read_bytes()
    if fork.base is None:
        shared = fork.root / rel
        return rel, shared.read_bytes() if shared.is_file() else None
    return f"{rel} (at the ported stacks)", shared_at_ported_stacks(fork, rel)


def verify_mirror(fork: Fork, tree: Path, created: list[str]) -> None:
    """python/ must hold exactly the files the series creates, at their final content.
    Another base's series may create only some of them (a stack not ported there), or
    leave a module where the default series has it at the same stacks; it holds its own
    copy of a module only where upstream's API makes it differ."""
    shared = set(mirror_files(fork))
    own = set(mirror_files(fork, fork.base_dir)) if fork.base is not None else set()
    where = "python/" if fork.base is None else f"python/ or {fork.rel(fork.own_mirror)}/"
    problems = []
    for rel in created:
        if rel not in shared | own:
            problems.append(f"{rel} is created by the series but missing from {where}")
            continue
        path, content = expected_mirror(fork, rel)
        if content != (tree / rel).read_bytes():
            problems.append(f"{path} differs from what the series creates")
    unowned = (shared if fork.base is None else own) - set(created)
    for rel in sorted(unowned):
        problems.append(f"{rel} is in {fork.rel(fork.base_dir / 'python')}/ but no step "
                        "creates it")
    if problems:
        raise ForkError(f"{where} is not the series' new modules at their final content:\n  "
                        + "\n  ".join(problems) + "\nput the change into the step that "
                        "owns it (tools/fork.py materialize, git rebase -i, tools/fork.py "
                        "import); import rewrites the mirror")


def import_tree(fork: Fork, tree: Path) -> list[str]:
    """Write the commits after fork-base in ``tree`` back as the series' patches, in order,
    and python/ as the new modules at their final content."""
    tree = Path(tree)
    steps = read_series(fork, need_files=False)
    commits = git(tree, "rev-list", "--reverse", f"{BASE_TAG}..HEAD").stdout.split()
    if len(commits) != len(steps):
        raise ForkError(f"{tree} has {len(commits)} commits after {BASE_TAG}, "
                        f"{fork.rel(fork.patches_dir)}/series lists {len(steps)} steps: list a "
                        "new step in the series first "
                        "(or remove a dropped one)")
    written = []
    for sha, s in zip(commits, steps):
        mail = git(tree, "format-patch", "-1", "--stdout", "--zero-commit", "--no-signature",
                   sha).stdout
        s.path.parent.mkdir(parents=True, exist_ok=True)
        if not s.path.exists() or s.path.read_text(errors="surrogateescape") != mail:
            s.path.write_text(mail, errors="surrogateescape")
            written.append(s.line)
    created = sorted(p for p, st in changed_files(tree, f"{BASE_TAG}..HEAD").items()
                     if st == "A")
    if fork.base is None:
        for rel in mirror_files(fork):
            if rel not in created:
                (fork.root / rel).unlink()
    else:  # another base: its own copy only where the module differs from the shared one
        for rel in mirror_files(fork, fork.base_dir):
            (fork.base_dir / rel).unlink()
        created = [rel for rel in created
                   if expected_mirror(fork, rel)[1] != (tree / rel).read_bytes()]
    for rel in created:
        target = fork.base_dir / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(tree / rel, target)
    return written


# ----------------------------------------------------------------------------- install

def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def build_wheel(tree: Path, upstream_wheel: Path, pin: dict, out_dir: Path) -> Path:
    """Repack the materialized package with the upstream dist-info, versioned +local."""
    name, ver = pin["name"], pin["version"]
    full = f"{ver}+{pin['local_version']}"
    prefix = f"{name}-{ver}-"
    if not upstream_wheel.name.startswith(prefix):
        raise ForkError(f"unexpected upstream wheel name {upstream_wheel.name}")
    src_di, dst_di = f"{name}-{ver}.dist-info/", f"{name}-{full}.dist-info/"
    files: list[tuple[str, bytes, int]] = []
    pkg = Path(tree) / "python" / name
    for p in sorted(pkg.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc":
            mode = 0o755 if os.access(p, os.X_OK) else 0o644
            files.append((p.relative_to(pkg.parent).as_posix(), p.read_bytes(), mode))
    with zipfile.ZipFile(upstream_wheel) as z:
        for n in sorted(z.namelist()):
            rel = n[len(src_di):]
            if not n.startswith(src_di) or n.endswith("/") or rel in (
                    "RECORD", "INSTALLER", "REQUESTED", "direct_url.json"):
                continue
            data = z.read(n)
            if rel == "METADATA":
                text, count = re.subn(rf"^Version: {re.escape(ver)}$", f"Version: {full}",
                                      data.decode(), count=1, flags=re.M)
                if not count:
                    raise ForkError(f"METADATA in {upstream_wheel.name} has no 'Version: {ver}'")
                data = text.encode()
            files.append((dst_di + rel, data, 0o644))
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for arc, data, _ in files:
        writer.writerow([arc, record_hash(data), len(data)])
    writer.writerow([dst_di + "RECORD", "", ""])
    files.append((dst_di + "RECORD", record.getvalue().encode(), 0o644))

    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"{name}-{full}-{upstream_wheel.name[len(prefix):]}"
    tmp = out.with_name(out.name + ".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
        for arc, data, mode in files:  # fixed timestamps: reproducible wheel
            info = zipfile.ZipInfo(arc, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    tmp.replace(out)
    return out


def install(fork: Fork, venv: str, deps_check: bool = True) -> None:
    py = fork.root / venv / "bin" / "python"
    if not py.exists():
        raise ForkError(f"{py} not found; create the venv first (python3 -m venv {venv})")
    probe = ("import sys, platform; v = sys.version_info; "
             "print(f'cp{v[0]}{v[1]}-{platform.machine()}')")
    key = subprocess.run([py, "-c", probe], check=True, capture_output=True,
                         text=True).stdout.strip()
    key = pick_key(fork, key, strict=True)  # .so files must match the venv's interpreter
    res = materialize(fork, fork.root / "build" / "tree", key=key, force=True)
    whl = build_wheel(res.dest, res.wheel, fork.pin, fork.root / "build" / "dist")
    print(f"built {whl}", file=sys.stderr)
    subprocess.run([py, "-m", "pip", "install", "--no-deps", "--force-reinstall", str(whl)],
                   check=True)
    ver = subprocess.run([py, "-c", "import importlib.metadata as m;print(m.version('sglang'))"],
                         check=True, capture_output=True, text=True).stdout.strip()
    print(f"installed sglang {ver} into {venv}")
    if deps_check:  # we install --no-deps, so tell the user about unmet requirements
        chk = subprocess.run([py, "-m", "pip", "check"], capture_output=True, text=True)
        bad = [l for l in chk.stdout.splitlines() if l.lower().startswith("sglang ")]
        if bad:
            raise ForkError("sglang is installed but its dependencies are not satisfied:\n  "
                            + "\n  ".join(bad) + "\ninstall upstream's dependencies (e.g. pip "
                            f"install 'sglang=={fork.pin['version']}', then re-run this command) "
                            "or pass --no-deps-check")


# ----------------------------------------------------------------------------- per-step check

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


def python_modules(paths: list[str]) -> list[str]:
    """python/sglang/a/b.py -> sglang.a.b (packages by their __init__)."""
    mods = []
    for p in paths:
        if p.startswith("python/") and p.endswith(".py"):
            parts = p[len("python/"):-3].split("/")
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods.append(".".join(parts))
    return mods


COMPILE_PROBE = """\
import sys
for path in sys.argv[1:]:
    with open(path, encoding="utf-8") as f:
        compile(f.read(), path, "exec", dont_inherit=True)
"""
# Imports a step's touched modules (argv). With "--" and pytest's arguments after them, it
# does so in the process that runs the step's tests, once the tests' conftest has run, so
# the check starts Python and imports sglang (about 20 s of CPU) once for the step, not
# twice; a failed import then exits with IMPORT_FAILED.
IMPORT_FAILED = 90
IMPORT_PROBE = """\
import importlib, sys, traceback

def import_all(names):
    bad = 0
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:
            bad += 1
            print(f"import {name} failed:", file=sys.stderr)
            traceback.print_exc()
    return bad

if "--" not in sys.argv:
    sys.exit(1 if import_all(sys.argv[1:]) else 0)

import pytest
cut = sys.argv.index("--")
names, args = sys.argv[1:cut], sys.argv[cut + 1:]

class ImportTouched:
    def pytest_sessionstart(self, session):
        if import_all(names):
            pytest.exit("a module the step touches does not import", returncode=%d)

sys.exit(pytest.main(args, plugins=[ImportTouched()]))
""" % IMPORT_FAILED


# A check runs about a hundred short Python processes (one per step, one per proof), and
# each spent about 8 s of CPU importing the same third-party modules (torch, transformers,
# openai, ...) before the step's own code. A preloaded interpreter imports those once and
# forks a child per run; the child imports sglang and the tests from the step's tree as a
# fresh process would (nothing of sglang is loaded before the fork), with the run's
# working directory, environment, sys.path and arguments.
PRELOAD_PROBE = """\
import importlib, json, os, sys
tree = os.path.realpath(sys.argv[1])
for name in ["pytest", *sys.argv[2:]]:
    try:
        importlib.import_module(name)
    except BaseException:
        pass
names = []
for name, mod in list(sys.modules.items()):
    path = getattr(mod, "__file__", None)
    if name != "__main__" and path and not os.path.realpath(path).startswith(tree + os.sep):
        names.append(name)
print("PRELOAD " + json.dumps(names))
"""
# The preloaded interpreter: reads one JSON request a line on stdin, forks, and answers
# each with a JSON line ({"rc": N}) on the descriptor it got as argv[1].
PRELOADED = """\
import atexit, io, json, os, runpy, sys, threading, traceback
reply = os.fdopen(int(sys.argv[1]), "w")
base_path = [p for p in sys.path if p]
for name in json.loads(sys.stdin.readline()):
    try:
        __import__(name)
    except BaseException:
        pass
loaded = sorted(n for n in sys.modules if n == "sglang" or n.startswith("sglang."))
reply.write(json.dumps({"ready": not loaded, "loaded": loaded[:5]}) + "\\n")
reply.flush()

def child(req):
    for fd, path in ((1, req["stdout"]), (2, req["stderr"])):
        out = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(out, fd)
        os.close(out)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    reply.close()
    sys.stdin = io.TextIOWrapper(os.fdopen(0, "rb", closefd=False))
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    sys.dont_write_bytecode = bool(req["env"].get("PYTHONDONTWRITEBYTECODE"))
    extra = [p for p in req["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [""] + extra + base_path
    args = req["args"]
    code = 0
    try:
        if args[0] == "-c":
            sys.argv = ["-c", *args[2:]]
            exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = [args[1], *args[2:]]
            runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
        code = 1
    try:
        threading._shutdown()
        atexit._run_exitfuncs()
    finally:
        for f in (sys.stdout, sys.stderr):
            try:
                f.flush()
            except Exception:
                pass
        os._exit(code)

for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        child(req)
    _, status = os.waitpid(pid, 0)
    reply.write(json.dumps({"rc": os.waitstatus_to_exitcode(status)}) + "\\n")
    reply.flush()
"""


class _Interpreter:
    """Runs ``python ARGS`` for the check: forked from a preloaded interpreter when one
    could start (``preload``: the module names it imports first), else as a subprocess."""

    def __init__(self, python: str, preload: list[str] | None, tmp: Path):
        self.python, self.tmp, self.proc = python, tmp, None
        if not preload:
            return
        r, w = os.pipe()
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        proc = subprocess.Popen([python, "-c", PRELOADED, str(w)], stdin=subprocess.PIPE,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                pass_fds=(w,), env=env, text=True)
        os.close(w)
        self.replies = os.fdopen(r)
        proc.stdin.write(json.dumps(preload) + "\n")
        proc.stdin.flush()
        ready = self.replies.readline()
        if ready and json.loads(ready).get("ready"):
            self.proc = proc
        else:  # sglang got imported with the rest: children would not load the tree's
            self.close(proc)

    def run(self, args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
        if self.proc is None:
            return subprocess.run([self.python, *args], cwd=cwd, env=env, capture_output=True,
                                  text=True)
        out, err = (tempfile.mkstemp(dir=self.tmp, suffix=s)[1] for s in (".out", ".err"))
        self.proc.stdin.write(json.dumps({"args": args, "cwd": str(cwd), "env": env,
                                          "stdout": out, "stderr": err}) + "\n")
        self.proc.stdin.flush()
        rc = json.loads(self.replies.readline())["rc"]
        texts = [Path(f).read_text(errors="replace") for f in (out, err)]
        for f in (out, err):
            os.unlink(f)
        return subprocess.CompletedProcess([self.python, *args], rc, *texts)

    def close(self, proc=None) -> None:
        proc = proc or self.proc
        self.proc = None
        if proc is not None:
            proc.stdin.close()
            proc.wait()
            self.replies.close()


def preload_names(python: str, tree: Path, modules: list[str]) -> list[str]:
    """The modules outside ``tree`` that importing ``modules`` from it loads (in import
    order): what a preloaded interpreter imports before forking a step's runs."""
    res = subprocess.run([python, "-c", PRELOAD_PROBE, str(tree / "python"), *modules],
                         env=_tree_env(tree), capture_output=True, text=True)
    lines = [l for l in res.stdout.splitlines() if l.startswith("PRELOAD ")]
    return json.loads(lines[-1][len("PRELOAD "):]) if lines else []


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


def _tree_env(tree: Path) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(tree / "python")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _pytest(fork: Fork, interp: _Interpreter, tree: Path, nodeids: list[str],
            import_first: list[str] | None = None) -> subprocess.CompletedProcess:
    args = ["-q", "-p", "no:cacheprovider", "-x", *nodeids]
    if import_first:
        cmd = ["-c", IMPORT_PROBE, *import_first, "--", *args]
    else:
        cmd = ["-m", "pytest", *args]
    return interp.run(cmd, fork.root, _tree_env(tree))


def _checkout(tree: Path, rev: str) -> None:
    git(tree, "checkout", "-q", "--detach", "-f", rev)
    git(tree, "clean", "-q", "-f", "-d", "-x")


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
            res = interp.run(["-c", IMPORT_PROBE, *mods], cwd, _tree_env(tree))
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
        for s in steps:
            apply_step(tree, s)
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
        created = sorted(p for p, st in changed_files(tree, f"{BASE_TAG}..HEAD").items()
                         if st == "A")
        verify_mirror(fork, tree, created)
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


# ----------------------------------------------------------------------------- export

# conftest.py of a test folder: from the line with this text on, the fork's own test
# selection (which tests a base runs, in what order), which an exported series leaves out.
EXPORT_CUT = "the fork's own test selection (tools/fork.py export leaves it out)"


def _is_test_node(node) -> bool:
    return ((isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
             and node.name.startswith("test"))
            or (isinstance(node, ast.ClassDef) and node.name.startswith("Test")))


def _is_stack_mark(node) -> bool:
    return _stack_mark([node]) is not None


def exported_test_source(src: str, rel: str, carried: set[str]) -> str:
    """A test file as an exported series carries it: its top-level tests in ``carried``
    (the others removed, with their decorators) and no pytest.mark.stack, which only
    this fork's per-step check reads."""
    mod = ast.parse(src, rel)
    lines = src.splitlines(keepends=True)
    drop: set[int] = set()  # 0-based line numbers
    body = mod.body
    for i, node in enumerate(body):
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        if _is_test_node(node) and node.name not in carried:
            while start > 1 and lines[start - 2].lstrip().startswith("#"):
                start -= 1  # its own comment, right above it
            stop = body[i + 1].lineno - 1 if i + 1 < len(body) else len(lines)
            if i + 1 < len(body):  # up to the next statement's decorators or comments
                nxt = body[i + 1]
                stop = min([nxt.lineno] + [d.lineno for d in
                                           getattr(nxt, "decorator_list", [])]) - 1
                while stop > node.end_lineno and lines[stop - 1].lstrip().startswith("#"):
                    stop -= 1
                while stop > node.end_lineno and lines[stop - 1].strip():
                    stop -= 1
            drop.update(range(start - 1, max(stop, node.end_lineno)))
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
    kept = "".join(l for n, l in enumerate(lines) if n not in drop)
    return kept.rstrip("\n") + "\n" if kept.strip() else kept


def _files_under(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if p.is_file() and "__pycache__" not in p.parts
                  and p.suffix != ".pyc")


def test_file_deps(fork: Fork, rel: str) -> set[str]:
    """The repository files that test file or helper ``rel`` needs next to it: the modules
    it imports from its test folder (or from a folder it puts on sys.path), the files and
    folders it names by os.path.join from its own folder, and the folder's conftest.py."""
    root = fork.root.resolve()
    path = root / rel
    test_dir = next((root / d for d in TEST_DIRS if rel.startswith(d + "/")), path.parent)
    deps: set[Path] = set()
    import_dirs = [path.parent, test_dir]
    tree = ast.parse(path.read_text(), rel)
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
    deps_of: dict[str, set[str]] = {}

    def closure(rels):
        seen, todo = set(), list(rels)
        while todo:
            r = todo.pop()
            if r in seen:
                continue
            seen.add(r)
            if r.endswith(".py"):
                if r not in deps_of:
                    deps_of[r] = test_file_deps(fork, r)
                todo += deps_of[r]
        return seen

    out: list[dict[str, bytes]] = []
    for i in range(len(steps)):
        present = {rel for rel, names in at.items() if min(names.values()) <= i}
        files: dict[str, bytes] = {}
        for rel in sorted(closure(present)):
            src = (fork.root / rel).read_bytes()
            name = rel.rsplit("/", 1)[-1]
            if name.startswith("test_") and name.endswith(".py") and any(
                    rel.startswith(d + "/") for d in TEST_DIRS):
                carried = {n for n, j in at.get(rel, {}).items() if j <= i}
                src = exported_test_source(src.decode(), rel, carried).encode()
            elif name == "conftest.py":
                text = src.decode()
                cut = text.find(EXPORT_CUT)
                if cut >= 0:
                    src = text[:text.rfind("\n", 0, cut) + 1].rstrip("\n").encode() + b"\n"
            files[rel] = src
        out.append(files)
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
        for s, files in zip(steps, carried):
            apply_step(tree, s)
            changed = sorted(r for r, data in files.items() if before.get(r) != data)
            for rel in changed:
                (tree / rel).parent.mkdir(parents=True, exist_ok=True)
                (tree / rel).write_bytes(files[rel])
            if changed:
                git(tree, "add", "--", *changed)
                git(tree, "commit", "-q", "--amend", "--no-edit", "--allow-empty")
            before = files
            mails.append(git(tree, "format-patch", "-1", "--stdout", "--zero-commit",
                             "--no-signature", "HEAD").stdout)
        created = sorted(p for p, st in changed_files(tree, f"{BASE_TAG}..HEAD").items()
                         if st == "A" and p.startswith("python/"))
        verify_mirror(fork, tree, created)
    if outdir.exists():
        shutil.rmtree(outdir)
    outdir.mkdir(parents=True)
    written = []
    for stack_dir, st in stacks_of(steps):
        (outdir / stack_dir).mkdir()
        shutil.copy2(fork.patches_dir / stack_dir / "cover-letter.md",
                     outdir / stack_dir / "cover-letter.md")
    for s, mail in zip(steps, mails):
        (outdir / s.line).write_text(mail, errors="surrogateescape")
        written.append(s.line)
    (outdir / "series").write_text("".join(w + "\n" for w in written))
    tests = sum(1 for r in carried[-1] if r.rsplit("/", 1)[-1].startswith("test_"))
    print(f"exported {len(written)} patches in {len(stacks_of(steps))} stacks into {outdir}, "
          f"with {tests} test files and {len(carried[-1]) - tests} files they need; apply "
          f"onto a clean tree stack by stack: git am {outdir}/01-*/*.patch, ...",
          file=sys.stderr)
    return written


# ----------------------------------------------------------------------------- overlay / misc

def overlay(fork: Fork, dest: Path) -> list[str]:
    """Write changed + new package files as dest/sglang/...; return their package paths."""
    name = fork.pin["name"]
    with tempfile.TemporaryDirectory() as tmp:
        res = materialize(fork, Path(tmp) / "tree", quiet=True)
        rng = f"{BASE_TAG}..HEAD"
        changes = changed_files(res.dest, rng)
        prefix = f"python/{name}/"
        changed = sorted(p[len("python/"):] for p, st in changes.items()
                         if st != "D" and p.startswith(prefix))
        for rel in changed:
            target = Path(dest) / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(res.dest / "python" / rel, target)
        for p, st in sorted(changes.items()):
            if st == "D":
                print(f"warning: {p} is deleted by the series; remove it from the target "
                      "by hand", file=sys.stderr)
    return changed


def diffstat(fork: Fork) -> str:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        tree.mkdir()
        create_base(fork, tree)
        for stack_dir, st in stacks_of(read_series(fork)):
            out.append(f"{stack_dir}")
            for s in st:
                apply_step(tree, s)
                subject, _ = patch_message(s.path)
                out.append(f"  {s.name}: {subject}")
                stat = git(tree, "diff", "--numstat", "HEAD~1..HEAD").stdout
                for line in stat.splitlines():
                    plus, minus, path = line.split("\t")
                    out.append(f"    {path}  +{plus} -{minus}")
    return "\n".join(out)


def main(argv: list[str] | None = None, fork: Fork | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fork.py", description=__doc__.split("\n")[0])
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
                  f"in {len(stacks_of(res.steps))} stacks apply; python/ mirrors their "
                  f"{len(res.created)} new files")
        elif args.cmd == "diffstat":
            print(diffstat(fork))
    except ForkError as e:
        print(f"fork.py: error: {e}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as e:
        print(f"fork.py: error: command failed ({e.returncode}): {e.cmd}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
