"""The series: its steps in order, where each step's patch is, and what it adds."""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .core import Fork, ForkError

STEP_RE = re.compile(r"^(\d\d)-([a-z0-9][a-z0-9-]*)/(\d{4})-([a-z0-9][a-z0-9-]*)\.patch$")
# Headers of a step's patch (one file a line; git am ignores headers it does not know):
# the new files the step adds, which live once, as plain files under python/ (or
# bases/VERSION/python/), never inside a patch; and, in another base's own patch, the
# files whose change is the default base's patch's for the step, applied from there.
ADDS_HEADER = "X-Fork-Adds"
SHARED_HEADER = "X-Fork-Shared"


def header_files(path: Path, header: str) -> list[str]:
    head = path.read_text(errors="surrogateescape").partition("\n\n")[0]
    return re.findall(rf"^{header}: (\S+)$", head, re.M)


@dataclass
class Step:
    line: str       # as listed: 04-yoco-model/0002-yoco-gemma4-branch.patch
    stack_dir: str  # 04-yoco-model
    stack: str      # yoco-model
    name: str       # yoco-gemma4-branch
    path: Path      # this base's own patch if it has one, else the default base's
    shared: Path | None = None  # the default base's patch, under this base's own one

    @property
    def id(self) -> str:
        return f"{self.stack}/{self.name}"

    @property
    def adds(self) -> list[str]:
        """The new files this step adds (python/... paths), from its patch's header."""
        return header_files(self.path, ADDS_HEADER)

    @property
    def shared_files(self) -> list[str]:
        """The files whose change comes from the default base's patch for the step."""
        return header_files(self.path, SHARED_HEADER) if self.shared else []


def step_path(fork: Fork, line: str) -> Path:
    """A base's own patch for the step if it has one, else the default base's: a step
    that applies to another release unchanged is not copied there."""
    own = fork.patches_dir / line
    if fork.base is None or own.is_file():
        return own
    return fork.shared_patches_dir / line


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
        path, shared = step_path(fork, line), fork.shared_patches_dir / line
        step = Step(line, f"{m[1]}-{m[2]}", m[2], m[4], path,
                    shared if fork.base is not None and path != shared and shared.is_file()
                    else None)
        if path.is_file() and step.shared is None and header_files(path, SHARED_HEADER):
            raise ForkError(f"{fork.rel(path)} takes files from {fork.rel(shared)} "
                            f"({SHARED_HEADER}), which does not exist")
        if need_files and not step.path.is_file():
            raise ForkError(f"{pd}/series:{n} lists {line}, but {fork.rel(step.path)} "
                            "does not exist")
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


def patch_message(path: Path | str) -> tuple[str, str]:
    """(subject, body) of a format-patch mail (its path, or its text)."""
    text = path if isinstance(path, str) else path.read_text(errors="surrogateescape")
    head, _, rest = text.partition("\n\n")
    subject = ""
    for m in re.finditer(r"^Subject: (.*(?:\n[ \t].*)*)", head, re.M):
        subject = re.sub(r"\s*\n\s+", " ", m[1])
    subject = re.sub(r"^\[PATCH[^\]]*\]\s*", "", subject)
    body = rest.split("\n---\n", 1)[0] if "\n---\n" in rest else ""
    return subject, body.strip()


def lint_series(steps: list[Step]) -> list[str]:
    """Problems a reviewer would flag in the messages (empty bodies, history references),
    and a new file written into a patch instead of python/."""
    problems, added = [], set()
    for s in steps:
        text = s.path.read_text(errors="surrogateescape")
        for rel in sorted(set(re.findall(r"^\+\+\+ b/(\S+)$", text, re.M)) & added):
            problems.append(f"{s.line}: changes {rel}, a module an earlier step adds, inside "
                            "the patch; the change goes in the step's record "
                            "(NNNN-name.replaced.json; tools/fork.py import writes it)")
        added.update(s.adds)
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
        if re.search(r"^new file mode ", text, re.M):
            problems.append(f"{s.line}: adds a file inside the patch; a new file lives under "
                            f"python/ and the patch names it ({ADDS_HEADER}; tools/fork.py "
                            "import writes both)")
    return problems
