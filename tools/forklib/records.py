"""What a step's change to a new module replaced: the record that rebuilds the module's
content before that step from its content after it.

A new module lives once, under python/, at its final content. A later step that changes
it keeps, next to its patch (NNNN-name.replaced.json), only the lines its change
replaced, with their places in the content after the step, and that content's sha256:
the record carries no line of the final module, and a module edited in place where a
later step's record applies is caught by the hash, not rebuilt wrong."""
from __future__ import annotations

import difflib
import hashlib
import json
from pathlib import Path

from .core import ForkError
from .series import Step

SUFFIX = ".replaced.json"


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


def make_record(before: bytes, after: bytes) -> dict:
    """The record of a change from ``before`` to ``after``: for each changed run of lines,
    where it stands in ``after`` and the lines of ``before`` it replaced."""
    a, b = _lines(after), _lines(before)
    ops = [[i1, i2, b[j1:j2]] for tag, i1, i2, j1, j2 in
           difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes() if tag != "equal"]
    return {"after_sha256": sha256(after), "replaced": ops}


def undo(data: bytes, record: dict, where: str) -> bytes:
    """The content before the recorded change, from ``data``, the content after it."""
    if sha256(data) != record["after_sha256"]:
        raise ForkError(
            f"{where}: the module is not the content the record applies to (it was edited "
            "in place, and a later step changes it): rework it with tools/fork.py "
            "materialize, git rebase -i and tools/fork.py import")
    lines = _lines(data)
    for i1, i2, old in sorted(record["replaced"], key=lambda op: -op[0]):
        lines[i1:i2] = old
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
