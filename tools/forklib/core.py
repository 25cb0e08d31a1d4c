"""Where the fork's files are, the pinned upstream wheel, and git: what every other part uses."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
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
    lives in bases/VERSION/ as a delta: its upstream.json, requirements-cpu.txt, series
    and cover letters, and only the steps (patches/) and new modules (python/) that
    differ there; every other step and module is the default base's."""
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
    def shared_patches_dir(self) -> Path:
        """The default base's patches/: a step another base does not hold itself."""
        return self.root / "patches"

    @property
    def own_python(self) -> Path:
        """Where this base's new modules live when they differ from the shared python/."""
        return self.base_dir / "python"

    def default(self) -> "Fork":
        """The default base of the same repository."""
        return Fork(root=self.root, cache_dir=self.cache_dir)

    def rel(self, path: Path) -> str:
        return Path(path).relative_to(self.root).as_posix()


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


def git(cwd: Path, *args: str, check: bool = True, input: str | None = None,
        env: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **GIT_IDENTITY, "GIT_CONFIG_NOSYSTEM": "1", **(env or {})}
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
