#!/usr/bin/env python3
"""Summarise a `.ci/run` log as the tables of .humanize/stacks/ci-time.md.

    python3 tools/ci_log_summary.py LOG [--top N]

Phases (`[phase] NAME: N s`), each step's time in the per-step check (`ok STEP: ...
(N s)`), and per base the suite's time per test file and its slowest tests (the
suite run with `--durations=0`, or whatever it printed)."""
import argparse
import re
from collections import defaultdict

PHASE = re.compile(r"^\[phase\] (.+?): (\d+) s")
STEP = re.compile(r"^ok (\S+\.patch): .*\((\d+) s\)$")
DURATION = re.compile(r"^([0-9.]+)s (call|setup|teardown)\s+(\S+)")


def parse(lines):
    bases, cur = [], None
    for line in lines:
        m = PHASE.match(line)
        if m:
            name, secs = m[1], int(m[2])
            if name == "total" and cur is not None:
                cur["phases"]["total"] = secs
                continue
            base = re.search(r"\((\d+\.\d+\.\d+)\)", name)
            base = base[1] if base else "0.5.17"
            if cur is None or cur["base"] != base:
                cur = {"base": base, "phases": {}, "steps": {}, "tests": defaultdict(float)}
                bases.append(cur)
            cur["phases"][name.split(" (")[0]] = secs
            continue
        if cur is None and line.startswith("ok "):
            cur = {"base": "0.5.17", "phases": {}, "steps": {}, "tests": defaultdict(float)}
            bases.append(cur)
        m = STEP.match(line)
        if m and cur is not None:
            cur["steps"][m[1]] = int(m[2])
        m = DURATION.match(line)
        if m and cur is not None:
            cur["tests"][m[3]] += float(m[1])
    return bases


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("log")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args()
    bases = parse(open(a.log, errors="replace").read().splitlines())
    names = [p for b in bases for p in b["phases"] if p != "total"]
    totals = [b["phases"]["total"] for b in bases if "total" in b["phases"]]
    print("| phase | " + " | ".join(b["base"] for b in bases) + " |")
    print("|---|" + "---|" * len(bases))
    for p in dict.fromkeys(names):
        print(f"| {p} | " + " | ".join(f"{b['phases'].get(p, '')} s" if p in b["phases"] else ""
                                        for b in bases) + " |")
    if totals:
        print(f"\ntotal (both bases): {totals[-1]} s = {totals[-1] / 60:.1f} minutes")
    for b in bases:
        if b["steps"]:
            print(f"\nper-step check, {b['base']} ({len(b['steps'])} steps, job time "
                  f"{sum(b['steps'].values())} s):\n")
            print("| step | s |\n|---|---|")
            for s, t in b["steps"].items():
                print(f"| {s} | {t} |")
        if b["tests"]:
            files = defaultdict(float)
            for t, s in b["tests"].items():
                files[t.split("::")[0]] += s
            print(f"\nsuite, {b['base']}: test time per file ({sum(files.values()):.0f} s in all):\n")
            print("| file | s |\n|---|---|")
            for f, s in sorted(files.items(), key=lambda x: -x[1]):
                if s >= 1:
                    print(f"| {f} | {s:.0f} |")
            print(f"\nsuite, {b['base']}: the {a.top} slowest tests (setup + call + teardown):\n")
            print("| test | s |\n|---|---|")
            for t, s in sorted(b["tests"].items(), key=lambda x: -x[1])[: a.top]:
                print(f"| {t} | {s:.0f} |")


if __name__ == "__main__":
    main()
