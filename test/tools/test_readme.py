"""The README is a front page: at most about 200 lines, no run-by-run history, and every
relative link in it points at a file of the repository."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MAX_LINES = 210


def readme():
    with open(os.path.join(ROOT, "README.md")) as f:
        return f.read()


def test_readme_is_short():
    n = len(readme().splitlines())
    assert n <= MAX_LINES, f"README.md has {n} lines (at most {MAX_LINES})"


def test_readme_cites_no_runs():
    hits = re.findall(r"\bruns? \d+\b", readme(), flags=re.IGNORECASE)
    assert not hits, f"README.md cites runs: {hits}"


def test_readme_links_resolve():
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", readme()):
        if "://" in target:
            continue
        assert os.path.exists(os.path.join(ROOT, target)), f"README.md links to a missing {target}"


def test_humanize_is_small():
    total = 0
    for d, _, files in os.walk(os.path.join(ROOT, ".humanize")):
        total += sum(os.path.getsize(os.path.join(d, f)) for f in files)
    assert total <= 5 * 1024 * 1024, f".humanize/ holds {total / 1e6:.1f} MB (at most 5 MB)"
