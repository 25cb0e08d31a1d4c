"""Two code versions' YOCO-on outputs, request by request (parity_check.py results).

    python compare_parity.py BASE.json NEW.json

Counts the requests whose greedy ids are identical and those whose first-token top-5
(logprob, token) pairs are identical to the bit, on the `on_a` run of each (the same
prompts and batch mix: exit 1 if the two were not made from the same prompts). A change
meant to keep the fast path exact must leave both counts at the number of prompts.
"""

import json
import sys


def compare(base, new):
    same_prompts = all(base["summary"][k] == new["summary"][k] for k in ("prompts", "prompt_len_min", "prompt_len_max"))
    a, b = base["on_a"], new["on_a"]
    ids = sum(x["ids"] == y["ids"] for x, y in zip(a, b))
    top5 = sum(x["top5"] == y["top5"] for x, y in zip(a, b))
    first = [next((i for i, (s, t) in enumerate(zip(x["ids"], y["ids"])) if s != t), min(len(x["ids"]), len(y["ids"])))
             for x, y in zip(a, b) if x["ids"] != y["ids"]]
    return {"prompts": len(a), "identical_ids": ids, "identical_top5": top5,
            "first_differing_token": first, "same_prompts": same_prompts}


def main():
    with open(sys.argv[1]) as f:
        base = json.load(f)
    with open(sys.argv[2]) as f:
        new = json.load(f)
    out = compare(base, new)
    print("SUMMARY", json.dumps(out), flush=True)
    sys.exit(0 if out["same_prompts"] else 1)


if __name__ == "__main__":
    main()
