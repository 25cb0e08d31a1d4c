"""Closeness of FROZEN_KV_MTP's greedy output to the target's own (no speculation).

    python benchmark/frozen_kv_mtp/closeness.py OUT.json [--target e4b|31b] [--prompts 200]
        [--min-len 100] [--max-len 2500] [--max-new 64] [--page-size 1]
        [--modes nospec,mtp,mtp-splitkv] [--steps 3[,4,5]] [--batch-sizes 4,16] [--rescore]
        [--extra JSON] [--tiny]

On an H200 with the fork in /tmp/site (`bash tools/offline_packs.sh install PACK...`), from
the repository root, $OUT a folder to keep (estimated 5-8 minutes for E4B; the 31B line
with half the prompts, see below):

    PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 benchmark/frozen_kv_mtp/bench.py closeness $OUT/closeness-e4b.json 2>&1 | tee $OUT/closeness-e4b.log
    PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 benchmark/frozen_kv_mtp/bench.py closeness $OUT/closeness-31b.json --target 31b --prompts 100 2>&1 | tee $OUT/closeness-31b.log

Modes, one engine at a time in this process (each shut down before the next starts):
- nospec: the target alone, greedy;
- mtp: FROZEN_KV_MTP (NEXTN with the Gemma-4 E4B assistant drafter), 3 steps, topk 1,
  4 draft tokens, stock's verify (the extend kernel);
- mtp-splitkv: the same with `triton_attention_split_kv_verify=True` (the fork's
  split-KV verify; SGLANG_CHAIN_VERIFY_GROUPED as in the environment, default the
  grouped kernel).
Acceptance is real: the drafts are accepted as the seeded drafter proposes them
(SGLANG_SIMULATE_ACC_LEN is removed from the environment), so every output token is the
target's, computed by the verify. Greedy (temperature 0), return_logprob with the top 5
of every output token.

--steps 3,4,5 runs each MTP mode at each step count (results keyed MODE-sN), nospec once.
--rescore: one more engine, the target alone, scores every mode's output by teacher
forcing (RESCORE lines: how far each emitted token's logprob lies below the target's best
at its position). Greedy output is the target's argmax whatever the drafts, so a correct
verify's gaps are rounding; wrong keys in the verify (upstream sgl-project/sglang#32666
reports corrupt output at 5 steps and 2+ concurrent requests) show as large gaps.

Checkpoints: the target's released text config (E4B, or the 31B shape with --target 31b)
and the E4B assistant (widened to the 31B's geometry for --target 31b), bf16, weights
seeded at a trained model's scale (`--load-format dummy`, SGLANG_DUMMY_WEIGHTS_AT_SCALE=1),
triton attention; written under $FKV_CKPT_DIR (default /tmp/frozen_kv_ckpt) as
profile_draft.py writes them. Prompts: seeded random ids, lengths uniform in
[--min-len, --max-len], sent in seeded batches of 1-32 prompts (--batch-sizes: the sizes
drawn; the same batches in every mode).

OUT.json: {"args", "prompt_lens", "modes": {mode: {"summary": {start_s, generate_s,
output_tokens, mean_accept_len, ...}, "outputs": [{ids, logprobs, top5, verify_ct,
accept_len}]}}, "comparisons": [{"mode", "against", "identical", "of",
"first_divergence_hist" ({position: count}), "divergences" ([{prompt, prompt_len,
position}]), "first_token_logprob_diff_max", "first_token_top5_diff_max",
"logprob_diff_max_before_divergence", ...}]}. One RESULT line per comparison: each MTP
mode against nospec, and mtp-splitkv against mtp.

--tiny: the CPU smoke run: the test suite's tiny Gemma-4 (test/srt/tiny_gemma.py, fp32)
and a tiny assistant drafter, the triton backend run by Triton's interpreter and the test
suite's CPU shim (test/srt/mtp_cpu_shim), as test/srt/test_frozen_kv_mtp_engine.py runs
them; defaults 3 prompts of 10-40 tokens, 8 new tokens. On 2 CPU cores each engine takes
15-30 s to start and each decode or verify round seconds (the split-KV verify's grouped
kernel the slowest): 3 prompts of 3 new tokens take about 2.5 minutes.

Time on an H200, estimated from the step-time and parity results (not measured for this
script): E4B with the defaults, each engine start about 1-2 minutes (decode and verify
CUDA graphs to batch 32), generation under a minute a mode (15 batches; prefill of
about 265k prompt tokens in all; 64 tokens in about 60 verify rounds of 10-25 ms at 1.07
accepted tokens a round), so 5-8 minutes for the three modes. --target 31b (the config in
benchmark/yoco_gemma4/configs): steps of 20-45 ms, prefill about 4x slower and a 62 GB
target to draw, so --prompts 100 (or --max-new 32) to stay inside 10 minutes. WALL lines
give each mode's start and generate times.
"""

import argparse
import json
import os
import random
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
YOCO = os.path.join(HERE, "..", "yoco_gemma4")
SRT_TESTS = os.path.join(ROOT, "test", "srt")
sys.path.insert(0, YOCO)
sys.path.insert(0, HERE)
from checkpoints import engine_kwargs, mtp_kwargs, write_assistant_checkpoint  # noqa: E402
from parity_check import batches, top5_diff  # noqa: E402

MODES = ("nospec", "mtp", "mtp-splitkv")
TINY_DEFAULTS = dict(prompts=3, min_len=10, max_len=40, max_new=8)
GPU_DEFAULTS = dict(prompts=200, min_len=100, max_len=2500, max_new=64)


def make_prompts(n, min_len, max_len, vocab, seed=0):
    """Seeded random ids (never the special ids below 10), lengths uniform in [min_len, max_len]."""
    rng = random.Random(seed)
    hi = min(200000, vocab)
    return [[rng.randrange(10, hi) for _ in range(rng.randint(min_len, max_len))] for _ in range(n)]


def tiny_setup(root):
    """The CPU test suite's tiny target and a tiny assistant, and the engine settings and
    environment its FROZEN_KV_MTP engine tests use."""
    sys.path.insert(0, SRT_TESTS)
    from cpu_engine import TRITON_ENGINE
    from tiny_gemma import GEMMA4_TEXT_CONFIG as TINY_TEXT_CONFIG, make_tiny_gemma4

    os.environ.update({
        "CUDA_VISIBLE_DEVICES": "",
        "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1",
        "TRITON_INTERPRET": "1",  # read by the scheduler process when its kernels are defined
        "SGLANG_TEST_MTP_CPU_SHIM": "1",
        "SGLANG_DUMMY_WEIGHTS_AT_SCALE": "1",  # a seeded drafter, not +-1e-3
        "PYTHONPATH": os.pathsep.join([os.path.join(SRT_TESTS, "mtp_cpu_shim"), os.environ.get("PYTHONPATH", "")]),
    })
    target = make_tiny_gemma4(os.path.join(root, "tiny-target"))
    draft = write_assistant_checkpoint(os.path.join(root, "tiny-draft"), dict(TINY_TEXT_CONFIG))
    return target, draft, dict(TINY_TEXT_CONFIG), dict(TRITON_ENGINE)


def mode_kwargs(mode, draft_dir, steps):
    if mode == "nospec":
        return {}
    if mode not in MODES:
        sys.exit(f"unknown mode {mode!r}: one of {','.join(MODES)}")
    kw = mtp_kwargs(draft_dir, steps)
    # the split-KV verify is FROZEN_KV_MTP's default on triton: "mtp" opts out
    kw["triton_attention_split_kv_verify"] = mode == "mtp-splitkv"
    return kw


def run_mode(mode, target_dir, draft_dir, base, prompts, mix, a, steps):
    import sglang as sgl

    kw = {**base, **mode_kwargs(mode, draft_dir, steps), "page_size": a.page_size, **json.loads(a.extra)}
    t0 = time.perf_counter()
    eng = sgl.Engine(model_path=target_dir, **kw)
    t1 = time.perf_counter()
    res = [None] * len(prompts)
    try:
        for group in mix:
            outs = eng.generate(
                input_ids=[prompts[i] for i in group],
                sampling_params={"temperature": 0, "max_new_tokens": a.max_new},
                return_logprob=True,
                top_logprobs_num=5,
            )
            for i, o in zip(group, outs):
                mi = o["meta_info"]
                lps = mi["output_token_logprobs"]
                top = mi["output_top_logprobs"][0] if mi.get("output_top_logprobs") else []
                res[i] = {"ids": o["output_ids"], "logprobs": [lp for lp, _, _ in lps],
                          "top5": [[lp, t] for lp, t, _ in top],
                          "verify_ct": mi.get("spec_verify_ct"), "accept_len": mi.get("spec_accept_length")}
        t2 = time.perf_counter()
    finally:
        eng.shutdown()
    t3 = time.perf_counter()
    acc = [r["accept_len"] for r in res if r["accept_len"] is not None]
    summary = {
        "engine_kwargs": {k: v for k, v in kw.items() if isinstance(v, (str, int, float, bool, type(None)))},
        # the split-KV verify's kernel: 1 grouped (the default), 0 one decode row a draft token
        "chain_verify_grouped": os.environ.get("SGLANG_CHAIN_VERIFY_GROUPED", "1") if mode == "mtp-splitkv" else None,
        "start_s": t1 - t0, "generate_s": t2 - t1, "shutdown_s": t3 - t2,
        "output_tokens": sum(len(r["ids"]) for r in res),
        "distinct_output_tokens": len({t for r in res for t in r["ids"]}),
        "mean_accept_len": sum(acc) / len(acc) if acc else None,
        "verify_ct_total": sum(r["verify_ct"] or 0 for r in res),
    }
    print(f"WALL mode={mode} start {summary['start_s']:.1f} s, generate {summary['generate_s']:.1f} s "
          f"({len(mix)} batches, {summary['output_tokens']} tokens), shutdown {summary['shutdown_s']:.1f} s",
          flush=True)
    return {"summary": summary, "outputs": res}


def first_divergence(x, y):
    """The first position where two token lists differ (the shorter length if one is the
    other's prefix), None if equal."""
    if x == y:
        return None
    for i, (s, t) in enumerate(zip(x, y)):
        if s != t:
            return i
    return min(len(x), len(y))


def compare(mode, against, outs, ref, prompts):
    divs, hist = [], {}
    lp_first, top5, lp_before = [], [], []
    first_token_differs = 0
    for i, (x, r) in enumerate(zip(outs, ref)):
        pos = first_divergence(x["ids"], r["ids"])
        if pos is not None:
            divs.append({"prompt": i, "prompt_len": len(prompts[i]), "position": pos})
            hist[pos] = hist.get(pos, 0) + 1
        if x["ids"][:1] == r["ids"][:1] and x["logprobs"] and r["logprobs"]:
            lp_first.append(abs(x["logprobs"][0] - r["logprobs"][0]))
        else:
            first_token_differs += 1
        d = top5_diff(x["top5"], r["top5"]) if x["top5"] and r["top5"] else None
        if d is not None:
            top5.append(d)
        # the same token on the same prefix: every position before the first divergence
        n = len(x["ids"]) if pos is None else pos
        lp_before += [abs(p - q) for p, q in zip(x["logprobs"][:n], r["logprobs"][:n])]
    return {
        "mode": mode, "against": against,
        "identical": len(outs) - len(divs), "of": len(outs),
        "first_divergence_hist": {str(k): hist[k] for k in sorted(hist)},
        "divergences": divs,
        "first_token_differs": first_token_differs,
        "first_token_logprob_diff_max": max(lp_first) if lp_first else None,
        "first_token_top5_diff_max": max(top5) if top5 else None,
        "logprob_diff_max_before_divergence": max(lp_before) if lp_before else None,
        # verify rounds a request took, equal in both (MTP modes only)
        "verify_ct_identical": (sum(x["verify_ct"] == r["verify_ct"] for x, r in zip(outs, ref))
                                if all(o["verify_ct"] for o in outs + ref) else None),
    }


def rescore(target_dir, base, prompts, results, a, group=16):
    """The target (no speculation) scores every mode's output by teacher forcing: at each
    output position, how far the emitted token's logprob lies below the target's best
    (``gap``). A correct greedy verify emits the target's argmax, so its gaps are rounding
    (the verify's kernels against the extend kernel here); a verify that reads the wrong
    keys emits tokens the target ranks far lower. Unlike token identity, this does not
    depend on near-flat logits of seeded weights staying untied."""
    import sglang as sgl

    eng = sgl.Engine(model_path=target_dir, **{**base, "page_size": a.page_size, **json.loads(a.extra)})
    out = {}
    try:
        for m, res in results.items():
            gaps, per_req = [], []
            for g in range(0, len(prompts), group):
                idx = list(range(g, min(g + group, len(prompts))))
                outs = eng.generate(
                    input_ids=[prompts[i] + res["outputs"][i]["ids"] for i in idx],
                    sampling_params={"temperature": 0, "max_new_tokens": 1},
                    return_logprob=True, logprob_start_len=[len(prompts[i]) for i in idx],
                    top_logprobs_num=1,
                )
                for i, o in zip(idx, outs):
                    ids = res["outputs"][i]["ids"]
                    mi = o["meta_info"]
                    toks = [t for _, t, _ in mi["input_token_logprobs"]]
                    off = next(k for k in range(3) if toks[k:k + len(ids)] == ids)
                    lps = mi["input_token_logprobs"][off:off + len(ids)]
                    tops = mi["input_top_logprobs"][off:off + len(ids)]
                    # the first input position has no logprob (None) when it is the prompt's first
                    g_req = [top[0][0] - lp for (lp, _, _), top in zip(lps, tops) if lp is not None and top]
                    gaps += g_req
                    per_req.append(max(g_req) if g_req else 0.0)
            gaps.sort()
            out[m] = {
                "tokens": len(gaps), "gap_max": gaps[-1] if gaps else None,
                "gap_p99": gaps[int(0.99 * (len(gaps) - 1))] if gaps else None,
                "tokens_gap_over_0.5": sum(x > 0.5 for x in gaps),
                "tokens_gap_over_2": sum(x > 2 for x in gaps),
                "requests_gap_over_0.5": sum(x > 0.5 for x in per_req),
            }
            print("RESCORE " + json.dumps({"mode": m, **out[m]}), flush=True)
    finally:
        eng.shutdown()
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("out", help="OUT.json")
    ap.add_argument("--target", default="e4b", choices=["e4b", "31b"])
    ap.add_argument("--target-config", default=None, help="path to gemma-4-31B-it.text_config.json")
    ap.add_argument("--modes", default=",".join(MODES), help=f"comma list of {','.join(MODES)}")
    ap.add_argument("--prompts", type=int, default=None, help="default 200 (--tiny: 3)")
    ap.add_argument("--min-len", type=int, default=None, help="shortest prompt, default 100 (--tiny: 10)")
    ap.add_argument("--max-len", type=int, default=None, help="longest prompt, default 2500 (--tiny: 40)")
    ap.add_argument("--max-new", type=int, default=None, help="max_new_tokens, default 64 (--tiny: 8)")
    ap.add_argument("--page-size", type=int, default=1)
    ap.add_argument("--steps", default="3",
                    help="speculative_num_steps (draft tokens = steps + 1); a comma list runs each "
                         "MTP mode at each, as MODE-sN")
    ap.add_argument("--seed", type=int, default=0, help="prompt seed")
    ap.add_argument("--mix-seed", type=int, default=1, help="batch-mix seed (the same batches in every mode)")
    ap.add_argument("--batch-sizes", default="1,2,4,8,16,32",
                    help="the batch sizes the seeded mix draws from (e.g. 4,16: concurrency 4 and 16 only)")
    ap.add_argument("--cuda-graph-max-bs", type=int, default=32,
                    help="largest decode/verify CUDA graph batch (the largest batch sent is 32)")
    ap.add_argument("--extra", default="{}", help="JSON of engine kwargs for every mode")
    ap.add_argument("--tiny", action="store_true", help="CPU smoke run: tiny Gemma-4 + tiny assistant")
    ap.add_argument("--rescore", action="store_true",
                    help="the target scores each mode's output by teacher forcing (RESCORE lines)")
    a = ap.parse_args()
    for k, v in (TINY_DEFAULTS if a.tiny else GPU_DEFAULTS).items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    modes = a.modes.split(",")
    steps = [int(x) for x in a.steps.split(",")]
    for m in modes:
        mode_kwargs(m, "", steps[0])  # refuses unknown modes before anything starts
    # (result key, mode, steps): nospec once; each MTP mode at each step count
    runs = [(m if m == "nospec" or len(steps) == 1 else f"{m}-s{s}", m, s)
            for m in modes for s in (steps[:1] if m == "nospec" else steps)]
    os.environ.pop("SGLANG_SIMULATE_ACC_LEN", None)  # real acceptance

    t_all = time.perf_counter()
    root = os.environ.get("FKV_CKPT_DIR", "/tmp/frozen_kv_ckpt")
    if a.tiny:
        target_dir, draft_dir, tcfg, base = tiny_setup(root)
    else:
        from profile_draft import draft_checkpoint, target_checkpoint

        target_dir, tcfg = target_checkpoint(root, a.target, a.target_config)
        draft_dir = draft_checkpoint(root, a.target, tcfg)
        base = engine_kwargs(cuda_graph_max_bs_decode=a.cuda_graph_max_bs)
    prompts = make_prompts(a.prompts, a.min_len, a.max_len, tcfg["vocab_size"], a.seed)
    mix = batches(len(prompts), a.mix_seed, [int(x) for x in a.batch_sizes.split(",")])
    print(f"== closeness target={'tiny' if a.tiny else a.target} prompts={len(prompts)} "
          f"lens {min(map(len, prompts))}-{max(map(len, prompts))} max_new={a.max_new} "
          f"page_size={a.page_size} modes={','.join(modes)}", flush=True)

    results = {}
    for key, m, s in runs:
        print(f"== mode {key}", flush=True)
        results[key] = run_mode(m, target_dir, draft_dir, base, prompts, mix, a, s)

    keys = list(results)
    ref = "nospec" if "nospec" in results else keys[0]
    pairs = [(k, ref) for k in keys if k != ref]
    if "mtp" in results and "mtp-splitkv" in results and ref != "mtp":
        pairs.append(("mtp-splitkv", "mtp"))
    comparisons = []
    for m, r in pairs:
        c = compare(m, r, results[m]["outputs"], results[r]["outputs"], prompts)
        comparisons.append(c)
        print("RESULT " + json.dumps({k: v for k, v in c.items() if k != "divergences"}), flush=True)
    rescored = rescore(target_dir, base, prompts, results, a) if a.rescore else None
    wall = time.perf_counter() - t_all
    print(f"WALL total {wall:.1f} s", flush=True)
    out = {"args": vars(a), "target": "tiny" if a.tiny else a.target, "wall_s": wall,
           "prompt_lens": [len(p) for p in prompts], "batches": mix,
           "modes": results, "comparisons": comparisons, "rescore": rescored}
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
