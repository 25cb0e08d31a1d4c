"""Materialize: the wheel's files as a git repository, one commit per step, each step's
new modules written from python/ at the content they have after it; import: back."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .core import BASE_TAG, Fork, ForkError, fetch_wheel, git, pick_key, prepare_dest, unpack_package
from .marks import not_yet_ported
from .records import make_record, records_path, step_records, undo, write_records
from .series import ADDS_HEADER, SHARED_HEADER, Step, header_files, patch_message, read_series


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


def module_source(fork: Fork, rel: str) -> Path:
    """Where a new file's final content is: this base's own copy if it has one, else the
    shared python/."""
    own = fork.base_dir / rel
    return own if fork.base is not None and own.is_file() else fork.root / rel


def _reverse(fork: Fork, rel: str, data: bytes, later: list[Step]) -> bytes:
    """``data`` with the changes of ``later`` (in series order) to ``rel`` undone, latest
    first, from their records."""
    for s in reversed(later):
        record = step_records(s).get(rel) if s.path.is_file() else None
        if record:
            data = undo(data, record, f"{fork.rel(module_source(fork, rel))} (step {s.line})")
    return data


def final_content(fork: Fork, rel: str, steps: list[Step]) -> bytes:
    """What the series leaves a new file with: its own copy on this base, else the shared
    one as the default series has it without the stacks and the steps this base has not
    ported (a step a ported stack neither lists nor declares is upstream's there)."""
    src = module_source(fork, rel)
    if fork.base is None or src != fork.root / rel:
        return src.read_bytes()
    stacks, pending = {s.stack_dir for s in steps}, not_yet_ported(fork, steps)
    lacks = [s for s in read_series(fork.default(), need_files=False)
             if s.stack_dir not in stacks or (s.stack, s.name) in pending]
    return _reverse(fork, rel, src.read_bytes(), lacks)


def step_contents(fork: Fork, steps: list[Step]) -> dict[str, dict[str, bytes]]:
    """{step name: {new module: its content after that step}}, for the modules each step
    adds or changes: the final content, with the later steps' recorded changes undone."""
    touched: dict[str, list[int]] = {}
    for i, s in enumerate(steps):
        if not s.path.is_file():
            continue  # --upto a step being written
        for rel in s.adds:
            if rel in touched:
                raise ForkError(f"{rel} is added by two steps ({steps[touched[rel][0]].line}, "
                                f"{s.line})")
            touched[rel] = [i]
        for rel in step_records(s):
            if rel not in touched:
                raise ForkError(f"{s.line} records a change to {rel}, which no step before "
                                "it adds")
            touched[rel].append(i)
    out: dict[str, dict[str, bytes]] = {}
    for rel, at in touched.items():
        src = module_source(fork, rel)
        if not src.is_file():
            raise ForkError(f"{steps[at[0]].line} adds {rel}, but {fork.rel(src)} does not exist")
        data = final_content(fork, rel, steps)
        for j in reversed(at):
            out.setdefault(steps[j].name, {})[rel] = data
            if j != at[0]:
                data = _reverse(fork, rel, data, [steps[j]])
    return out


def apply_step(tree: Path, step: Step, contents: dict[str, bytes] | None = None) -> None:
    """`git am` one step, with the new modules it adds or changes at their content after
    it (and, for another base's own patch, the files it takes from the default base's
    patch); on failure leave the tree as it was and say why."""
    res = git(tree, "am", "-q", "--keep-cr", str(step.path), check=False)
    empty = "\ndiff --git " not in step.path.read_text(errors="surrogateescape")
    shared = step.shared_files
    if res.returncode and not (empty and (contents or shared)):
        git(tree, "am", "--abort", check=False)
        raise ForkError(f"step {step.line} does not apply (git am, exact context):\n"
                        f"{(res.stdout + res.stderr).strip()}\n"
                        "rebuild it on the steps before it: tools/fork.py materialize, "
                        "git rebase -i, tools/fork.py import")
    if shared:
        got = git(tree, "apply", "--index", *(f"--include={f}" for f in shared),
                  str(step.shared), check=False)
        if got.returncode:
            git(tree, "am", "--abort", check=False) if res.returncode else \
                git(tree, "reset", "-q", "--hard", "HEAD~1")
            raise ForkError(f"step {step.line}: the default base's patch "
                            f"({step.shared.name}) does not apply to {', '.join(shared)} here:"
                            f"\n{got.stderr.strip()}")
    for rel, data in (contents or {}).items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_bytes(data)
    if contents:
        git(tree, "add", "--", *contents)
    if contents or shared:
        if res.returncode:  # its own mail has no diff
            git(tree, "am", "--continue")
        else:
            git(tree, "commit", "-q", "--amend", "--no-edit")


def apply_series(fork: Fork, tree: Path, steps: list[Step], all_steps: list[Step] | None = None,
                 on_step=None) -> None:
    """Apply ``steps`` in order onto ``tree`` (a fresh base)."""
    contents = step_contents(fork, all_steps or steps)
    for s in steps:
        apply_step(tree, s, contents.get(s.name))
        if on_step:
            on_step(s)


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
                check_modules: bool = True) -> Materialized:
    """Apply the series (or the steps before ``upto``) onto the wheel in a git repo."""
    dest = Path(dest).resolve()
    prepare_dest(dest, force)
    all_steps = read_series(fork, need_files=not upto)
    steps = all_steps
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
        apply_series(fork, tmp, steps, all_steps,
                     None if quiet else lambda s: print(f"applied {s.line}", file=sys.stderr))
        created = sorted(p for p, st in changed_files(tmp, f"{BASE_TAG}..HEAD").items()
                         if st == "A")
        if check_modules and not upto:
            verify_modules(fork, tmp, steps)
        if dest.exists():
            shutil.rmtree(dest) if dest.is_dir() else dest.unlink()
        tmp.rename(dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if not quiet:
        print(f"materialized {fork.pin['name']} {fork.pin['version']} + {len(steps)} steps "
              f"into {dest}", file=sys.stderr)
    return Materialized(dest, wheel, steps, created)


def module_files(base: Path) -> list[str]:
    """The files under ``base``/python, as python/... paths."""
    base = base / "python"
    if not base.is_dir():
        return []
    return sorted(p.relative_to(base.parent).as_posix() for p in base.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def verify_modules(fork: Fork, tree: Path, steps: list[Step]) -> None:
    """python/ holds exactly the new files the series adds, at the content the whole
    series leaves them with (the later steps' diffs apply forward onto what the earlier
    ones added); another base holds only the copies that differ there."""
    adds = {rel for s in steps for rel in s.adds}
    problems = [f"{module_source(fork, rel).relative_to(fork.root)} differs from what the "
                "series leaves it with" for rel in sorted(adds)
                if final_content(fork, rel, steps) != (tree / rel).read_bytes()]
    if fork.base is None:
        extra = set(module_files(fork.root)) - adds
        where = "python/"
    else:
        extra = set(module_files(fork.base_dir)) - adds
        where = f"{fork.rel(fork.own_python)}/"
    problems += [f"{where}{rel[len('python/'):]} is added by no step ({ADDS_HEADER})"
                 for rel in sorted(extra)]
    if problems:
        raise ForkError("the new modules do not match the series:\n  " + "\n  ".join(problems))


def step_mail(tree: Path, sha: str, adds: list[str], shared: tuple[str, ...] = (),
              modules: tuple[str, ...] = ()) -> str:
    """The commit as the series keeps it: git format-patch without the diffstat (an export
    has it), without the files it adds, which a header names instead, nor those it takes
    from the default base's patch (named by another), nor its changes to new modules
    (their records hold them)."""
    fmt = ["--stdout", "--zero-commit", "--no-signature"]
    head, _, rest = git(tree, "format-patch", "-1", *fmt, sha).stdout.partition("\n\n")
    message = "" if rest.startswith("---\n") else rest.split("\n---\n", 1)[0] + "\n"
    diff = git(tree, "format-patch", "--no-stat", *fmt, f"{sha}~1..{sha}", "--", ".",
               *(f":(exclude){rel}" for rel in [*adds, *shared, *modules])).stdout
    at = diff.find("\ndiff --git ")
    head += "".join(f"\n{ADDS_HEADER}: {rel}" for rel in adds)
    head += "".join(f"\n{SHARED_HEADER}: {rel}" for rel in shared)
    return f"{head}\n\n{message}---\n{diff[at + 1:] if at >= 0 else ''}"


def files_as_shared(tree: Path, sha: str, shared: Path, skip: list[str]) -> tuple[list[str], bool]:
    """(the files whose change in commit ``sha`` the default base's patch ``shared``
    makes the same, whether it makes the whole change the same; ``skip``: the new modules
    the commit adds or changes, kept apart): another base keeps a step of its own only
    where that patch does not apply, and in it only the files where it differs."""
    changed = [p for p in changed_files(tree, f"{sha}~1..{sha}") if p not in skip]
    touched = set(re.findall(r"^diff --git a/(\S+) ", shared.read_text(errors="surrogateescape"),
                             re.M))
    same = []
    with tempfile.TemporaryDirectory(prefix="fork-shared-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        for f in changed:
            if f not in touched:
                continue
            git(tree, "read-tree", f"{sha}~1", env=env)
            if git(tree, "apply", "--cached", f"--include={f}", str(shared),
                   check=False, env=env).returncode:
                continue
            mine = git(tree, "ls-files", "-s", "--", f, env=env).stdout.split()
            want = git(tree, "ls-tree", sha, "--", f).stdout.split()
            if mine[:2] == want[:1] + want[2:3]:
                same.append(f)
    return same, len(same) == len(changed) and set(same) == touched


def _blob(tree: Path, spec: str) -> bytes:
    return subprocess.run(["git", "-C", str(tree), "show", spec], capture_output=True,
                          check=True).stdout


def import_tree(fork: Fork, tree: Path) -> list[str]:
    """Write the commits after fork-base in ``tree`` back as the series' patches, in order
    (another base: only the steps the default base's patch does not make the same), the
    new files they add at their final content under python/, and the records of the
    changes later steps make to them."""
    tree = Path(tree)
    steps = read_series(fork, need_files=False)
    commits = git(tree, "rev-list", "--reverse", f"{BASE_TAG}..HEAD").stdout.split()
    if len(commits) != len(steps):
        raise ForkError(f"{tree} has {len(commits)} commits after {BASE_TAG}, "
                        f"{fork.rel(fork.patches_dir)}/series lists {len(steps)} steps: list a "
                        "new step in the series first "
                        "(or remove a dropped one)")
    written, created = [], []
    for sha, s in zip(commits, steps):
        status = changed_files(tree, f"{sha}~1..{sha}")
        adds = sorted(p for p, st in status.items() if st == "A")
        mods = tuple(sorted(p for p, st in status.items() if st == "M" and p in created))
        records = {rel: make_record(_blob(tree, f"{sha}~1:{rel}"), _blob(tree, f"{sha}:{rel}"))
                   for rel in mods}
        created += adds
        own, shared = fork.patches_dir / s.line, fork.shared_patches_dir / s.line
        if fork.base is not None and shared.is_file():
            same, whole = files_as_shared(tree, sha, shared, adds + list(mods))
            whole = whole and sorted(header_files(shared, ADDS_HEADER)) == adds
            mail = step_mail(tree, sha, adds, tuple(same), mods)
            theirs = step_records(Step(s.line, "", "", "", shared))
            mine = None if records == theirs else records  # none of its own: the default's
            if whole and patch_message(mail) == patch_message(shared) and mine is None:
                own.unlink(missing_ok=True)
                write_records(records_path(own), None)
                continue  # else its own message, about this release, over the same change
        else:
            mail = step_mail(tree, sha, adds, (), mods)
            mine = records or None
        own.parent.mkdir(parents=True, exist_ok=True)
        changed = write_records(records_path(own), mine)
        if not own.exists() or own.read_text(errors="surrogateescape") != mail:
            own.write_text(mail, errors="surrogateescape")
            changed = True
        if changed:
            written.append(s.line)
    if fork.base is None:
        for rel in module_files(fork.root):
            if rel not in created:
                (fork.root / rel).unlink()
    else:  # another base: its own copy only where it adds a module another way
        for rel in module_files(fork.base_dir):
            (fork.base_dir / rel).unlink()
        steps = read_series(fork, need_files=False)
        created = [rel for rel in created if not (fork.root / rel).is_file()
                   or final_content(fork, rel, steps) != (tree / rel).read_bytes()]
    for rel in created:
        if (tree / rel).is_file():
            target = fork.base_dir / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(tree / rel, target)
    return written
