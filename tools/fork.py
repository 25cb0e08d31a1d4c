#!/usr/bin/env python3
"""Build tool for the SGLang YOCO fork: pinned upstream wheel + patch series + new modules.

The fork is not a copy of SGLang.  It is:
  * tools/upstream.json  the pinned upstream release: one wheel per interpreter, with sha256
  * patches/series       patch names in order, one a line ('#' comments and blank lines
                         ignored).  A line may also list repo paths of new modules
                         (python/sglang/...) that belong to that patch, for `export`:
                             0001-gemma4-yoco.patch  python/sglang/srt/layers/yoco.py
  * patches/*.patch      `git format-patch` mails against an upstream git checkout, so paths
                         look like a/python/sglang/srt/...
  * python/...           modules written by the fork.  They must not exist upstream:
                         upstream files are changed only through patches.

Commands (python3 tools/fork.py CMD --help):
  materialize DIR      wheel's sglang/ -> DIR/python/sglang, apply series, overlay python/
  install              materialize into build/tree, build build/dist/sglang-V+yoco.N-*.whl,
                       pip install it into the venv (default .venv)
  export OUTDIR        `git am`-able series against pristine upstream (+ OUTDIR/series)
  overlay DIR          only changed/new files as DIR/sglang/..., to copy over site-packages
  check                materialize into a temp dir and report
  diffstat             files and +/- lines per patch

Authoring a patch (patches change upstream files; new files go to python/ instead):
    python3 tools/fork.py materialize build/edit        # upstream + series + new modules
    cd build/edit && git init -q && git add -A && git commit -qm base
    $EDITOR python/sglang/srt/...                       # edit upstream files only
    git commit -am "fix(gemma4): short description"     # one concern per commit
    git format-patch -1 --zero-commit --no-signature -o ../../patches
    # rename to patches/NNNN-<concern>.patch, append the name to patches/series,
    # then run `python3 tools/fork.py check` from the repo root.
Reworking an existing patch, e.g. 0003-foo.patch:
    python3 tools/fork.py materialize --upto 0003-foo.patch build/edit   # series before it
    cd build/edit && git init -q && git add -A && git commit -qm base
    git am ../../patches/0003-foo.patch                 # keeps its author and message
    $EDITOR ...; git commit -a --amend
    git format-patch -1 --zero-commit --no-signature --stdout > ../../patches/0003-foo.patch
    cd ../.. && python3 tools/fork.py check             # later patches must still apply
Patches apply with exact context only (line offsets are tolerated, fuzz is not), so
regenerate a patch as above rather than hand-editing its hunks.
"""
from __future__ import annotations

import argparse
import base64
import csv
import email.header
import email.parser
import hashlib
import io
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIXED_AUTHOR = "SGLang YOCO fork <yoco-fork@example.invalid>"
FIXED_DATE = "Mon, 1 Jan 2024 00:00:00 +0000"
FALLBACK_KEY = "cp311-x86_64"


class ForkError(Exception):
    """A user-facing failure; main() prints it and exits 1."""


@dataclass
class Fork:
    """Where things are; tests point this at a temp repo / pin / cache."""
    root: Path = ROOT
    pin_path: Path | None = None
    cache_dir: Path | None = None

    def __post_init__(self):
        self.root = Path(self.root)
        self.pin_path = Path(self.pin_path or self.root / "tools" / "upstream.json")
        self.cache_dir = Path(self.cache_dir or os.environ.get("SGLANG_FORK_CACHE")
                              or Path.home() / ".cache" / "sglang-fork")

    @property
    def pin(self) -> dict:
        return json.loads(self.pin_path.read_text())

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"


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

@dataclass
class SeriesEntry:
    name: str
    modules: list[str]


def read_series(fork: Fork) -> list[SeriesEntry]:
    series = fork.patches_dir / "series"
    entries = []
    for line in (series.read_text().splitlines() if series.exists() else []):
        line = line.split(" #")[0].strip()
        if not line or line.startswith("#"):
            continue
        name, *mods = line.split()
        if not (fork.patches_dir / name).is_file():
            raise ForkError(f"patches/series lists {name}, but patches/{name} does not exist")
        entries.append(SeriesEntry(name, expand_modules(fork, name, mods)))
    listed = {e.name for e in entries}
    for p in sorted(fork.patches_dir.glob("*.patch")):
        if p.name not in listed:
            print(f"warning: patches/{p.name} is not listed in patches/series (ignored)",
                  file=sys.stderr)
    seen: dict[str, str] = {}
    for e in entries:
        for m in e.modules:
            if m in seen:
                raise ForkError(f"{m} is assigned to both {seen[m]} and {e.name} in patches/series")
            seen[m] = e.name
    return entries


def expand_modules(fork: Fork, patch: str, mods: list[str]) -> list[str]:
    """Series-line module paths -> repo-relative files (a directory means all files in it)."""
    out = []
    for m in mods:
        p = fork.root / m.rstrip("/")
        if not m.startswith("python/") or not p.exists():
            raise ForkError(f"patches/series: {patch} lists {m!r}, which is not a file or "
                            f"directory under python/ in the repo")
        out += [rel for rel in new_modules(fork) if rel == m or rel.startswith(m.rstrip("/") + "/")]
    return out


def new_modules(fork: Fork) -> list[str]:
    """Repo-relative posix paths of every fork-written file under python/."""
    base = fork.root / "python"
    if not base.is_dir():
        return []
    return sorted(p.relative_to(fork.root).as_posix() for p in base.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


# ----------------------------------------------------------------------------- patch parsing

HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
GIT_HEADER_RE = re.compile(r"(new file|deleted file|old|new|rename|copy|(dis)?similarity|index) ")


@dataclass
class Hunk:
    header: str
    old_start: int
    old_len: int
    lines: list[tuple[str, str]] = field(default_factory=list)  # (tag, text incl. newline)

    def side(self, tags: str) -> list[str]:
        return [text for tag, text in self.lines if tag in tags]


@dataclass
class FilePatch:
    old: str | None = None  # repo-relative path, None for /dev/null
    new: str | None = None
    mode: str | None = None
    rename: bool = False
    hunks: list[Hunk] = field(default_factory=list)
    raw: list[str] = field(default_factory=list)  # exact diff text, reused by export


@dataclass
class Patch:
    name: str
    author: str | None
    date: str | None
    subject: str
    message: str
    files: list[FilePatch]


def split_lines(text: str) -> list[str]:
    """Split on '\\n' only (str.splitlines also splits on \\r, \\f, ...), keeping ends."""
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def read_text(path: Path) -> str:
    return path.read_bytes().decode("utf-8", "surrogateescape")


def strip_path(p: str) -> str | None:
    p = p.rstrip("\n").split("\t")[0]
    if p == "/dev/null":
        return None
    if p.startswith('"'):
        raise ForkError(f"quoted diff paths are not supported: {p}")
    return p.split("/", 1)[1] if "/" in p else p  # -p1


def parse_patch(path: Path) -> Patch:
    lines = split_lines(read_text(path))
    first_diff = next((i for i, l in enumerate(lines) if l.startswith("diff --git ")
                       or (l.startswith("--- ") and i + 1 < len(lines)
                           and lines[i + 1].startswith("+++ "))), len(lines))
    author = date = None
    subject, message = path.stem, ""
    head = lines[:first_diff]
    if head and (head[0].startswith("From ") or re.match(r"[\w-]+: ", head[0])):
        if head[0].startswith("From ") and not head[0].startswith("From:"):
            head = head[1:]  # mbox separator line
        end = next((i for i, l in enumerate(head) if not l.strip()), len(head))
        hdrs = email.parser.HeaderParser().parsestr("".join(head[:end]))

        def dec(v):
            return re.sub(r"\s*\n\s*", " ", str(email.header.make_header(
                email.header.decode_header(v)))).strip() if v else None
        author, date = dec(hdrs["From"]), dec(hdrs["Date"])
        subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", dec(hdrs["Subject"]) or path.stem)
        body = head[end + 1:]
        sep = next((i for i, l in enumerate(body) if l.rstrip("\n") == "---"), len(body))
        message = "".join(body[:sep]).strip("\n")
    return Patch(path.name, author, date, subject, message, parse_diff(lines[first_diff:], path))


def parse_diff(lines: list[str], path: Path) -> list[FilePatch]:
    files: list[FilePatch] = []
    cur: FilePatch | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("diff --git "):
            cur = FilePatch(raw=[line])
            files.append(cur)
            spec = line[len("diff --git "):].rstrip("\n")
            half = (len(spec) - 1) // 2  # "a/X b/X": split in the middle (handles spaces)
            cur.old = cur.new = strip_path(spec[half + 1:])
        elif line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
            if cur is None or cur.hunks:  # plain unified diff without a git header
                cur = FilePatch()
                files.append(cur)
            cur.old, cur.new = strip_path(line[4:]), strip_path(lines[i + 1][4:])
            cur.raw += [line, lines[i + 1]]
            i += 1
        elif cur is not None and line.startswith("@@"):
            i = parse_hunk(lines, i, cur, path)
            continue
        elif cur is not None and not cur.hunks and GIT_HEADER_RE.match(line):
            cur.raw.append(line)
            word = line.split()
            if line.startswith("new file mode") or line.startswith("new mode"):
                cur.mode = word[-1]
            if line.startswith("new file mode"):
                cur.old = None
            elif line.startswith("deleted file mode"):
                cur.new = None
            elif line.startswith("rename from ") or line.startswith("copy from "):
                cur.old = line.split(" ", 2)[2].rstrip("\n")
                cur.rename = line.startswith("rename")
            elif line.startswith("rename to ") or line.startswith("copy to "):
                cur.new = line.split(" ", 2)[2].rstrip("\n")
        elif line.startswith("GIT binary patch") or line.startswith("Binary files "):
            raise ForkError(f"{path.name}: binary diffs are not supported ({cur and cur.new})")
        i += 1
    return files


def parse_hunk(lines: list[str], i: int, fp: FilePatch, path: Path) -> int:
    m = HUNK_RE.match(lines[i])
    if not m:
        raise ForkError(f"{path.name}: malformed hunk header {lines[i].rstrip()!r}")
    old_n = int(m[2]) if m[2] is not None else 1
    new_n = int(m[4]) if m[4] is not None else 1
    h = Hunk(lines[i].rstrip("\n"), int(m[1]), old_n)
    fp.hunks.append(h)
    fp.raw.append(lines[i])
    i += 1
    # Hunks are consumed by their line counts, so trailing "-- \n2.43.0" signatures are safe.
    while i < len(lines) and (old_n > 0 or new_n > 0 or lines[i].startswith("\\")):
        line = lines[i]
        tag, text = (line[0], line[1:]) if line not in ("\n", "") else (" ", line)
        if tag == "\\":  # "\ No newline at end of file" applies to the previous line
            t, prev = h.lines[-1]
            h.lines[-1] = (t, prev.rstrip("\n"))
        elif tag in " -+":
            h.lines.append((tag, text))
            old_n -= tag in " -"
            new_n -= tag in " +"
        else:
            raise ForkError(f"{path.name}: hunk {h.header!r} is truncated or corrupt at line "
                            f"{line.rstrip()!r}")
        fp.raw.append(line)
        i += 1
    if old_n > 0 or new_n > 0:
        raise ForkError(f"{path.name}: hunk {h.header!r} ends early (patch file truncated?)")
    return i


# ----------------------------------------------------------------------------- patch applying

def find_block(lines: list[str], block: list[str], want: int, lo: int) -> int | None:
    """Exact match of block nearest to index `want`, not before `lo` (offset, never fuzz)."""
    hi = len(lines) - len(block)
    want = min(max(want, lo), max(hi, lo))
    for d in range(0, max(want - lo, hi - want) + 1):
        for pos in ((want + d, want - d) if d else (want,)):
            if lo <= pos <= hi and lines[pos:pos + len(block)] == block:
                return pos
    return None


def apply_hunks(text_lines: list[str], fp: FilePatch, patch: str, target: str) -> list[str]:
    out: list[str] = []
    src = offset = 0
    for n, h in enumerate(fp.hunks, 1):
        old, new = h.side(" -"), h.side(" +")
        stated = h.old_start - 1 if h.old_len else h.old_start
        pos = find_block(text_lines, old, stated + offset, src)
        if pos is None:
            raise ForkError(hunk_failure(text_lines, old, new, stated + offset,
                                         patch, target, n, h))
        out += text_lines[src:pos] + new
        src, offset = pos + len(old), pos - stated
    return out + text_lines[src:]


def hunk_failure(lines, old, new, at, patch, target, n, h) -> str:
    # Report against the best partial match (most equal lines, nearest the stated line):
    # with offsets allowed, that is where the author most likely meant the hunk to go.
    def score(p):  # blank lines match anywhere, so they do not count
        return sum(a == b and len(a.strip()) > 1 for a, b in zip(lines[p:p + len(old)], old))
    cands = range(max(len(lines) - len(old), 0) + 1)
    best = max(cands, key=lambda p: (score(p), -abs(p - at)), default=0)
    stated, at = at, best if score(best) else max(0, min(at, len(lines)))
    where = "no mismatch at the stated position (overlaps an earlier hunk?)"
    for j, want in enumerate(old):
        got = lines[at + j] if at + j < len(lines) else None
        if got != want:
            kind = "context" if h.side(" ").count(want) else "removed"
            where = (f"first {kind} line that did not match, {target}:{at + j + 1}: "
                     f"expected {want!r}, found {got!r}" if got is not None else
                     f"expected {kind} line {want!r} at {target}:{at + j + 1}, found end of file")
            break
    if at != stated:
        where += f"\n  (closest partial match; the hunk states line {stated + 1})"
    msg = (f"patch {patch} does not apply to {target}: hunk #{n} {h.header}\n  {where}\n"
           f"  (exact context required; offsets are searched, fuzz is not allowed)")
    if new and find_block(lines, new, at, 0) is not None:
        msg += "\n  hint: the hunk's result is already present - is the change upstream now?"
    return msg


def apply_patch(patch: Patch, tree: Path) -> None:
    for fp in patch.files:
        src = tree / safe_rel(fp.old) if fp.old else None
        dst = tree / safe_rel(fp.new) if fp.new else None
        if src is None and dst.exists():
            raise ForkError(f"patch {patch.name} creates {fp.new}, which already exists")
        if src is not None and not src.is_file():
            raise ForkError(f"patch {patch.name} modifies {fp.old}, which does not exist in the "
                            f"materialized tree (only python/sglang from the wheel is present)")
        lines = split_lines(read_text(src)) if src else []
        result = apply_hunks(lines, fp, patch.name, fp.old or fp.new)
        if dst is None:
            if result:
                raise ForkError(f"patch {patch.name} deletes {fp.old}, but content would remain")
            src.unlink()
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes("".join(result).encode("utf-8", "surrogateescape"))
        if fp.mode:
            dst.chmod(0o755 if fp.mode.endswith("755") else 0o644)
        if fp.rename and src != dst:
            src.unlink()


# ----------------------------------------------------------------------------- materialize

@dataclass
class Materialized:
    dest: Path
    wheel: Path
    patches: list[Patch]
    modules: list[str]


def prepare_dest(dest: Path, force: bool) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())) and not force:
        raise ForkError(f"{dest} exists and is not empty; pass --force to replace it")


def materialize(fork: Fork, dest: Path, key: str | None = None, force: bool = False,
                strict: bool = False, quiet: bool = False,
                upto: str | None = None) -> Materialized:
    dest = Path(dest).resolve()
    prepare_dest(dest, force)
    pin = fork.pin
    wheel = fetch_wheel(fork, pick_key(fork, key, strict))
    series = read_series(fork)
    if upto:  # stop before this patch, to rework it
        names = [e.name for e in series]
        if upto not in names:
            raise ForkError(f"--upto {upto}: not listed in patches/series")
        series = series[:names.index(upto)]
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:  # build next to dest and swap in, so a failure leaves no half tree
        unpack_package(wheel, pin["name"], tmp)
        with zipfile.ZipFile(wheel) as z:
            upstream = {"python/" + n for n in z.namelist() if n.startswith(pin["name"] + "/")}
        patches = []
        for e in series:
            patch = parse_patch(fork.patches_dir / e.name)
            apply_patch(patch, tmp)
            patches.append(patch)
            if not quiet:
                print(f"applied {e.name} ({len(patch.files)} files)", file=sys.stderr)
        modules = new_modules(fork)
        for rel in modules:
            target = tmp / rel
            if rel in upstream:
                raise ForkError(f"new module {rel} also exists upstream in {pin['name']} "
                                f"{pin['version']}; change upstream files with a patch instead")
            if target.exists():
                raise ForkError(f"new module {rel} collides with a file created by a patch")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(fork.root / rel, target)
        if dest.exists():
            shutil.rmtree(dest) if dest.is_dir() else dest.unlink()
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not quiet:
        print(f"materialized {pin['name']} {pin['version']} + {len(patches)} patches + "
              f"{len(modules)} new modules into {dest}", file=sys.stderr)
    return Materialized(dest, wheel, patches, modules)


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


# ----------------------------------------------------------------------------- export

def git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def new_file_diff(root: Path, rel: str) -> str:
    data = (root / rel).read_bytes()
    try:
        if b"\0" in data:
            raise UnicodeDecodeError("utf-8", data, 0, 1, "NUL byte")
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ForkError(f"cannot export binary new module {rel}") from None
    mode = "100755" if os.access(root / rel, os.X_OK) else "100644"
    out = [f"diff --git a/{rel} b/{rel}\n", f"new file mode {mode}\n",
           f"index 0000000..{git_blob_sha(data)}\n"]
    lines = split_lines(text)
    if lines:  # git writes no ---/+++ lines for an empty new file
        out += ["--- /dev/null\n", f"+++ b/{rel}\n",
                f"@@ -0,0 +1{'' if len(lines) == 1 else f',{len(lines)}'} @@\n"]
        out += ["+" + l for l in lines]
        if not lines[-1].endswith("\n"):
            out += ["\n", "\\ No newline at end of file\n"]
    return "".join(out)


def slug(subject: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", subject.lower()).strip("-")[:52].rstrip("-") or "patch"


def mail(subject: str, message: str, diff: str, author: str | None, date: str | None) -> str:
    head = (f"From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n"
            f"From: {author or FIXED_AUTHOR}\nDate: {date or FIXED_DATE}\n"
            f"Subject: [PATCH] {subject}\nMIME-Version: 1.0\n"
            f"Content-Type: text/plain; charset=UTF-8\nContent-Transfer-Encoding: 8bit\n\n")
    return head + (message + "\n" if message else "") + "---\n\n" + diff + "-- \nsglang-fork\n\n"


def export(fork: Fork, outdir: Path, force: bool = False) -> list[str]:
    outdir = Path(outdir)
    prepare_dest(outdir, force)
    if outdir.exists():
        shutil.rmtree(outdir)
    outdir.mkdir(parents=True)
    series = read_series(fork)
    assigned = {m for e in series for m in e.modules}
    items = [(parse_patch(fork.patches_dir / e.name), e.modules) for e in series]
    rest = [m for m in new_modules(fork) if m not in assigned]
    if rest:
        items.append((Patch("rest", None, None, "feat: add remaining fork modules", "", []), rest))
    names = []
    for patch, mods in items:
        diff = "".join("".join(fp.raw) for fp in patch.files)
        diff += "".join(new_file_diff(fork.root, m) for m in mods)
        if not diff:
            print(f"warning: {patch.name} is empty; skipped", file=sys.stderr)
            continue
        name = f"{len(names) + 1:04d}-{slug(patch.subject)}.patch"
        (outdir / name).write_bytes(mail(patch.subject, patch.message, diff, patch.author,
                                         patch.date).encode("utf-8", "surrogateescape"))
        names.append(name)
    (outdir / "series").write_text("".join(n + "\n" for n in names))
    print(f"exported {len(names)} patches into {outdir} "
          f"(apply to a pristine tree with: git am {outdir}/*.patch)", file=sys.stderr)
    return names


# ----------------------------------------------------------------------------- overlay / misc

def overlay(fork: Fork, dest: Path) -> list[str]:
    """Write changed + new package files as dest/sglang/...; return their package paths."""
    name = fork.pin["name"]
    with tempfile.TemporaryDirectory() as tmp:
        res = materialize(fork, Path(tmp) / "tree", quiet=True)
        pkg = res.dest / "python"
        with zipfile.ZipFile(res.wheel) as z:
            pristine = {n: z.read(n) for n in z.namelist()
                        if n.startswith(name + "/") and not n.endswith("/")}
        current = {p.relative_to(pkg).as_posix(): p for p in (pkg / name).rglob("*") if p.is_file()}
        changed = sorted(rel for rel, p in current.items() if pristine.get(rel) != p.read_bytes())
        for rel in changed:
            target = Path(dest) / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(current[rel], target)
    for rel in sorted(set(pristine) - set(current)):
        print(f"warning: {rel} is deleted by the series; remove it from the target by hand",
              file=sys.stderr)
    return changed


def diffstat(fork: Fork) -> str:
    out = []
    for e in read_series(fork):
        patch = parse_patch(fork.patches_dir / e.name)
        out.append(f"{e.name}: {patch.subject}")
        for fp in patch.files:
            plus = sum(t == "+" for h in fp.hunks for t, _ in h.lines)
            minus = sum(t == "-" for h in fp.hunks for t, _ in h.lines)
            out.append(f"  {fp.new or fp.old}  +{plus} -{minus}")
        for m in e.modules:
            out.append(f"  {m}  (new module)")
    return "\n".join(out)


def main(argv: list[str] | None = None, fork: Fork | None = None) -> int:
    ap = argparse.ArgumentParser(prog="fork.py", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("materialize", help="upstream wheel + series + new modules into DIR")
    p.add_argument("dir", type=Path)
    p.add_argument("--force", action="store_true", help="replace a non-empty DIR")
    p.add_argument("--upto", metavar="PATCH", help="apply only the series entries before PATCH")
    p = sub.add_parser("install", help="build the fork wheel and pip install it into the venv")
    p.add_argument("--venv", default=".venv")
    p.add_argument("--no-deps-check", action="store_true")
    p = sub.add_parser("export", help="git-am-able series against pristine upstream")
    p.add_argument("outdir", type=Path)
    p.add_argument("--force", action="store_true", help="replace a non-empty OUTDIR")
    p = sub.add_parser("overlay", help="only changed/new files as DIR/sglang/...")
    p.add_argument("dir", type=Path)
    sub.add_parser("check", help="materialize into a temp dir and report")
    sub.add_parser("diffstat", help="files and +/- lines per patch")
    args = ap.parse_args(argv)
    fork = fork or Fork()
    try:
        if args.cmd == "materialize":
            materialize(fork, args.dir, force=args.force, upto=args.upto)
        elif args.cmd == "install":
            install(fork, args.venv, deps_check=not args.no_deps_check)
        elif args.cmd == "export":
            export(fork, args.outdir, force=args.force)
        elif args.cmd == "overlay":
            for rel in overlay(fork, args.dir):
                print(rel)
        elif args.cmd == "check":
            with tempfile.TemporaryDirectory() as tmp:
                res = materialize(fork, Path(tmp) / "tree", quiet=True)
            print(f"ok: {fork.pin['name']} {fork.pin['version']} + {len(res.patches)} patches "
                  f"+ {len(res.modules)} new modules apply cleanly")
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
