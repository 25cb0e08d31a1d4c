"""What a step's change to a new module replaced: the record that rebuilds the module's
content before that step from its content after it.

A new module lives once, under python/, at its final content. A later step that changes
it keeps, next to its patch (NNNN-name.replaced.json), only the lines its change
replaced. Each replaced run is found again by an anchor, not by the whole module: the
sha256 of the lines the step wrote there and of up to CONTEXT unchanged lines on either
side. So the record carries no line of the final module, a module can be edited in place
anywhere but on those lines (the edit lands in the step that adds the module), and an
edit on them is caught by the anchor, not rebuilt wrong."""
from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path

from .core import ForkError
from .series import Step

SUFFIX = ".replaced.json"
# Unchanged lines on each side of a replaced run that its anchor covers.
CONTEXT = 3


def records_path(patch: Path) -> Path:
    return patch.with_name(patch.name[: -len(".patch")] + SUFFIX)


def step_records(step: Step) -> dict:
    """{module: record} of the changes ``step`` makes to modules earlier steps added: its
    own file, else (another base's step over the default base's) the default base's."""
    for patch in (step.path, step.shared):
        if patch is not None and records_path(patch).is_file():
            return json.loads(records_path(patch).read_text())
    return {}


def _lines(data: bytes) -> list[str]:
    return data.decode("utf-8", "surrogateescape").splitlines(keepends=True)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _anchor(lines: list[str], at: int, size: int, pre: int, post: int) -> str:
    parts = ("".join(lines[at - pre:at]), "".join(lines[at:at + size]),
             "".join(lines[at + size:at + size + post]))
    return sha256("\0".join(parts).encode("utf-8", "surrogateescape"))


def make_record(before: bytes, after: bytes) -> dict:
    """The record of a change from ``before`` to ``after``: for each changed run of lines,
    [where it starts in ``after``, how many lines it has there, the lines of ``before`` it
    replaced, unchanged lines of context before it and after it, its anchor]. The context
    stays within the unchanged lines next to the run, so undoing one run leaves the others'
    anchors whole."""
    a, b = _lines(after), _lines(before)
    codes = difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes()
    ops = []
    for k, (tag, i1, i2, j1, j2) in enumerate(codes):
        if tag == "equal":
            continue
        pre = min(CONTEXT, codes[k - 1][2] - codes[k - 1][1]) if k else 0
        post = min(CONTEXT, codes[k + 1][2] - codes[k + 1][1]) if k + 1 < len(codes) else 0
        ops.append([i1, i2 - i1, b[j1:j2], pre, post, _anchor(a, i1, i2 - i1, pre, post)])
    return {"replaced": ops}


def _find(lines: list[str], op: list, where: str) -> int:
    """Where the run of ``op`` is in ``lines``: the match of its anchor nearest to the line
    it was recorded at (lines edited in place above it move it)."""
    at, size, _, pre, post, anchor = op
    top = len(lines) - size - post
    for delta in range(max(at, len(lines)) + 1):
        for p in ((at,) if delta == 0 else (at - delta, at + delta)):
            if pre <= p <= top and _anchor(lines, p, size, pre, post) == anchor:
                return p
    raise ForkError(
        f"{where}: the lines that step changed near line {at + 1} of the module (or the "
        f"{CONTEXT} lines around them) were edited in place, so the module before that step "
        "cannot be rebuilt: rework it with tools/fork.py materialize, git rebase -i and "
        "tools/fork.py import")


def undo(data: bytes, record: dict, where: str) -> bytes:
    """The content before the recorded change, from ``data``, the content after it."""
    lines = _lines(data)
    for op in sorted(record["replaced"], key=lambda op: -op[0]):
        p = _find(lines, op, where)
        lines[p:p + op[1]] = op[2]
    return "".join(lines).encode("utf-8", "surrogateescape")


def write_records(path: Path, records: dict | None) -> bool:
    """Write (or, for None, remove) a step's records; whether the file changed."""
    if records is None:
        if path.is_file():
            path.unlink()
            return True
        return False
    text = json.dumps(records, indent=1, sort_keys=True) + "\n"
    if path.is_file() and path.read_text() == text:
        return False
    path.write_text(text)
    return True
