"""YOCO off vs on, side by side, in one run: prefill microbenchmark + served benchmark.

    python benchmark/yoco_gemma4/run.py OUTDIR [--variant e4b] [--quick]
        [--skip-prefill] [--skip-serving] [--tp 1] [--mtp] [--workloads summ,chat] [--port 30000]
        [--multimodal] [--prefill-graph] [--modes off,on] [--no-warmup] [--server-extra JSON]
    python benchmark/yoco_gemma4/run.py OUTDIR --report-only   # tables + plots from OUTDIR
    python benchmark/yoco_gemma4/run.py OUTDIR --merge OFFDIR,ONDIR   # one table from two --modes runs

1. Prefill (engine level, prefill_bench.py and its method): lengths 64 .. 32k at batch 1
   and 8, YOCO off, on, and the ceiling (the fast path without its back half).
2. Served (`python -m sglang.benchmark.serving`, random ids at fixed lengths, seed 0):
   summ 8000 in / 1000 out and chat 1000 / 1000, 80 prompts each, then a concurrency
   sweep (1, 8, 32, 80) on chat. One server per mode on the same GPU; output tok/s,
   median / p99 TTFT, median TPOT.
   --mtp serves both modes with FROZEN_KV_MTP (E4B assistant drafter, steps 3, topk 1,
   4 draft tokens) at SGLANG_SIMULATE_ACC_LEN=2.1, the original study's accept length.
   --multimodal serves the released layout (Gemma4ForConditionalGeneration with vision
   and audio towers, make_checkpoint.py --multimodal) instead of the text-only one.
   --prefill-graph keeps SGLang's default prefill CUDA graph on both servers (the text-only
   layout captures one); YOCO on keeps it for passes below its min-tokens threshold.
   --modes on (or off) serves one side only, to complete a run that stopped part way, or
   when one side fills a device call (TP=2: stages Y1/Y2); --merge joins the two sides.
   Each server first serves every workload once unmeasured (WARMUP_PROMPTS prompts,
   WARMUP_OUTPUT tokens each, another seed), so no measured pass is a fresh server's
   first at its shapes. --no-warmup measures the cold server.
   Every pass starts from an empty prefix cache (bench_serving --flush-cache): one seed
   makes each chat prompt the start of a summ prompt, so a cached chat pass after summ
   would compare decode, not prefill.
Writes OUTDIR/results.json, OUTDIR/results.md and, where matplotlib is installed,
OUTDIR/speedup.png, OUTDIR/ttft.png (median TTFT per workload) and OUTDIR/ttft_cdf.png
(TTFT distributions, off vs on). Progress lines go to stdout.
Checkpoints: make_checkpoint.py (real config, synthetic tokenizer), weights from
`--load-format dummy` with SGLANG_DUMMY_WEIGHTS_AT_SCALE=1.
"""

import argparse
import json
import os
import subprocess
import sys
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from checkpoints import engine_kwargs, mtp_kwargs, text_config, write_assistant_checkpoint  # noqa: E402
from make_checkpoint import make_checkpoint  # noqa: E402

PREFILL_POINTS = [(L, n) for L in (64, 256, 1024, 2048, 4096, 8000, 16000, 32000) for n in (1, 8)]
WORKLOADS = [("summ", 8000, 1000, 80, None), ("chat", 1000, 1000, 80, None)]
CONCURRENCY = (1, 8, 32, 80)
MTP_ACCEPT_LEN = "2.1"
# The unmeasured pass over each workload before the measured ones (serve_workloads).
WARMUP_PROMPTS = 16
WARMUP_OUTPUT = 16


# summ at fewer requests at a time than its 80 (the tails at 8 and 32 concurrent).
SUMM_CONCURRENCY = (8, 32)


def concurrency_workloads():
    """A workload with N requests at a time (NAME-cN): chat for each N in CONCURRENCY,
    summ for each N in SUMM_CONCURRENCY; 4 x N prompts, at least 8 and at most 80."""
    def at(name, inp, outp, conc):
        return (f"{name}-c{conc}", inp, outp, min(80, max(8, 4 * conc)), conc)

    return ([at("chat", 1000, 1000, c) for c in CONCURRENCY]
            + [at("summ", 8000, 1000, c) for c in SUMM_CONCURRENCY])


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ------------------------------------------------------------------ prefill


def run_prefill(out, variant, quick, tp):
    from prefill_bench import MIN_REPEATS, sweep

    points = [(256, 8), (1024, 8), (8000, 8)] if quick else PREFILL_POINTS
    full = make_checkpoint(f"{out}/ckpt-{variant}", variant)
    cfg = text_config(variant)
    res = []
    # The ceiling serves the full model (the fast path without its back half).
    for mode in ("off", "on", "ceiling") if cfg.get("num_kv_shared_layers", 0) > 0 else ("off", "on"):
        log(f"prefill: mode {mode}, {len(points)} points")
        res += sweep(mode, full, points, 1 if quick else MIN_REPEATS, tp, cfg["vocab_size"])
    return res


# ------------------------------------------------------------------ serving


def _server_cmd(model, port, yoco, tp, draft=None, **extra):
    """The engine settings of the prefill benchmark (plus `extra` engine kwargs), as server flags."""
    kw = engine_kwargs(**{"skip_tokenizer_init": False, "tp_size": tp, "log_level": "warning",
                          **(mtp_kwargs(draft) if draft else {}), **extra})
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--port", str(port)]
    for k, v in kw.items():
        if v is False or v is None:
            continue
        cmd.append("--" + k.replace("_", "-"))
        if v is not True:
            cmd.append(str(v))
    return cmd + (["--kv-sharing-fast-prefill"] if yoco else [])


def _wait_healthy(port, proc, timeout=900):
    t0 = time.time()
    while time.time() - t0 < timeout:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}")
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return
        except Exception:
            time.sleep(2)
    raise RuntimeError("server did not become healthy")


def _bench(model, port, name, inp, outp, prompts, conc, jsonl, seed=0):
    cmd = [
        sys.executable, "-m", "sglang.benchmark.serving", "--backend", "sglang",
        "--host", "127.0.0.1", "--port", str(port), "--model", model, "--tokenizer", model,
        "--dataset-name", "random-ids", "--random-input-len", str(inp),
        "--random-output-len", str(outp), "--random-range-ratio", "1.0",
        "--num-prompts", str(prompts), "--seed", str(seed), "--output-file", jsonl, "--output-details",
        # An empty prefix cache for every pass: one seed gives every workload the same
        # prompts' beginnings (chat prompt i is summ prompt i's first 1000 tokens), so a
        # pass after another one, or after bench_serving's own warm-up request, hit the
        # radix cache and prefilled almost nothing (chat after summ: 80 x 1000 tokens in
        # 0.41 s, against 1.5 s uncached, on an H200).
        "--flush-cache",
    ] + (["--max-concurrency", str(conc)] if conc else [])
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    with open(jsonl) as f:
        m = json.loads(f.readlines()[-1])
    keep = ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms", "mean_ttft_ms")
    return {"workload": name, "input_len": inp, "output_len": outp, "num_prompts": prompts,
            "max_concurrency": conc, **{k: m.get(k) for k in keep},
            # for the TTFT distribution plot; a failed request has ttft 0 (counted in "completed")
            "ttfts_ms": sorted(1000 * t for t in m.get("ttfts") or [] if t > 0), "completed": m.get("completed")}


def run_serving(out, variant, quick, tp, mtp=False, only=None, port_base=30000, multimodal=False,
                prefill_graph=False, modes=("off", "on"), warmup=True, server_extra=None):
    model = make_checkpoint(f"{out}/ckpt-{variant}{'-mm' if multimodal else ''}", variant, multimodal)
    env = dict(os.environ, SGLANG_DUMMY_WEIGHTS_AT_SCALE="1")
    draft = None
    if mtp:
        tcfg = None if variant == "e4b" else text_config(variant)
        draft = write_assistant_checkpoint(f"{out}/ckpt-{variant}-assistant", tcfg)
        env["SGLANG_SIMULATE_ACC_LEN"] = MTP_ACCEPT_LEN
    workloads = list(WORKLOADS) + concurrency_workloads()
    if quick:
        workloads = [("summ", 8000, 200, 16, None), ("chat", 1000, 200, 16, None)]
    if only:
        workloads = [w for w in workloads if w[0] in only]
    extra = {"disable_prefill_cuda_graph": False} if prefill_graph else {}
    if multimodal:
        # The server's warm-up runs the vision tower; on SM90 its default attention is
        # FA3 from sgl_kernel, which the offline wheel packs lack.
        extra["mm_attention_backend"] = "triton_attn"
    extra.update(server_extra or {})
    res = []
    for mode in modes:
        port = port_base + (mode == "on")
        log(f"serving: starting server, YOCO {mode}{' with FROZEN_KV_MTP' if mtp else ''}")
        res += serve_workloads(_server_cmd(model, port, mode == "on", tp, draft, **extra), env, port, model,
                               workloads, f"{out}/serving_{mode}.jsonl", f"YOCO {mode}", mode, warmup)
    return res


def serve_workloads(cmd, env, port, model, workloads, jsonl, label, mode, warmup=True, warmup_prompts=WARMUP_PROMPTS,
                    on_measured=None, bench=None):
    """Start one server, run each workload against it in turn, stop it; rows tagged `mode`.
    With `warmup`, every workload first runs once unmeasured, small (see the docstring).
    `on_measured(name)`, if given, is called as each measured pass starts (e.g. to profile it).
    `bench`: what runs a pass (default `_bench`, bench_serving), with `_bench`'s arguments."""
    _bench = bench or globals()["_bench"]
    proc = subprocess.Popen(cmd, env=env)
    rows = []
    try:
        _wait_healthy(port, proc)
        if warmup:
            log(f"serving: {label}, warm-up ({warmup_prompts} prompts of each workload, unmeasured)")
            for name, inp, outp, n, conc in workloads:
                # Another seed: other prompts, so the radix cache holds none of the measured ones.
                _bench(model, port, name, inp, min(outp, WARMUP_OUTPUT), min(n, warmup_prompts), conc,
                       jsonl.replace(".jsonl", "_warmup.jsonl"), seed=1)
        for name, inp, outp, n, conc in workloads:
            log(f"serving: {label}, {name} ({inp}/{outp}, {n} prompts, concurrency {conc or 'all'})")
            started = time.time()
            if on_measured is not None:
                on_measured(name)
            r = _bench(model, port, name, inp, outp, n, conc, jsonl)
            r["mode"] = mode
            r["started_unix"] = round(started, 3)  # lines the pass up with server-side logs
            r["ended_unix"] = round(time.time(), 3)
            log("  " + json.dumps({k: v for k, v in r.items() if k != "ttfts_ms"}))
            rows.append(r)
    finally:
        proc.terminate()
        proc.wait(timeout=120)
    return rows


# ------------------------------------------------------------------ report


def report(out):
    with open(f"{out}/results.json") as f:
        data = json.load(f)
    mtp = " under FROZEN_KV_MTP, accept length " + MTP_ACCEPT_LEN if data.get("mtp") else ""
    layout = ", Gemma4ForConditionalGeneration" if data.get("multimodal") else ""
    graph = ", default prefill CUDA graph" if data.get("prefill_graph") else ""
    runs = f"{len(data['merged_from'])} runs merged" if data.get("merged_from") else "one run"
    lines = [f"# YOCO off vs on ({data['variant']}{layout}{mtp}{graph}, TP={data.get('tp', 1)}, {runs})", ""]
    pre = {(r["mode"], r["len"], r["batch"]): r["median_s"] for r in data.get("prefill", [])}
    if pre:
        lines += ["| input x batch | off (ms) | on (ms) | ceiling (ms) | speed-up | ceiling | share |",
                  "|---|---|---|---|---|---|---|"]
        for L, n in sorted({(k[1], k[2]) for k in pre}):
            off, on, ce = pre.get(("off", L, n)), pre.get(("on", L, n)), pre.get(("ceiling", L, n))
            sp = off / on if off and on else None
            cs = off / ce if off and ce else None
            fmt = lambda v, k=1e3: f"{v * k:.1f}" if v else "-"
            lines.append(f"| {L} x {n} | {fmt(off)} | {fmt(on)} | {fmt(ce)} | "
                         f"{f'{sp:.2f}x' if sp else '-'} | {f'{cs:.2f}x' if cs else '-'} | "
                         f"{f'{sp / cs:.0%}' if sp and cs else '-'} |")
        lines.append("")
    srv = data.get("serving", [])
    if srv:
        lines += ["| workload | metric | off | on | change |", "|---|---|---|---|---|"]
        by = {(r["mode"], r["workload"]): r for r in srv}
        for w in dict.fromkeys(r["workload"] for r in srv):
            for k in ("output_throughput", "median_ttft_ms", "p99_ttft_ms", "median_tpot_ms"):
                a, b = by.get(("off", w), {}).get(k), by.get(("on", w), {}).get(k)
                ch = f"{(b / a - 1):+.1%}" if a and b else "-"
                fa, fb = (f"{v:.1f}" if v is not None else "not run" for v in (a, b))
                lines.append(f"| {w} | {k} | {fa} | {fb} | {ch} |")
    with open(f"{out}/results.md", "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))
    _plots(out, pre, srv)


def _plots(out, pre, srv):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib not installed: no plots (run --report-only where it is)")
        return
    if pre:
        fig, ax = plt.subplots(figsize=(6, 4))
        for n in sorted({k[2] for k in pre}):
            Ls = sorted(L for (m, L, b) in pre if m == "on" and b == n)
            ax.plot(Ls, [pre[("off", L, n)] / pre[("on", L, n)] for L in Ls], "o-", label=f"YOCO, batch {n}")
            Lc = [L for L in Ls if ("ceiling", L, n) in pre]  # a point may be missing
            if Lc:
                ax.plot(Lc, [pre[("off", L, n)] / pre[("ceiling", L, n)] for L in Lc], "--", label=f"ceiling, batch {n}")
        ax.set_xscale("log")
        ax.set_xlabel("input tokens")
        ax.set_ylabel("prefill speed-up (off / on)")
        ax.axhline(1.0, color="gray", lw=0.5)
        ax.legend()
        fig.tight_layout()
        fig.savefig(f"{out}/speedup.png", dpi=120)
    dist = [w for w in dict.fromkeys(r["workload"] for r in srv)
            if all(r.get("ttfts_ms") for r in srv if r["workload"] == w) and
            {r["mode"] for r in srv if r["workload"] == w} == {"off", "on"}]
    if dist:  # TTFT distributions (empirical CDF), YOCO off vs on, per workload
        fig, axes = plt.subplots(1, len(dist), figsize=(4 * len(dist), 3.5), squeeze=False)
        for ax, w in zip(axes[0], dist):
            for r in (r for r in srv if r["workload"] == w):
                t = r["ttfts_ms"]
                ax.plot(t, [(i + 1) / len(t) for i in range(len(t))], drawstyle="steps-post", label=f"YOCO {r['mode']}")
            ax.set_title(w)
            ax.set_xlabel("TTFT (ms)")
            ax.set_ylabel("fraction of requests")
            ax.legend()
        fig.tight_layout()
        fig.savefig(f"{out}/ttft_cdf.png", dpi=120)
    if srv:
        fig, ax = plt.subplots(figsize=(6, 4))
        ws = list(dict.fromkeys(r["workload"] for r in srv))
        for i, mode in enumerate(("off", "on")):
            vals = [next((r["median_ttft_ms"] for r in srv if r["mode"] == mode and r["workload"] == w), 0) for w in ws]
            ax.bar([j + 0.4 * i for j in range(len(ws))], vals, width=0.4, label=f"YOCO {mode}")
        ax.set_xticks([j + 0.2 for j in range(len(ws))], ws, rotation=30)
        ax.set_ylabel("median TTFT (ms)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(f"{out}/ttft.png", dpi=120)


def merge(out, dirs):
    """One results.json from runs that each served some of the modes (--modes off, then
    --modes on in another device call). They must describe the same setup and not serve
    the same mode and workload twice."""
    parts = []
    for d in dirs:
        with open(f"{d}/results.json") as f:
            parts.append(json.load(f))
    setup = ("variant", "tp", "mtp", "multimodal", "prefill_graph", "warmup", "server_extra")
    for p in parts:
        p.setdefault("server_extra", {})  # results written before --server-extra existed
    for d, p in zip(dirs[1:], parts[1:]):
        diff = [k for k in setup if p.get(k) != parts[0].get(k)]
        if diff:
            raise SystemExit(f"--merge: {d} differs from {dirs[0]} in {', '.join(diff)}; "
                             "merge only runs of the same setup")
    data = {k: parts[0].get(k) for k in setup}
    data["merged_from"] = [{"dir": d, "started": p.get("started")} for d, p in zip(dirs, parts)]
    for key, ident in (("prefill", ("mode", "len", "batch")), ("serving", ("mode", "workload"))):
        rows = [r for p in parts for r in p.get(key, [])]
        seen = [tuple(r[k] for k in ident) for r in rows]
        dup = sorted({x for x in seen if seen.count(x) > 1})
        if dup:
            raise SystemExit(f"--merge: {key} rows {dup} appear in more than one run; "
                             "merge runs that each served other modes")
        if rows:
            data[key] = rows
    with open(f"{out}/results.json", "w") as f:
        json.dump(data, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--variant", default="e4b")
    ap.add_argument("--quick", action="store_true", help="a few points / prompts, for a smoke run")
    ap.add_argument("--skip-prefill", action="store_true")
    ap.add_argument("--skip-serving", action="store_true")
    ap.add_argument("--report-only", action="store_true")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--mtp", action="store_true", help="serve with FROZEN_KV_MTP (both modes)")
    ap.add_argument("--workloads", default="", help="comma list of served workloads (default: all)")
    ap.add_argument("--port", type=int, default=30000, help="servers use PORT (off) and PORT+1 (on)")
    ap.add_argument("--multimodal", action="store_true", help="serve the Gemma4ForConditionalGeneration layout")
    ap.add_argument("--prefill-graph", action="store_true", help="servers keep the default prefill CUDA graph")
    ap.add_argument("--modes", default="off,on", help="served YOCO modes: off,on | off | on")
    ap.add_argument("--no-warmup", action="store_true", help="measure each server's first pass over a workload")
    ap.add_argument("--server-extra", default="{}",
                    help="JSON of server args for both sides, e.g. '{\"log_level\": \"info\"}' to log each batch")
    ap.add_argument("--merge", default="", help="comma list of OUTDIRs of runs with other --modes: report them as one")
    a = ap.parse_args()
    if a.modes not in ("off,on", "off", "on"):
        ap.error(f"--modes must be off,on, off or on (got {a.modes!r})")
    os.makedirs(a.out, exist_ok=True)
    if a.merge:
        merge(a.out, [d for d in a.merge.split(",") if d])
    elif not a.report_only:
        data = {"variant": a.variant, "tp": a.tp, "mtp": a.mtp, "multimodal": a.multimodal,
                "prefill_graph": a.prefill_graph, "warmup": not a.no_warmup, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                "server_extra": json.loads(a.server_extra)}
        if not a.skip_prefill:
            data["prefill"] = run_prefill(a.out, a.variant, a.quick, a.tp)
        if not a.skip_serving:
            only = [w for w in a.workloads.split(",") if w]
            data["serving"] = run_serving(a.out, a.variant, a.quick, a.tp, a.mtp, only, a.port, a.multimodal,
                                          a.prefill_graph, tuple(a.modes.split(",")), not a.no_warmup,
                                          json.loads(a.server_extra))
        with open(f"{a.out}/results.json", "w") as f:
            json.dump(data, f, indent=1)
    report(a.out)


if __name__ == "__main__":
    main()
