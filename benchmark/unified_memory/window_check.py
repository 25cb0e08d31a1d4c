"""Sliding-window decode on triton with decode CUDA graphs: --enable-unified-memory
against the default pools, greedy, in one process each (run them in one session).

    python window_check.py OUT.json [--variant e4b] [--unified] [--eager] [--prompts 16] [--new 48]

Prompts are longer than the model's sliding window (512 for E2B/E4B), so every decode
step reads a full window. With the unified pool the replay translates the window's ids
to SWA-pool slots outside the graph; a count that misses keys leaves them as virtual ids
and the window layers read the wrong keys; eager decode (`--eager`: no CUDA graphs)
translates the window with its own width, so it is the reference for the graph replay
with the same pool (the unified pool's prefill need not equal the default pools'). Writes the output ids and, for every output
position, the top-5 logprobs; `--compare A.json B.json` reports how many outputs are
identical and the largest top-5 logprob difference over positions where both outputs
still agree.
"""

import argparse
import json
import os
import random
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "yoco_gemma4"))
from checkpoints import engine_kwargs, text_config, write_text_checkpoint  # noqa: E402
from parity_check import top5_diff  # noqa: E402


def prompts(n, vocab, window, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(10, min(vocab, 200000)) for _ in range(rng.randrange(window + 64, 4 * window))]
            for _ in range(n)]


def serve(a):
    import sglang as sgl

    cfg = text_config(a.variant)
    model = write_text_checkpoint(f"/tmp/window_check/{a.variant}", a.variant)
    ps = prompts(a.prompts, cfg["vocab_size"], cfg["sliding_window"])
    extra = {"enable_unified_memory": True} if a.unified else {}
    if a.eager:
        extra["disable_cuda_graph"] = True
    eng = sgl.Engine(model_path=model, cuda_graph_max_bs_decode=a.prompts, disable_radix_cache=True,
                     **engine_kwargs(**extra))
    try:
        outs = eng.generate(input_ids=ps, sampling_params={"temperature": 0, "max_new_tokens": a.new},
                            return_logprob=True, top_logprobs_num=5)
    finally:
        eng.shutdown()
    rows = [{"prompt_len": len(p), "ids": o["output_ids"],
             "top5": [[[lp, t] for lp, t, _ in pos] for pos in o["meta_info"]["output_top_logprobs"]]}
            for p, o in zip(ps, outs)]
    with open(a.out, "w") as f:
        json.dump({"variant": a.variant, "unified_memory": a.unified, "eager": a.eager,
                   "window": cfg["sliding_window"],
                   "outputs": rows}, f)
    print("WROTE", a.out, flush=True)


def compare(path_a, path_b):
    ra, rb = (json.load(open(p))["outputs"] for p in (path_a, path_b))
    same, worst, first_diff = 0, 0.0, []
    for x, y in zip(ra, rb):
        same += x["ids"] == y["ids"]
        k = next((i for i, (s, t) in enumerate(zip(x["ids"], y["ids"])) if s != t), None)
        first_diff.append(k)
        for i in range(len(x["ids"]) if k is None else k + 1):  # positions where both still agree
            d = top5_diff(x["top5"][i], y["top5"][i])
            worst = worst if d is None else max(worst, d)
    return {"a": path_a, "b": path_b, "outputs": len(ra), "identical": same,
            "first_differing_position": first_diff, "max_top5_logprob_diff_while_equal": worst}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?")
    ap.add_argument("--variant", default="e4b")
    ap.add_argument("--unified", action="store_true", help="--enable-unified-memory")
    ap.add_argument("--eager", action="store_true", help="no CUDA graphs (eager decode)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new", type=int, default=48)
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"))
    a = ap.parse_args()
    if a.compare:
        print("COMPARE", json.dumps(compare(*a.compare)), flush=True)
    else:
        serve(a)


if __name__ == "__main__":
    main()
