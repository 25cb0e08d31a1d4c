"""Greedy parity, YOCO off vs on, on one GPU in one run.

    python parity_check.py OUT.json [--variant e4b] [--prompts 240] [--max-len 16000] [--tp 1]
        [--extra '{"enable_deterministic_inference": true}'] [--on-only]

Prompts: lengths log-uniform in [1, max-len], a third of them sharing long
prefixes (radix cache on, so prefix hits happen), sent in randomly sized batches.
Passes, each from an empty prefix cache unless said: off with batch mix A; off with
mix A again, straight after (each prompt a prefix-cache hit on its own first serve);
off with batch mix B; on with batch mix A. Each output records its prefix-cache hit
(meta_info cached_tokens). Three comparisons, each counted on its own (identical
outputs, the first token's top-5 logprob differences, first tokens whose top-5 sets
have nothing in common):
- on vs off: on-A against off-A, every prompt;
- other batch mix: off-A against off-B, the prompts with the same prefix-cache hit in
  both (what batch composition alone changes); the others are counted apart;
- cached against cold: off-A's second serve, a prefix-cache hit, against its first,
  the prompts cold (no hit) in their first serve.
The run fails (exit status 1, "failed": true and "fail_reasons" in the JSON) on any
first token whose top-5 sets do not overlap at all, on vs off or in the other batch
mix. Cached against cold is reported, not failed on.
--on-only serves YOCO on with batch mix A alone (to compare two code versions' outputs).
"""

import argparse
import json
import math
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoints import engine_kwargs, text_config, write_text_checkpoint  # noqa: E402


def make_prompts(n, max_len, vocab, seed=0):
    rng = random.Random(seed)
    hi = min(200000, vocab)
    prefixes = [[rng.randrange(10, hi) for _ in range(rng.choice([512, 2048, 6000]))] for _ in range(4)]
    prompts = []
    for i in range(n):
        L = max(1, int(math.exp(rng.uniform(0, math.log(max_len)))))
        if i % 3 == 0:
            pre = prefixes[i % 4]
            tail = max(1, L - len(pre)) if L > len(pre) else rng.randrange(1, 64)
            p = pre + [rng.randrange(10, hi) for _ in range(tail)]
        else:
            p = [rng.randrange(10, hi) for _ in range(L)]
        prompts.append(p[:max_len])
    return prompts


def batches(n, seed, sizes=(1, 2, 4, 8, 16, 32)):
    """Prompt indices in a seeded order, cut into batches of sizes drawn from `sizes`."""
    rng = random.Random(seed)
    order = list(range(n))
    rng.shuffle(order)
    out, i = [], 0
    while i < n:
        k = rng.choice(list(sizes))
        out.append(order[i : i + k])
        i += k
    return out


def run(model_dir, yoco, prompts, passes, max_new, tp=1, extra=None):
    """Serve `passes`, [(mix, cold)], in turn: each pass serves its mix's groups one
    after the other, radix cache on; a cold pass starts from an empty prefix cache.
    One result list per pass, by prompt: output ids, the first token's top-5 and the
    prompt's prefix-cache hit (cached tokens)."""
    import sglang as sgl

    # min_tokens=0 unless --extra sets it: the fast path takes every prefill pass, short ones too.
    kw = {"kv_sharing_fast_prefill_min_tokens": 0, "cuda_graph_max_bs_decode": 32, **(extra or {})}
    eng = sgl.Engine(model_path=model_dir, kv_sharing_fast_prefill=yoco, tp_size=tp, **engine_kwargs(**kw))
    results = []
    for mix, cold in passes:
        if cold:
            eng.flush_cache()
        res = [None] * len(prompts)
        for group in mix:
            outs = eng.generate(
                input_ids=[prompts[i] for i in group],
                sampling_params={"temperature": 0, "max_new_tokens": max_new},
                return_logprob=True,
                top_logprobs_num=5,
            )
            for i, o in zip(group, outs):
                top = o["meta_info"]["output_top_logprobs"][0]
                res[i] = {"ids": o["output_ids"], "top5": [[lp, t] for lp, t, _ in top],
                          "cached_tokens": o["meta_info"].get("cached_tokens", 0)}
        results.append(res)
    eng.shutdown()
    return results


def top5_diff(a, b):
    """Largest first-token logprob difference over the tokens both top-5s hold."""
    da = {t: lp for lp, t in a}
    db = {t: lp for lp, t in b}
    common = set(da) & set(db)
    return max(abs(da[t] - db[t]) for t in common) if common else None


def diff_stats(xs, ys):
    d = [top5_diff(x["top5"], y["top5"]) for x, y in zip(xs, ys)]
    ok = sorted(v for v in d if v is not None)
    return {
        "max": ok[-1] if ok else None,
        "median": ok[len(ok) // 2] if ok else None,
        "first_token_differs": sum(x["ids"][:1] != y["ids"][:1] for x, y in zip(xs, ys)),
        "no_common_top5": sum(v is None for v in d),
    }


def compare(prompts, xs, ys, keep=None):
    """One comparison over the prompts keep(x, y) admits (all by default): how many were
    compared and left out, how many outputs are identical, the first token's top-5
    logprob differences, and the prompts whose first-token top-5 sets are disjoint."""
    pairs = [(p, x, y) for p, x, y in zip(prompts, xs, ys) if keep is None or keep(x, y)]
    d = diff_stats([x for _, x, _ in pairs], [y for _, _, y in pairs])
    return {
        "compared": len(pairs),
        "left_out": len(prompts) - len(pairs),
        "identical": sum(x["ids"] == y["ids"] for _, x, y in pairs),
        "first_token_logprob_diff": d,
        "disjoint_top5": d["no_common_top5"],
        "disjoint_top5_prompt_lengths": [len(p) for p, x, y in pairs if top5_diff(x["top5"], y["top5"]) is None],
        "mismatched_prompt_lengths": [len(p) for p, x, y in pairs if x["ids"] != y["ids"]],
    }


# The comparisons a disjoint first-token top-5 fails the run on.
FAIL_ON = ("on_vs_off", "other_batch_mix")


def parity_report(prompts, off_a, off_a_cached, off_b, on_a):
    """The three comparisons (see the docstring) and whether the run fails."""
    cmp = {
        "on_vs_off": compare(prompts, off_a, on_a),
        "other_batch_mix": compare(prompts, off_a, off_b, lambda a, b: a["cached_tokens"] == b["cached_tokens"]),
        "cached_vs_cold": compare(prompts, off_a, off_a_cached,
                                  lambda cold, hit: cold["cached_tokens"] == 0 and hit["cached_tokens"] > 0),
    }
    reasons = [f"{k}: {cmp[k]['disjoint_top5']} first token(s) whose top-5 sets do not overlap"
               for k in FAIL_ON if cmp[k]["disjoint_top5"]]
    return {"comparisons": cmp, "failed": bool(reasons), "fail_reasons": reasons}


def parity_lines(report):
    """A PARITY line per comparison, then a FAIL line per reason."""
    names = {"on_vs_off": "on vs off", "other_batch_mix": "other batch mix (same prefix-cache hit)",
             "cached_vs_cold": "cached against cold"}
    lines = []
    for k, c in report["comparisons"].items():
        d = c["first_token_logprob_diff"]
        lines.append(f"PARITY {names[k]}: {c['identical']}/{c['compared']} identical"
                     + (f" ({c['left_out']} left out)" if c["left_out"] else "")
                     + f", first token differs {d['first_token_differs']}, disjoint top-5 {c['disjoint_top5']}, "
                     f"largest top-5 logprob difference {d['max']}")
    return lines + [f"FAIL {r}" for r in report["fail_reasons"]]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--variant", default="e4b")
    ap.add_argument("--prompts", type=int, default=240)
    ap.add_argument("--max-len", type=int, default=16000)
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--extra", default="{}", help="JSON of engine kwargs for every run, e.g. deterministic inference")
    ap.add_argument("--on-only", action="store_true", help="YOCO on, batch mix A only")
    a = ap.parse_args()
    extra = json.loads(a.extra)
    model = write_text_checkpoint(os.environ.get("YOCO_CKPT_DIR", "/tmp/yoco_ckpt") + f"/{a.variant}", a.variant)
    prompts = make_prompts(a.prompts, a.max_len, text_config(a.variant)["vocab_size"])
    mix_a, mix_b = batches(len(prompts), 1), batches(len(prompts), 2)
    summary = {
        "variant": a.variant,
        "tp": a.tp,
        "extra_engine_kwargs": extra,
        "prompts": len(prompts),
        "prompt_len_min": min(map(len, prompts)),
        "prompt_len_max": max(map(len, prompts)),
    }
    if a.on_only:
        (on_a,) = run(model, True, prompts, [(mix_a, True)], a.max_new, a.tp, extra)
        print("SUMMARY", json.dumps(summary), flush=True)
        with open(a.out, "w") as f:
            json.dump({"summary": summary, "on_a": on_a}, f)
        return 0
    off_a, off_a_cached, off_b = run(model, False, prompts, [(mix_a, True), (mix_a, False), (mix_b, True)],
                                      a.max_new, a.tp, extra)
    (on_a,) = run(model, True, prompts, [(mix_a, True)], a.max_new, a.tp, extra)
    report = parity_report(prompts, off_a, off_a_cached, off_b, on_a)
    same = sum(x["ids"] == y["ids"] for x, y in zip(off_a, on_a))
    same_off = sum(x["ids"] == y["ids"] for x, y in zip(off_a, off_b))
    distinct = len({t for r in off_a for t in r["ids"]})
    summary.update({
        **report,
        # every prompt, whatever its prefix-cache hit (the keys of older runs)
        "identical_on_vs_off": same,
        "identical_off_vs_off_other_mix": same_off,
        "first_token_logprob_diff_on_vs_off": diff_stats(off_a, on_a),
        "first_token_logprob_diff_off_vs_off_other_mix": diff_stats(off_a, off_b),
        "distinct_output_tokens": distinct,
        "mismatched_prompt_lengths": [len(p) for p, x, y in zip(prompts, off_a, on_a) if x["ids"] != y["ids"]],
    })
    for line in parity_lines(report):
        print(line, flush=True)
    print("SUMMARY", json.dumps(summary), flush=True)
    with open(a.out, "w") as f:
        json.dump({"summary": summary, "off_a": off_a, "off_a_cached": off_a_cached, "off_b": off_b, "on_a": on_a}, f)
    return 1 if report["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
