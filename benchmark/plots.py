#!/usr/bin/env python3
"""Draw the results plots from the raw JSON kept beside the results documents.

    python benchmark/plots.py            # needs matplotlib (pip install matplotlib)

Reads .humanize/yoco-gemma4/data/*.json and .humanize/frozen-kv-mtp/data/*.json (the
files `benchmark/*/bench.py` writes) and writes:
  .humanize/yoco-gemma4/plots/prefill_speedup.png   prefill speed-up of YOCO on against off,
        by prompt length, E2B and E4B at batch 1 and 8, with the ceiling (the model cut to
        its first KV-shared layer: what skipping the back half entirely would give)
  .humanize/yoco-gemma4/plots/served.png            served output tok/s and median TTFT,
        YOCO off against on (summ 8000/1000, chat 1000/1000, 80 prompts)
  .humanize/frozen-kv-mtp/plots/step_time.png       decode step time against context at
        batch 8: no speculation, stock FROZEN_KV_MTP, the fork's grouped split-KV verify
Each point comes from the latest measurement of it; SOURCES below names the files.
"""

import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
YOCO = os.path.join(ROOT, ".humanize", "yoco-gemma4")
MTP = os.path.join(ROOT, ".humanize", "frozen-kv-mtp")

# (variant, batch) -> [(file, shortest, longest length taken from it)]; a later file wins
# a point. Engine-level prefill_bench.py files ("results") and forward_bench.py ones
# ("table"). The long prompts' file predates the back half's CUDA graphs and ran the
# default threshold (4096), so it gives 4096 tokens and up only. The forward-alone files at
# 1024-2048 x 1 on E4B are left out: those passes are host-bound and each process runs at
# one of two speeds (results.md).
SOURCES = {
    ("e4b", 1): [("prefill_e4b_run3.json", 4096, 32000), ("run19_PS_prefill_e4b_short.json", 64, 1024),
                 ("run22_PB_forward_e4b_batch1.json", 4096, 8000)],
    ("e4b", 8): [("prefill_e4b_run3.json", 4096, 32000), ("run19_PS_prefill_e4b_short.json", 64, 1024),
                 ("run18_X_prefill_e4b_graph.json", 1024, 4096)],
    ("e2b", 1): [("prefill_e2b_run3.json", 4096, 32000), ("run19_PS_prefill_e2b_short.json", 64, 1024),
                 ("run22_PB_forward_e2b_batch1.json", 2048, 8000)],
    ("e2b", 8): [("prefill_e2b_run3.json", 4096, 32000), ("run14_prefill_e2b_back_half_graph_run14.json", 64, 2048),
                 ("run19_PS_prefill_e2b_short.json", 64, 256)],
}
SERVED = [  # (label, file, workload)
    ("E4B summ", "run13_serve_e4b_mm_results.json", "summ"),
    ("E4B chat", "run19_D4_merged_results.json", "chat"),
    ("E2B summ", "run16_SG_serve_e2b_mm_results.json", "summ"),
    ("E2B chat", "run19_D2_merged_results.json", "chat"),
    ("E4B TP=2 summ", "run18_Y12_merged_results.json", "summ"),
    ("E4B TP=2 chat", "run20_Z_merged_results.json", "chat"),
]
STEPS = {  # target -> (mode label, file, mode) at batch 8
    "E4B": [("no speculation", "profile_draft_e4b_splitkv_run9.json", "off"),
            ("stock FROZEN_KV_MTP", "profile_draft_e4b_splitkv_run9.json", "mtp"),
            ("fork: grouped split-KV verify", "run16_GG_draft_e4b_grouped.json", "mtp-splitkv-grouped")],
    "31B shape": [("no speculation", "profile_draft_31b_splitkv_run10.json", "off"),
                  ("stock FROZEN_KV_MTP", "profile_draft_31b_splitkv_run10.json", "mtp"),
                  ("fork: grouped split-KV verify", "profile_draft_31b_g3b_run27.json", "mtp-splitkv-grouped")],
}


def load(folder, name):
    with open(os.path.join(folder, "data", name)) as f:
        return json.load(f)


def prefill_times(files, batch):
    """length -> {mode: seconds} for one batch size, later files winning per (length, mode)."""
    out = {}
    for name, lo, hi in files:
        d = load(YOCO, name)
        fresh = {}  # a file's points replace earlier files' points whole
        for r in d.get("results", []):
            if r.get("batch") == batch and "median_s" in r and lo <= r["len"] <= hi:
                fresh.setdefault(r["len"], {})[r["mode"]] = r["median_s"]
        for r in d.get("table", []):
            if r.get("batch") == batch and lo <= r["len"] <= hi:
                for mode in ("off", "on-all", "ceiling"):
                    if f"{mode}_ms" in r:
                        fresh.setdefault(r["len"], {})[mode] = r[f"{mode}_ms"] / 1e3
        out.update(fresh)
    return out


def speedups(variant, batch):
    """[(length, on/off speed-up, ceiling speed-up)] where both sides were measured."""
    rows = []
    for length, t in sorted(prefill_times(SOURCES[(variant, batch)], batch).items()):
        on = t.get("on-all", t.get("on"))
        if "off" in t and on:
            rows.append((length, t["off"] / on, t["off"] / t["ceiling"] if "ceiling" in t else None))
    return rows


def plot_prefill(plt, path):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, batch in zip(axes, (1, 8)):
        for variant, color in (("e2b", "tab:blue"), ("e4b", "tab:orange")):
            rows = speedups(variant, batch)
            xs = [r[0] for r in rows]
            ax.plot(xs, [r[1] for r in rows], "o-", color=color, label=f"{variant.upper()} YOCO on")
            ceil = [(r[0], r[2]) for r in rows if r[2]]
            ax.plot([c[0] for c in ceil], [c[1] for c in ceil], "--", color=color, alpha=0.6,
                    label=f"{variant.upper()} ceiling")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("prompt length (tokens)")
        ax.set_title(f"batch {batch}")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("prefill speed-up, YOCO on / off")
    axes[1].legend(loc="lower right")
    fig.suptitle("YOCO fast prefill on an H200 (Gemma-4 shapes, one prefill pass, fast path on every pass)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_served(plt, path):
    rows = []
    for label, name, workload in SERVED:
        d = load(YOCO, name)
        side = {}
        for r in d["serving"]:
            if r["workload"] == workload:
                side[r.get("mode", "?")] = r
        rows.append((label, side["off"], side["on"]))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    xs = range(len(rows))
    for ax, key, title in ((axes[0], "output_throughput", "output tok/s (higher is better)"),
                           (axes[1], "median_ttft_ms", "median TTFT, ms (lower is better)")):
        off = [r[1][key] for r in rows]
        on = [r[2][key] for r in rows]
        ax.bar([x - 0.2 for x in xs], off, 0.4, label="YOCO off", color="tab:grey")
        ax.bar([x + 0.2 for x in xs], on, 0.4, label="YOCO on", color="tab:green")
        for x, a, b in zip(xs, off, on):
            ax.annotate(f"{(b / a - 1) * 100:+.0f}%", (x + 0.2, b), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(xs), [r[0] for r in rows], rotation=30, ha="right")
        ax.set_title(title)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend()
    fig.suptitle("Served on an H200: summ 8000/1000, chat 1000/1000, 80 prompts at once")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_steps(plt, path):
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, (target, lines) in zip(axes, STEPS.items()):
        for label, name, mode in lines:
            pts = sorted((r["context"], r["step_ms"]) for r in load(MTP, name)["results"]
                         if r["mode"] == mode and r["batch"] == 8)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
            ax.annotate(f"{pts[-1][1] / pts[0][1]:.2f}x", pts[-1], textcoords="offset points",
                        xytext=(4, 0), fontsize=8)
        ax.set_xlabel("context (keys per request)")
        ax.set_ylabel("decode step time (ms)")
        ax.set_title(f"{target}, batch 8")
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[0].legend(fontsize=8)
    fig.suptitle("FROZEN_KV_MTP step time on an H200 (3 draft steps, simulated accept length 2.1: an MTP step "
                 "emits 2.1 tokens a request, a step without speculation 1)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for folder, name, draw in ((YOCO, "prefill_speedup.png", plot_prefill), (YOCO, "served.png", plot_served),
                               (MTP, "step_time.png", plot_steps)):
        os.makedirs(os.path.join(folder, "plots"), exist_ok=True)
        path = os.path.join(folder, "plots", name)
        draw(plt, path)
        print("wrote", os.path.relpath(path, ROOT))


if __name__ == "__main__":
    main()
