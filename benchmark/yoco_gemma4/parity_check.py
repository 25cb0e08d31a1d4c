"""Greedy parity, YOCO off vs on, on one GPU in one run.

    python parity_check.py OUT.json [--variant e4b] [--prompts 240] [--max-len 16000] [--tp 1]
        [--extra '{"enable_deterministic_inference": true}'] [--on-only]

Prompts: lengths log-uniform in [1, max-len], a third of them sharing long
prefixes (radix cache on, so prefix hits happen), sent in randomly sized batches.
Runs: off with batch mix A, off with batch mix B, on with batch mix A.
Reports how many outputs are byte-identical (on vs off-A), and the largest
first-token top-5 logprob difference on vs off-A next to off-A vs off-B
(what batch composition alone changes).
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


def batches(n, seed):
    rng = random.Random(seed)
    order = list(range(n))
    rng.shuffle(order)
    out, i = [], 0
    while i < n:
        k = rng.choice([1, 2, 4, 8, 16, 32])
        out.append(order[i : i + k])
        i += k
    return out


def run(model_dir, yoco, prompts, mixes, max_new, tp=1, extra=None):
    import sglang as sgl

    # min_tokens=0 unless --extra sets it: the fast path takes every prefill pass, short ones too.
    kw = {"kv_sharing_fast_prefill_min_tokens": 0, "cuda_graph_max_bs_decode": 32, **(extra or {})}
    eng = sgl.Engine(model_path=model_dir, kv_sharing_fast_prefill=yoco, tp_size=tp, **engine_kwargs(**kw))
    results = []
    for mix in mixes:
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
                res[i] = {"ids": o["output_ids"], "top5": [[lp, t] for lp, t, _ in top]}
        results.append(res)
        eng.flush_cache()
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
        (on_a,) = run(model, True, prompts, [mix_a], a.max_new, a.tp, extra)
        print("SUMMARY", json.dumps(summary), flush=True)
        with open(a.out, "w") as f:
            json.dump({"summary": summary, "on_a": on_a}, f)
        return
    off_a, off_b = run(model, False, prompts, [mix_a, mix_b], a.max_new, a.tp, extra)
    (on_a,) = run(model, True, prompts, [mix_a], a.max_new, a.tp, extra)
    same = sum(x["ids"] == y["ids"] for x, y in zip(off_a, on_a))
    same_off = sum(x["ids"] == y["ids"] for x, y in zip(off_a, off_b))
    d_on = diff_stats(off_a, on_a)
    d_off = diff_stats(off_a, off_b)
    distinct = len({t for r in off_a for t in r["ids"]})
    summary.update({
        "identical_on_vs_off": same,
        "identical_off_vs_off_other_mix": same_off,
        "first_token_logprob_diff_on_vs_off": d_on,
        "first_token_logprob_diff_off_vs_off_other_mix": d_off,
        "distinct_output_tokens": distinct,
        "mismatched_prompt_lengths": [len(p) for p, x, y in zip(prompts, off_a, on_a) if x["ids"] != y["ids"]],
    })
    print("SUMMARY", json.dumps(summary), flush=True)
    with open(a.out, "w") as f:
        json.dump({"summary": summary, "off_a": off_a, "off_b": off_b, "on_a": on_a}, f)


if __name__ == "__main__":
    main()
