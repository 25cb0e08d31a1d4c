"""FROZEN_KV_MTP vs no speculation: decode tok/s and per-step time over batch x context.

    python benchmark/frozen_kv_mtp/profile_draft.py OUT_DIR [--target 31b|e4b]
        [--batches 1,2,4,8] [--contexts 220,670,2048,2460,4000] [--modes off,mtp,mtp-splitkv,mtp-splitkv-grouped]
        [--profile] [--profile-point 8x2048[,16x2460]]

Gemma-4 text-only target, `--load-format dummy` + SGLANG_DUMMY_WEIGHTS_AT_SCALE=1, and a
Gemma-4 assistant draft (NEXTN -> FROZEN_KV_MTP), steps=3, topk=1, 4 draft tokens,
SGLANG_SIMULATE_ACC_LEN=2.1 (honoured: frozen verify uses eagle_sample, eagle_utils.py:838).
Decode time = t(short+out_len) - t(short) for the same shape; steps from spec_verify_ct.
One `RESULT {json}` line per point. --profile runs the engine's torch profiler (in the
scheduler process) for a few steps at each --profile-point and prints the top CUDA kernels
by total time and, with speculation, each round's phases (draft, verify, draft_extend, the
host after it: GPU window, kernel time inside it, host time; trace_summary.round_phases);
the JSON keeps them under "profiles".
31B draft: no 31B assistant config exists here; the E4B assistant's is reused with
backbone_hidden_size = target hidden size and the target's attention geometry (it reads
target KV); its own width/depth/centroid head stay E4B-sized (a guess). The 31B text config
must be in the repo on the GPU machine (../shared does not travel): copy
/work/shared/models/gemma-4-31B-it.text_config.json to benchmark/yoco_gemma4/configs/.
"""

import argparse
import copy
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
YOCO = os.path.join(HERE, "..", "yoco_gemma4")
sys.path.insert(0, YOCO)
from checkpoints import engine_kwargs, mtp_kwargs, write_assistant_checkpoint  # noqa: E402
from make_checkpoint import SPECIAL_TOKENS, make_checkpoint, write_tokenizer  # noqa: E402
from trace_summary import print_summary, profile_engine  # noqa: E402

CFG_31B = "gemma-4-31B-it.text_config.json"
CANDIDATES = [os.path.join(YOCO, "configs", CFG_31B), os.path.join(HERE, "..", "..", "shared", "models", CFG_31B),
              os.path.join("/work/shared/models", CFG_31B)]


def target_checkpoint(root, target, target_config):
    path = os.path.join(root, f"target-{target}")
    if target == "e4b":
        make_checkpoint(path, "e4b")
        with open(os.path.join(path, "config.json")) as f:
            return path, json.load(f)
    src = target_config or next((p for p in CANDIDATES if os.path.exists(p)), None)
    if src is None:
        sys.exit(f"no {CFG_31B}: copy it into {os.path.join(YOCO, 'configs')} or pass --target-config")
    with open(src) as f:
        cfg = copy.deepcopy(json.load(f)["text_config"])
    cfg.update(architectures=["Gemma4ForCausalLM"], torch_dtype="bfloat16")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": cfg["bos_token_id"], "pad_token_id": cfg["pad_token_id"],
                   "eos_token_id": [cfg["eos_token_id"], SPECIAL_TOKENS["<end_of_turn>"]]}, f)
    write_tokenizer(path, cfg["vocab_size"])
    return path, cfg


def draft_checkpoint(root, target, tcfg):
    path = os.path.join(root, f"draft-{target}")
    return write_assistant_checkpoint(path, None if target == "e4b" else tcfg)


def make_engine(mode, target_dir, draft_dir, a):
    import sglang as sgl

    kw = dict(model_path=target_dir, disable_radix_cache=True, tp_size=a.tp, context_length=a.context_length)
    if a.max_running_requests:
        kw["max_running_requests"] = a.max_running_requests
    if mode in ("mtp", "mtp-splitkv", "mtp-splitkv-grouped"):
        kw.update(mtp_kwargs(draft_dir, a.steps))
    if mode.startswith("mtp"):  # split-KV verify (decode queries) or stock's extend kernel
        kw["triton_attention_split_kv_verify"] = mode.startswith("mtp-splitkv")
    # grouped: all draft rows of a request per key tile (the scheduler process
    # inherits the environment when the engine starts it)
    os.environ["SGLANG_CHAIN_VERIFY_GROUPED"] = "1" if mode == "mtp-splitkv-grouped" else "0"
    kw.update(json.loads(a.extra))  # e.g. '{"disable_overlap_schedule": true}'
    return sgl.Engine(**engine_kwargs(**kw))


def prompts(gen, n, L, vocab):
    import torch

    return [torch.randint(10, min(200000, vocab), (L,), generator=gen).tolist() for _ in range(n)]


def run(eng, gen, B, L, new, vocab):
    sp = {"temperature": 0, "max_new_tokens": new, "ignore_eos": True}
    t = time.perf_counter()
    outs = eng.generate(input_ids=prompts(gen, B, L, vocab), sampling_params=sp)
    dt = time.perf_counter() - t
    mi = [o["meta_info"] for o in outs]
    steps = statistics.mean(m.get("spec_verify_ct") or m["completion_tokens"] for m in mi)
    acc = [m["spec_accept_length"] for m in mi if m.get("spec_accept_length") is not None]
    return dt, steps, (statistics.mean(acc) if acc else None)


def point(eng, gen, mode, B, L, a, vocab):
    short, long_ = a.short, a.short + a.out_len
    run(eng, gen, B, L, short, vocab)  # warm this shape
    ts, ss, acc = [], [], None
    for _ in range(a.repeats):
        d1, s1, _ = run(eng, gen, B, L, short, vocab)
        d2, s2, acc = run(eng, gen, B, L, long_, vocab)
        ts.append(d2 - d1)
        ss.append(s2 - s1)
    dec, steps = statistics.median(ts), statistics.median(ss)
    rec = {"mode": mode, "batch": B, "context": L, "out_len": a.out_len, "decode_s": dec,
           "tok_s_per_req": a.out_len / dec, "tok_s_total": B * a.out_len / dec, "steps": steps,
           "step_ms": 1000 * dec / max(steps, 1e-9), "accept_len": acc, "decode_s_all": ts}
    print("RESULT " + json.dumps(rec), flush=True)
    return rec


def profile(eng, gen, mode, B, L, a, vocab, out_dir):
    run(eng, gen, B, L, a.short, vocab)
    # num_steps counts scheduler forwards: 1 prefill + decode steps; stops by itself.
    # A speculative step emits up to 4 tokens, so ask for enough tokens that the
    # run lasts num_steps forwards in either mode (else the profile stops short of
    # them and writes no trace).
    s = profile_engine(eng, os.path.join(out_dir, f"profile-{mode}-{B}x{L}"),
                       lambda: run(eng, gen, B, L, 4 * a.profile_steps + 8, vocab),
                       num_steps=a.profile_steps, top=a.top)
    print_summary(f"{mode} {B}x{L}", s, a.top)
    rec = {"mode": mode, "batch": B, "context": L, **s}
    print("PROFILE_JSON " + json.dumps(rec), flush=True)
    return rec


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir")
    ap.add_argument("--target", default="31b", choices=["31b", "e4b"])
    ap.add_argument("--target-config", default=None, help="path to gemma-4-31B-it.text_config.json")
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--contexts", default="220,670,2048,2460,4000")
    ap.add_argument("--modes", default="off,mtp")
    ap.add_argument("--steps", type=int, default=3, help="speculative_num_steps (draft tokens = steps + 1)")
    ap.add_argument("--out-len", type=int, default=128)
    ap.add_argument("--short", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--acc-len", default="2.1", help="SGLANG_SIMULATE_ACC_LEN; '' for real acceptance")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--context-length", type=int, default=8192)
    ap.add_argument("--max-running-requests", type=int, default=0, help="0: server default (48 with MTP)")
    ap.add_argument("--extra", default="{}", help="JSON of extra Engine kwargs")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--profile-point", default="8x2048", help="BxL to profile (comma-separated: several)")
    ap.add_argument("--profile-steps", type=int, default=12)
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    if a.acc_len:
        os.environ["SGLANG_SIMULATE_ACC_LEN"] = a.acc_len  # read at import in the scheduler process
    os.makedirs(a.out_dir, exist_ok=True)
    root = os.environ.get("FKV_CKPT_DIR", "/tmp/frozen_kv_ckpt")
    target_dir, tcfg = target_checkpoint(root, a.target, a.target_config)
    draft_dir = draft_checkpoint(root, a.target, tcfg)
    import torch

    batches = [int(x) for x in a.batches.split(",")]
    contexts = [int(x) for x in a.contexts.split(",")]
    results, profiles = [], []
    for mode in a.modes.split(","):
        print(f"== mode {mode} target={a.target}", flush=True)
        eng = make_engine(mode, target_dir, draft_dir, a)
        gen = torch.Generator().manual_seed(0)
        try:
            for L in contexts:
                for B in batches:
                    results.append(point(eng, gen, mode, B, L, a, tcfg["vocab_size"]))
            for point_ in a.profile_point.split(",") if a.profile else ():
                B, L = (int(x) for x in point_.split("x"))
                profiles.append(profile(eng, gen, mode, B, L, a, tcfg["vocab_size"], a.out_dir))
        finally:
            eng.shutdown()
    with open(os.path.join(a.out_dir, f"profile_draft-{a.target}.json"), "w") as f:
        json.dump({"args": vars(a), "results": results, "profiles": profiles}, f, indent=1)


if __name__ == "__main__":
    main()
