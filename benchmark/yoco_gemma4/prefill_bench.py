"""Prefill microbenchmark: YOCO off vs on vs the ceiling (front layers only), same GPU, one run.

    python prefill_bench.py OUT.json [--variant e4b] [--points 8000x8,1024x8,...] [--serving-graphs]
        [--profile-point 64x8] [--extra '{"cuda_graph_max_bs_prefill": 3840}']

Each mode gets its own Engine (the flag is per server). Times Engine.generate with
max_new_tokens=1 (one prefill pass per batch), radix cache off, after a warm-up;
modes: off, on (default --kv-sharing-fast-prefill-min-tokens), on-all (min tokens 0:
the fast path on every pass), on-all-eager (on-all with the back half's CUDA graphs off,
SGLANG_KV_SHARING_FAST_PREFILL_GRAPH=0), ceiling (the front layers alone);
median of --repeats. Prints RESULT and ROW lines, a SHARE line per YOCO mode and point
(its speed-up over off, speedup_<mode>, and its share of the ceiling, ceiling time / the
mode's time, share_of_ceiling_<mode>, where off and the ceiling ran), and writes raw
JSON. Prefill is eager in every mode, unless --serving-graphs: every mode then keeps
SGLang's default prefill CUDA graph (text-only Gemma4ForCausalLM captures one), as a
server would run it. With YOCO on, the graph only holds passes below the min-tokens
threshold (larger ones take the fast path, eager); on-all (threshold 0) runs without one.
--parity N: each mode (not the ceiling) also decodes 8 greedy tokens for N fixed
prompts (16-3000 tokens, batches of 8); PARITY lines count the outputs identical
to the first mode's.
--profile-point LxN: after the timings, each mode profiles one prefill of that shape
(torch profiler in the scheduler; trace_summary.py): GPU kernel time, kernels
launched by the host, top CPU ops. PROFILE lines on stdout, summaries in the JSON.
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoints import ceiling_variant, engine_kwargs, text_config, write_text_checkpoint  # noqa: E402

DEFAULT_POINTS = "64x1,64x8,256x1,256x8,1024x1,1024x8,2048x1,2048x8,4096x1,4096x8,8000x1,8000x8,16000x1,16000x8,32000x1"


def parity_prompts(n, vocab):
    import random

    rng = random.Random(1)
    hi = min(200000, vocab)
    return [[rng.randrange(10, hi) for _ in range(rng.randint(16, 3000))] for _ in range(n)]


def sweep(mode, model_dir, points, repeats, tp, vocab, serving_graphs=False, profile_point=None, profile_dir=None,
          extra=None, parity=0):
    import torch
    import sglang as sgl

    graph = {"disable_prefill_cuda_graph": False} if serving_graphs else {}
    env_graph = os.environ.pop("SGLANG_KV_SHARING_FAST_PREFILL_GRAPH", None)
    if mode == "on-all-eager":  # read by the scheduler process at start-up
        os.environ["SGLANG_KV_SHARING_FAST_PREFILL_GRAPH"] = "0"
    eng = sgl.Engine(
        model_path=model_dir,
        kv_sharing_fast_prefill=mode in ("on", "on-all", "on-all-eager"),
        disable_radix_cache=True,
        tp_size=tp,
        # "on": the server's default --kv-sharing-fast-prefill-min-tokens; "on-all": every pass
        **engine_kwargs(**graph, **({"kv_sharing_fast_prefill_min_tokens": 0} if mode.startswith("on-all") else {}),
                        **(extra or {})),
    )
    os.environ.pop("SGLANG_KV_SHARING_FAST_PREFILL_GRAPH", None)
    if env_graph is not None:
        os.environ["SGLANG_KV_SHARING_FAST_PREFILL_GRAPH"] = env_graph
    g = torch.Generator().manual_seed(0)
    ids = lambda n, L: [torch.randint(10, min(200000, vocab), (L,), generator=g).tolist() for _ in range(n)]
    sp = {"temperature": 0, "max_new_tokens": 1}
    eng.generate(input_ids=ids(4, 2048), sampling_params=sp)  # warm-up
    eng.generate(input_ids=ids(8, 64), sampling_params=sp)
    out = []
    for L, n in points:
        ts, starts = [], []
        for _ in range(repeats):
            batch = ids(n, L)
            starts.append(round(time.time(), 3))  # wall clock, to line passes up with a host sampler's log
            t = time.perf_counter()
            eng.generate(input_ids=batch, sampling_params=sp)
            ts.append(time.perf_counter() - t)
        med = statistics.median(ts)
        rec = {"mode": mode, "len": L, "batch": n, "median_s": med, "times_s": ts, "started_unix": starts,
               "tok_s": L * n / med}
        print(f"RESULT {json.dumps(rec)}", flush=True)
        out.append(rec)
    if parity and mode != "ceiling":
        prompts = parity_prompts(parity, vocab)
        parity_ids = []
        for i in range(0, len(prompts), 8):
            outs = eng.generate(input_ids=prompts[i : i + 8], sampling_params={"temperature": 0, "max_new_tokens": 8})
            parity_ids += [o["output_ids"] for o in outs]
        out.append({"mode": mode, "parity_ids": parity_ids})
    if profile_point:
        from trace_summary import print_summary, profile_engine

        L, n = profile_point
        batch = ids(n, L)
        s = profile_engine(eng, f"{profile_dir}/profile-{mode}-{L}x{n}",
                           lambda: eng.generate(input_ids=batch, sampling_params=sp), num_steps=1)
        print_summary(f"{mode} {L}x{n}", s)
        out.append({"mode": mode, "len": L, "batch": n, "profile": s})
    eng.shutdown()
    return out


FAST_MODES = ("on", "on-all", "on-all-eager")


def ceiling_table(results, points):
    """A row per point: each mode's median time, its speed-up over off, and for every
    YOCO mode measured beside the ceiling its share of the ceiling (ceiling time / the
    mode's time: 100 % means the back half cost nothing)."""
    by = {(r["mode"], r["len"], r["batch"]): r["median_s"] for r in results if "median_s" in r}
    table = []
    for L, n in points:
        off, ce = by.get(("off", L, n)), by.get(("ceiling", L, n))
        row = {"len": L, "batch": n, "off_s": off, "on_s": by.get(("on", L, n)), "ceiling_s": ce}
        for mode in FAST_MODES:
            t = by.get((mode, L, n))
            if t is None:
                continue
            key = mode.replace("-", "_")
            row[f"{key}_s"] = t
            if off:
                row[f"speedup_{key}"] = off / t
            if ce:
                row[f"share_of_ceiling_{key}"] = ce / t
        if off and ce:
            row["ceiling_speedup"] = off / ce
        if "speedup_on" in row:
            row["speedup"] = row["speedup_on"]  # the names older runs used
        if "share_of_ceiling_on" in row:
            row["fraction_of_ceiling"] = row["share_of_ceiling_on"]
        table.append(row)
    return table


def share_lines(table):
    """A SHARE line per YOCO mode measured at a point: the mode, its speed-up over off
    and its share of the ceiling, each where that side was measured."""
    lines = []
    for row in table:
        for mode in FAST_MODES:
            key = mode.replace("-", "_")
            if row.get(f"{key}_s") is None:
                continue
            t, sp, sh = row[f"{key}_s"], row.get(f"speedup_{key}"), row.get(f"share_of_ceiling_{key}")
            parts = [f"{sp:.2f}x over off ({1e3 * row['off_s']:.1f} ms against {1e3 * t:.1f} ms)" if sp else "no off",
                     f"{100 * sh:.1f} % of the ceiling ({1e3 * row['ceiling_s']:.1f} ms against {1e3 * t:.1f} ms)"
                     if sh else "no ceiling"]
            lines.append(f"SHARE {mode} {row['len']}x{row['batch']}: {', '.join(parts)}")
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--variant", default="e4b")
    ap.add_argument("--points", default=DEFAULT_POINTS)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--modes", default="off,on,ceiling")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--profile-point", default="", help="LxN: profile one prefill of that shape per mode")
    ap.add_argument("--extra", default="{}", help="JSON of engine kwargs for every mode")
    ap.add_argument("--parity", type=int, default=0, help="N prompts decoded greedily per mode, compared")
    ap.add_argument("--serving-graphs", action="store_true",
                    help="keep the default prefill CUDA graph (with YOCO on: below the threshold)")
    a = ap.parse_args()
    points = [tuple(int(x) for x in p.split("x")) for p in a.points.split(",")]
    profile = tuple(int(x) for x in a.profile_point.split("x")) if a.profile_point else None
    root = os.environ.get("YOCO_CKPT_DIR", "/tmp/yoco_ckpt")
    full = write_text_checkpoint(f"{root}/{a.variant}", a.variant)
    cv = ceiling_variant(a.variant)
    ceiling = write_text_checkpoint(f"{root}/{cv}", cv) if cv else None
    results = []
    for mode in a.modes.split(","):
        if mode == "ceiling" and ceiling is None:
            continue
        print(f"== mode {mode}", flush=True)
        results += sweep(mode, ceiling if mode == "ceiling" else full, points, a.repeats, a.tp,
                         text_config(a.variant)["vocab_size"], a.serving_graphs, profile,
                         os.path.dirname(os.path.abspath(a.out)), json.loads(a.extra), a.parity)
    outs = [r for r in results if "parity_ids" in r]
    for r in outs[1:]:
        same = sum(x == y for x, y in zip(outs[0]["parity_ids"], r["parity_ids"]))
        print(f"PARITY {r['mode']} vs {outs[0]['mode']}: {same}/{len(r['parity_ids'])} identical", flush=True)
    table = ceiling_table(results, points)
    for row in table:
        print("ROW", json.dumps(row), flush=True)
    for line in share_lines(table):
        print(line, flush=True)
    with open(a.out, "w") as f:
        json.dump({"variant": a.variant, "serving_graphs": a.serving_graphs, "results": results, "table": table},
                  f, indent=1)


if __name__ == "__main__":
    main()
