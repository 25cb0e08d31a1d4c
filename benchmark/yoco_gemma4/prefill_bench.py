"""Prefill microbenchmark: YOCO off vs on vs the ceiling (the fast path without its back half), same GPU, one run.

    python prefill_bench.py OUT.json [--variant e4b] [--points 8000x8,1024x8,...] [--serving-graphs]
        [--repeats 5] [--profile-point 64x8] [--extra '{"cuda_graph_max_bs_prefill": 3840}']

Each mode gets its own Engine (the flag is per server). Times Engine.generate with
max_new_tokens=1 (one prefill pass per batch), radix cache off; modes: off, on (default
--kv-sharing-fast-prefill-min-tokens), on-all (min tokens 0: the fast path on every
pass), on-all-eager (on-all with the back half's CUDA graphs off,
SGLANG_KV_SHARING_FAST_PREFILL_GRAPH=0), ceiling (on-all with no back half: see
checkpoints.ceiling_kwargs, exactly the fast path's work outside the back half by
construction) and ceiling-cut (the model cut to its front layers, checkpoints.text_config;
its per-layer inputs are narrower than the fast path's, so it does a little less).

Method, per point (input length x batch) and mode: one warm-up pass of the point's own
shape, discarded (the first pass at a new shape pays for kernel selection and
allocations), then --repeats timed passes (default and at least 5; --few-repeats allows
fewer, for smoke or profile runs, and marks the JSON "reportable": false), each on fresh
random ids. Reported: the median, the min and the spread, (max - min) / median; a point
whose spread exceeds 10 % is flagged unstable ("unstable": true in its RESULT record and
an UNSTABLE line; an UNSTABLE mark on its SHARE lines).

Prints RESULT and ROW lines, a SHARE line per YOCO mode and point (its speed-up over off,
speedup_<mode>, and its share of the ceiling, ceiling time / the mode's time, from the
medians, share_of_ceiling_<mode>, and from the mins, share_of_ceiling_<mode>_min, where off
and the ceiling ran), and writes raw JSON after every mode (a mode that fails keeps what
ran). Prefill is eager in every mode, unless --serving-graphs: every mode then keeps
SGLang's default prefill CUDA graph (text-only Gemma4ForCausalLM captures one), as a
server would run it. With YOCO on, the graph only holds passes below the min-tokens
threshold (larger ones take the fast path, eager); on-all (threshold 0) runs without one.
--parity N: each mode (not the ceilings) also decodes 8 greedy tokens for N fixed
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
from checkpoints import (  # noqa: E402
    ceiling_kwargs,
    ceiling_variant,
    engine_kwargs,
    text_config,
    write_text_checkpoint,
)

DEFAULT_POINTS = "64x1,64x8,256x1,256x8,1024x1,1024x8,2048x1,2048x8,4096x1,4096x8,8000x1,8000x8,16000x1,16000x8,32000x1"
# The method (see the docstring): the fewest timed repeats a reported figure may rest on,
# and the spread, (max - min) / median, above which a point is flagged unstable.
MIN_REPEATS = 5
UNSTABLE_SPREAD = 0.10


def time_point(run_pass, make_batch, repeats, clock=time.perf_counter, wall=time.time):
    """One point: a warm-up pass of its own shape (timed, discarded), then `repeats`
    timed passes, each on a fresh batch from make_batch(). Returns (warm-up seconds,
    the timed passes' seconds, their wall-clock starts)."""
    batch = make_batch()
    t = clock()
    run_pass(batch)
    warmup = clock() - t
    times, starts = [], []
    for _ in range(repeats):
        batch = make_batch()
        starts.append(round(wall(), 3))  # wall clock, to line passes up with a host sampler's log
        t = clock()
        run_pass(batch)
        times.append(clock() - t)
    return warmup, times, starts


def point_stats(times):
    """Median, min, max and spread ((max - min) / median) of a point's timed passes,
    and whether the spread exceeds UNSTABLE_SPREAD."""
    med = statistics.median(times)
    lo, hi = min(times), max(times)
    spread = (hi - lo) / med
    return {"median_s": med, "min_s": lo, "max_s": hi, "spread": spread, "unstable": spread > UNSTABLE_SPREAD}


def unstable_line(rec):
    """The line that flags an unstable point (its record's "unstable"), else None."""
    if not rec.get("unstable"):
        return None
    return (f"UNSTABLE {rec['mode']} {rec['len']}x{rec['batch']}: spread {100 * rec['spread']:.1f} % > "
            f"{100 * UNSTABLE_SPREAD:.0f} % (median {1e3 * rec['median_s']:.1f} ms, min {1e3 * rec['min_s']:.1f} ms, "
            f"max {1e3 * rec['max_s']:.1f} ms)")


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
    # "on": the server's default --kv-sharing-fast-prefill-min-tokens; "on-all": every pass;
    # "ceiling": on-all without the back half (model_dir is the full model's)
    yoco = {"kv_sharing_fast_prefill": mode in ("on", "on-all", "on-all-eager")}
    if mode.startswith("on-all"):
        yoco["kv_sharing_fast_prefill_min_tokens"] = 0
    if mode == "ceiling":
        yoco = ceiling_kwargs()
    eng = sgl.Engine(
        model_path=model_dir,
        disable_radix_cache=True,
        tp_size=tp,
        **engine_kwargs(**graph, **yoco, **(extra or {})),
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
        warmup, ts, starts = time_point(lambda batch: eng.generate(input_ids=batch, sampling_params=sp),
                                        lambda: ids(n, L), repeats)
        st = point_stats(ts)
        rec = {"mode": mode, "len": L, "batch": n, **st, "tok_s": L * n / st["median_s"], "warmup_s": warmup,
               "times_s": ts, "started_unix": starts}
        print(f"RESULT {json.dumps(rec)}", flush=True)
        if unstable_line(rec):
            print(unstable_line(rec), flush=True)
        out.append(rec)
    if parity and not mode.startswith("ceiling"):
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
    """A row per point: each mode's median time (<mode>_s), min (<mode>_min_s), spread
    (spread_<mode>) and flag (unstable_<mode>), each YOCO mode's speed-up over off, and for
    every YOCO mode measured beside the ceiling its share of the ceiling (ceiling time / the
    mode's time: 100 % means the back half cost nothing), from the medians
    (share_of_ceiling_<mode>) and from the mins (share_of_ceiling_<mode>_min). "unstable":
    some mode's spread at the point exceeds UNSTABLE_SPREAD."""
    by = {(r["mode"], r["len"], r["batch"]): r for r in results if "median_s" in r}
    table = []
    for L, n in points:
        recs = {m: r for (m, rl, rn), r in by.items() if (rl, rn) == (L, n)}
        off, ce = recs.get("off"), recs.get("ceiling")
        row = {"len": L, "batch": n, "off_s": None, "on_s": None, "ceiling_s": None}
        for mode, r in recs.items():
            key = mode.replace("-", "_")
            row[f"{key}_s"] = r["median_s"]
            if r.get("min_s") is not None:  # records of older runs have medians only
                row[f"{key}_min_s"] = r["min_s"]
                row[f"spread_{key}"] = r["spread"]
                row[f"unstable_{key}"] = r["unstable"]
        for mode in FAST_MODES:
            r = recs.get(mode)
            if r is None:
                continue
            key = mode.replace("-", "_")
            if off:
                row[f"speedup_{key}"] = off["median_s"] / r["median_s"]
            if ce:
                row[f"share_of_ceiling_{key}"] = ce["median_s"] / r["median_s"]
                if ce.get("min_s") and r.get("min_s"):
                    row[f"share_of_ceiling_{key}_min"] = ce["min_s"] / r["min_s"]
        if off and ce:
            row["ceiling_speedup"] = off["median_s"] / ce["median_s"]
        if "speedup_on" in row:
            row["speedup"] = row["speedup_on"]  # the names older runs used
        if "share_of_ceiling_on" in row:
            row["fraction_of_ceiling"] = row["share_of_ceiling_on"]
        row["unstable"] = any(r.get("unstable", False) for r in recs.values())
        table.append(row)
    return table


def share_lines(table):
    """A SHARE line per YOCO mode measured at a point: the mode, its speed-up over off
    and its share of the ceiling (medians, then mins), each where that side was measured,
    the spreads of the mode, the ceiling and off, and an UNSTABLE mark where one of them
    exceeds UNSTABLE_SPREAD."""
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
            shm = row.get(f"share_of_ceiling_{key}_min")
            if shm is not None:
                parts.append(f"{100 * shm:.1f} % by min ({1e3 * row['ceiling_min_s']:.1f} ms against "
                             f"{1e3 * row[f'{key}_min_s']:.1f} ms)")
            sides = [(mode, key), ("ceiling", "ceiling"), ("off", "off")]
            spreads = [f"{m} {100 * row[f'spread_{k}']:.1f} %" for m, k in sides if f"spread_{k}" in row]
            line = f"SHARE {mode} {row['len']}x{row['batch']}: {', '.join(parts)}"
            if spreads:
                line += "; spread " + ", ".join(spreads)
            if any(row.get(f"unstable_{k}") for _, k in sides):
                line += f" UNSTABLE (spread > {100 * UNSTABLE_SPREAD:.0f} %)"
            lines.append(line)
    return lines


def write_json(path, a, results, points):
    table = ceiling_table(results, points)
    with open(path, "w") as f:
        json.dump({"variant": a.variant, "serving_graphs": a.serving_graphs, "repeats": a.repeats,
                   "reportable": a.repeats >= MIN_REPEATS,
                   "method": {"warmup_passes_per_point": 1, "timed_repeats": a.repeats,
                              "spread": "(max - min) / median", "unstable_above": UNSTABLE_SPREAD},
                   "results": results, "table": table}, f, indent=1)
    return table


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--variant", default="e4b")
    ap.add_argument("--points", default=DEFAULT_POINTS)
    ap.add_argument("--repeats", type=int, default=MIN_REPEATS,
                    help=f"timed passes per point after its warm-up (at least {MIN_REPEATS})")
    ap.add_argument("--few-repeats", action="store_true",
                    help=f"allow --repeats below {MIN_REPEATS} (a smoke or profile run: not for reported figures)")
    ap.add_argument("--modes", default="off,on,ceiling")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--profile-point", default="", help="LxN: profile one prefill of that shape per mode")
    ap.add_argument("--extra", default="{}", help="JSON of engine kwargs for every mode")
    ap.add_argument("--parity", type=int, default=0, help="N prompts decoded greedily per mode, compared")
    ap.add_argument("--serving-graphs", action="store_true",
                    help="keep the default prefill CUDA graph (with YOCO on: below the threshold)")
    a = ap.parse_args()
    if a.repeats < 1:
        ap.error("--repeats must be at least 1")
    if a.repeats < MIN_REPEATS:
        if not a.few_repeats:
            ap.error(f"--repeats {a.repeats}: a reported figure needs at least {MIN_REPEATS} timed repeats "
                     "(--few-repeats for a smoke or profile run)")
        print(f"WARNING: --repeats {a.repeats} < {MIN_REPEATS}: these figures are not for reporting "
              '(the JSON says "reportable": false)', flush=True)
    points = [tuple(int(x) for x in p.split("x")) for p in a.points.split(",")]
    profile = tuple(int(x) for x in a.profile_point.split("x")) if a.profile_point else None
    root = os.environ.get("YOCO_CKPT_DIR", "/tmp/yoco_ckpt")
    full = write_text_checkpoint(f"{root}/{a.variant}", a.variant)
    shared = text_config(a.variant).get("num_kv_shared_layers", 0) > 0
    cv = ceiling_variant(a.variant)
    results = []
    for mode in a.modes.split(","):
        # The ceiling serves the full model (the fast path without its back half);
        # ceiling-cut serves the model cut to its front layers.
        if (mode == "ceiling" and not shared) or (mode == "ceiling-cut" and cv is None):
            print(f"== mode {mode}: skipped, {a.variant} has no KV-shared layers", flush=True)
            continue
        model = write_text_checkpoint(f"{root}/{cv}", cv) if mode == "ceiling-cut" else full
        print(f"== mode {mode}", flush=True)
        results += sweep(mode, model, points, a.repeats, a.tp,
                         text_config(a.variant)["vocab_size"], a.serving_graphs, profile,
                         os.path.dirname(os.path.abspath(a.out)), json.loads(a.extra), a.parity)
        write_json(a.out, a, results, points)
    outs = [r for r in results if "parity_ids" in r]
    for r in outs[1:]:
        same = sum(x == y for x, y in zip(outs[0]["parity_ids"], r["parity_ids"]))
        print(f"PARITY {r['mode']} vs {outs[0]['mode']}: {same}/{len(r['parity_ids'])} identical", flush=True)
    table = write_json(a.out, a, results, points)
    for row in table:
        print("ROW", json.dumps(row), flush=True)
    for line in share_lines(table):
        print(line, flush=True)


if __name__ == "__main__":
    main()
