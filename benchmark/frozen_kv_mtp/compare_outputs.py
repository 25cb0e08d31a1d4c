"""Greedy outputs of two code versions, compared request by request.

    python benchmark/frozen_kv_mtp/compare_outputs.py BASE.json NEW.json [--run off]

BASE.json and NEW.json are results written by two installs of the fork (same prompts and
batch mix): `mtp_check.py`'s (e.g. device stage WP: main before and after a patch, one GPU
each), where `--run` picks its run A ("off") or run B ("on"), or `parity_check.py
--on-only`'s (stage PQ), `--run on_a`. Prints one `SUMMARY {json}` line: identical output
ids, identical verify-step counts (mtp_check) or first-token top-5 logprobs to the bit
(parity_check), and the first differing token position of each mismatch. Exit status 1
if the two files were not made from the same prompts.
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
        **{
            name: sum(x[field] == y[field] for x, y in zip(a, b))
            for field, name in (("verify_ct", "identical_verify_steps"), ("top5", "identical_top5"))
            if a and field in a[0] and b and field in b[0]
        },
        "first_differing_token": first_diff,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("new")
    ap.add_argument("--run", default="off", choices=["off", "on", "on_a"])
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
