"""The fork as a wheel: build it from a materialized tree, install it, or overlay its files."""
from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .core import BASE_TAG, Fork, ForkError, git, pick_key
from .series import patch_message, read_series, stacks_of
from .tree import step_contents, apply_step, changed_files, create_base, materialize


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
        steps = read_series(fork)
        contents = step_contents(fork, steps)
        for stack_dir, st in stacks_of(steps):
            out.append(f"{stack_dir}")
            for s in st:
                apply_step(tree, s, contents.get(s.name))
                subject, _ = patch_message(s.path)
                out.append(f"  {s.name}: {subject}")
                stat = git(tree, "diff", "--numstat", "HEAD~1..HEAD").stdout
                for line in stat.splitlines():
                    plus, minus, path = line.split("\t")
                    out.append(f"    {path}  +{plus} -{minus}")
    return "\n".join(out)


def _pin_name(line: str) -> str | None:
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==", line)
    return m[1].lower().replace("_", "-").replace(".", "-") if m else None


def base_requirements(fork: Fork) -> str:
    """This base's CPU requirements: the default base's requirements-cpu.txt with the pins
    this base's own file lists in place of theirs (a base keeps only what differs)."""
    default = (fork.root / "requirements-cpu.txt").read_text()
    if fork.base is None:
        return default
    own = fork.base_dir / "requirements-cpu.txt"
    pins = {_pin_name(l): l.strip() for l in own.read_text().splitlines() if _pin_name(l)}
    out, used = [], set()
    for line in default.splitlines():
        name = _pin_name(line)
        if name in pins:
            line = pins[name]
            used.add(name)
        out.append(line)
    out += [pins[n] for n in pins if n not in used]  # new on this base
    return "\n".join(out) + "\n"

