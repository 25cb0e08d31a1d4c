"""FROZEN_KV_MTP decode rounds on a GPU: where the host waits for the GPU, and round time.

    python benchmark/frozen_kv_mtp/round_syncs.py OUT.json [--variant e4b] [--batch 8]
        [--prompt-len 2500] [--new-tokens 128] [--steps 3] [--graphs on|off]

One engine (E4B and its assistant, seeded weights at scale, triton, page size 1, the
benchmark's engine settings), one batch of --batch prompts of --prompt-len random ids,
greedy, --new-tokens each, served twice (the first unmeasured). Every decode round runs
under CUDA's sync debug mode (round_sync_site/sitecustomize.py): OUT.json lists each
Python line that made the host wait for the GPU inside a round and how often, beside
the measured pass's decode time per round (acceptance is the seeded drafter's: about
one token a round, so a round's time is its cost). YOCO is off.
"""

import argparse
import collections
import hashlib
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "yoco_gemma4"))
from checkpoints import engine_kwargs, mtp_kwargs, text_config, write_assistant_checkpoint, write_text_checkpoint  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--variant", default="e4b")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=2500)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--graphs", default="on", choices=["on", "off"])
    a = ap.parse_args()
    log = os.path.abspath(a.out) + ".syncs.log"
    if os.path.exists(log):
        os.remove(log)
    os.environ["SGLANG_BENCH_ROUND_SYNC_LOG"] = log
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(HERE, "round_sync_site")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
    root = os.environ.get("YOCO_CKPT_DIR", "/tmp/yoco_ckpt")
    model = write_text_checkpoint(f"{root}/{a.variant}", a.variant)
    draft = write_assistant_checkpoint(f"{root}/{a.variant}-assistant",
                                       None if a.variant == "e4b" else text_config(a.variant))
    vocab = text_config(a.variant)["vocab_size"]
    import random

    import sglang as sgl

    rng = random.Random(0)
    prompts = [[rng.randrange(10, vocab - 10) for _ in range(a.prompt_len)] for _ in range(a.batch)]
    kw = engine_kwargs(**mtp_kwargs(draft, a.steps))
    if a.graphs == "off":
        kw["disable_cuda_graph"] = True
    eng = sgl.Engine(model_path=model, **kw)
    params = {"max_new_tokens": a.new_tokens, "temperature": 0.0, "ignore_eos": True}
    try:
        eng.generate(input_ids=prompts, sampling_params=params)  # warm-up
        # the prompts' prefill (radix-cached from the warm-up) and one token, to subtract
        t0 = time.perf_counter()
        eng.generate(input_ids=prompts, sampling_params=dict(params, max_new_tokens=1))
        first = time.perf_counter() - t0
        with open(log, "w"):
            pass
        t0 = time.perf_counter()
        outs = eng.generate(input_ids=prompts, sampling_params=params)
        wall = time.perf_counter() - t0
    finally:
        eng.shutdown()
    with open(log) as f:
        lines = f.read().splitlines()
    rounds = lines.count("round")
    syncs = collections.Counter(line[5:] for line in lines if line.startswith("sync "))
    verify = [o["meta_info"].get("spec_verify_ct") for o in outs]
    ttft = [o["meta_info"].get("e2e_latency") for o in outs]
    result = {
        "variant": a.variant, "batch": a.batch, "prompt_len": a.prompt_len, "new_tokens": a.new_tokens,
        "steps": a.steps, "graphs": a.graphs, "wall_s": wall, "first_token_s": first,
        "decode_ms_per_round": 1e3 * (wall - first) / max(max(v or 0 for v in verify) - 1, 1),
        "rounds_logged": rounds,
        "verify_rounds_per_request": verify, "e2e_latency_s": ttft,
        "syncs_per_round": {k: round(v / max(rounds, 1), 3) for k, v in syncs.most_common()},
        "sync_total": sum(syncs.values()),
        # the greedy outputs, to compare runs of other fork files
        "outputs_sha1": hashlib.sha1(json.dumps([o["output_ids"] for o in outs]).encode()).hexdigest(),
    }
    print(json.dumps(result, indent=1))
    with open(a.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
