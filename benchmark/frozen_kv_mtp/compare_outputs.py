"""Greedy outputs of two code versions, compared request by request.

    python benchmark/frozen_kv_mtp/compare_outputs.py BASE.json NEW.json [--run off]

BASE.json and NEW.json are `mtp_check.py` results written by two installs of the fork
(e.g. device stage WP: main before and after a patch, one GPU each, same prompts and
batch mix). `--run` picks mtp_check's run A ("off") or run B ("on") from both files.
Prints one `SUMMARY {json}` line: identical output ids and verify-step counts, and the
first differing token position of each mismatch. Exit status 1 if the two files were
not made from the same prompts.
"""

import argparse
import json
import sys


def compare(base, new, run="off"):
    a, b = base[run], new[run]
    sa, sb = base["summary"], new["summary"]
    same_prompts = len(a) == len(b) and all(
        sa[k] == sb[k] for k in ("prompts", "prompt_len_min", "prompt_len_max"))
    first_diff = []
    for x, y in zip(a, b):
        if x["ids"] != y["ids"]:
            first_diff.append(next((i for i, (p, q) in enumerate(zip(x["ids"], y["ids"])) if p != q),
                                   min(len(x["ids"]), len(y["ids"]))))
    return {
        "run": run,
        "same_prompts": same_prompts,
        "requests": len(a),
        "identical_ids": sum(x["ids"] == y["ids"] for x, y in zip(a, b)),
        "identical_verify_steps": sum(x["verify_ct"] == y["verify_ct"] for x, y in zip(a, b)),
        "first_differing_token": first_diff,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--run", default="off", choices=["off", "on"])
    a = ap.parse_args()
    with open(a.base) as f:
        base = json.load(f)
    with open(a.new) as f:
        new = json.load(f)
    out = compare(base, new, a.run)
    print("SUMMARY", json.dumps(out), flush=True)
    sys.exit(0 if out["same_prompts"] else 1)


if __name__ == "__main__":
    main()
