"""YOCO under FROZEN_KV_MTP: greedy parity MTP+YOCO on vs MTP+YOCO off, one GPU, one run.

    python mtp_check.py OUT.json [--variant e4b] [--prompts 200] [--max-len 8000] [--max-new 16]
    python mtp_check.py OUT.json --phases     # which forwards ran YOCO (debug log lines)
    python mtp_check.py OUT.json --yoco off --b-extra '{"triton_attention_split_kv_verify": true}'
        # run A vs run B with YOCO off in both: split-KV verify against the extend kernel
    python mtp_check.py OUT.json --yoco off --b-mix-seed 2   # stock vs stock, other batch mix

Target: the text-only checkpoint of parity_check.py; drafter: the released E4B
assistant config (4 layers, all KV-shared with the target), both with the fork's
seeded dummy weights at scale. NEXTN -> FROZEN_KV_MTP, steps 3, topk 1, 4 draft
tokens. Acceptance is real (no SGLANG_SIMULATE_ACC_LEN): with random weights it is
low, but it must be the same with YOCO on and off, request by request.

--phases serves a few prompts with log_level=debug; the fork logs one line per
planned prefill pass ("KV-sharing fast prefill: back half on ..." or
"... full pass (<reason>)"). Run it with stderr captured and count the lines:
the target prefill must be the only forward that takes the back-half path.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoints import engine_kwargs, mtp_kwargs, text_config, write_assistant_checkpoint, write_text_checkpoint  # noqa: E402
from parity_check import batches, make_prompts  # noqa: E402


def run(model_dir, draft_dir, yoco, prompts, mix, max_new, **extra):
    import sglang as sgl

    # min_tokens=0 unless --extra sets it: the fast path takes every prefill pass, short ones too.
    kw = engine_kwargs(**mtp_kwargs(draft_dir), **{"kv_sharing_fast_prefill_min_tokens": 0, **extra})
    eng = sgl.Engine(model_path=model_dir, kv_sharing_fast_prefill=yoco, **kw)
    res = [None] * len(prompts)
    for group in mix:
        outs = eng.generate(
            input_ids=[prompts[i] for i in group],
            sampling_params={"temperature": 0, "max_new_tokens": max_new},
        )
        for i, o in zip(group, outs):
            mi = o["meta_info"]
            res[i] = {"ids": o["output_ids"], "verify_ct": mi.get("spec_verify_ct"),
                      "accept_len": mi.get("spec_accept_length")}
    eng.shutdown()
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--variant", default="e4b")
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--max-len", type=int, default=8000)
    ap.add_argument("--max-new", type=int, default=16)
    ap.add_argument("--phases", action="store_true", help="one short debug-logged run with YOCO on")
    ap.add_argument("--extra", default="{}",
                    help="JSON of engine kwargs for both runs, e.g. '{\"enable_deterministic_inference\": true}'")
    ap.add_argument("--yoco", default="off-on", choices=["off-on", "off", "on"],
                    help="YOCO in run A (\"off\" in the summary keys) and run B (\"on\"): off then on, or the same in both")
    ap.add_argument("--b-extra", default="{}", help="JSON of engine kwargs for run B only")
    ap.add_argument("--b-env", default="{}",
                    help="JSON of environment variables for run B only (its engine's processes read them)")
    ap.add_argument("--b-mix-seed", type=int, default=1,
                    help="batch-mix seed of run B (run A: 1); another seed measures stock's batch variance")
    a = ap.parse_args()
    root = os.environ.get("YOCO_CKPT_DIR", "/tmp/yoco_ckpt")
    model = write_text_checkpoint(f"{root}/{a.variant}", a.variant)
    draft = write_assistant_checkpoint(f"{root}/{a.variant}-assistant",
                                       None if a.variant == "e4b" else text_config(a.variant))
    vocab = text_config(a.variant)["vocab_size"]
    if a.phases:
        # 3 prompts in one batch (one EXTEND), then decode: draft + verify steps.
        prompts = make_prompts(3, 3000, vocab, seed=7)
        res = run(model, draft, True, prompts, [[0, 1, 2]], 8, log_level="debug")
        with open(a.out, "w") as f:
            json.dump({"phases_run": res}, f)
        return
    prompts = make_prompts(a.prompts, a.max_len, vocab)
    mix = batches(len(prompts), 1)
    extra, b_extra = json.loads(a.extra), json.loads(a.b_extra)
    yoco_a, yoco_b = {"off-on": (False, True), "off": (False, False), "on": (True, True)}[a.yoco]
    off = run(model, draft, yoco_a, prompts, mix, a.max_new, **extra)
    mix_b = mix if a.b_mix_seed == 1 else batches(len(prompts), a.b_mix_seed)
    b_env = json.loads(a.b_env)
    os.environ.update(b_env)
    on = run(model, draft, yoco_b, prompts, mix_b, a.max_new, **extra, **b_extra)
    acc = [r["accept_len"] for r in off if r["accept_len"] is not None]
    summary = {
        "variant": a.variant,
        "extra_engine_kwargs": extra,
        # run A is "off" in the keys below, run B "on"
        "run_a": {"yoco": yoco_a}, "run_b": {"yoco": yoco_b, "mix_seed": a.b_mix_seed, **b_extra, "env": b_env},
        "prompts": len(prompts),
        "prompt_len_min": min(map(len, prompts)),
        "prompt_len_max": max(map(len, prompts)),
        "identical_ids_on_vs_off": sum(x["ids"] == y["ids"] for x, y in zip(off, on)),
        "identical_verify_steps_on_vs_off": sum(x["verify_ct"] == y["verify_ct"] for x, y in zip(off, on)),
        "mean_accept_len_off": sum(acc) / len(acc) if acc else None,
        "distinct_output_tokens": len({t for r in off for t in r["ids"]}),
        "mismatched_prompt_lengths": [len(p) for p, x, y in zip(prompts, off, on) if x["ids"] != y["ids"]],
    }
    print("SUMMARY", json.dumps(summary), flush=True)
    with open(a.out, "w") as f:
        json.dump({"summary": summary, "off": off, "on": on}, f)


if __name__ == "__main__":
    main()
