#!/usr/bin/env python3
"""The physical floor of a prefill pass: the bytes and FLOPs it must move, at a GPU's peak.

    python benchmark/yoco_gemma4/floor.py [--variants e2b,e4b,3n-e2b] [--points 1024x8,4096x1,8000x8]
        [--gpu h100|h200] [--measured PREFILL.json ...] [--json OUT.json]

For each model and point (prompt length x batch: fresh prompts, no cached prefix), three
amounts of work, each as FLOPs and bytes, and its time at the GPU's dense bf16 peak and
HBM bandwidth:

- ceiling: what the bench's ceiling runs (`yoco_ceiling.py`): the embedding and the
  per-layer inputs (their embedding gather and projection GEMM at every layer's width),
  every layer before the first KV-shared one on every token, the final norm and the
  logits of each request's last token;
- fast: the fast path as it runs today: the ceiling's work and the KV-shared layers on
  each request's last token;
- floor: what a prefill with KV-shared layers must do: the fast path's work, less the
  last front layer's attention, o-projection, MLP and per-layer input on every token but
  each request's last (only its K and V are read later: its K/V projection, norms and
  rope run on every token, the rest on the last tokens with the back half).

The model of a phase's time is max(FLOPs / peak, bytes / bandwidth), and a pass's is the
sum of its phases' (each one's kernels wait for the one before): the layers on every
token; the layers on the last tokens (the back half, and in the floor the last front
layer's rest); the logits. FLOPs: 2 per weight element per token through a linear
layer; attention 4 x head_dim x query heads per (query, key) pair it attends (causal; a
sliding layer's window W: min(i + 1, W + 1) keys for the query at i). Bytes: each weight
read once per phase (bf16), each K and V written once and read once by the attention of
the layer that writes it, each KV-shared layer's keys read once per query row, the
per-layer embedding rows gathered, the hidden states in and out of a phase. Not counted:
activations between kernels (a perfectly fused pass keeps them on chip), norms and
element-wise math (FLOPs, not bytes, and a few percent of the GEMMs'), Gemma-3n's AltUp
mixing (4 x 4 coefficients per token and layer) and activation-sparsity top-k.

--measured: `bench.py prefill` JSON (modes on-all and ceiling): each point's medians
against these floors. The measured time is a pass end to end (`Engine.generate` of one
token: scheduling, host launches and the GPU), the floor the GPU's arithmetic alone.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIGS = {
    "e2b": "gemma-4-E2B-it.text_config.json",
    "e4b": "gemma-4-E4B-it.text_config.json",
    "3n-e2b": "gemma-3n-E2B-it.text_config.json",
    "3n-e4b": "gemma-3n-E4B-it.text_config.json",
}
# Dense bf16 tensor-core peak (no sparsity) and HBM bandwidth, from NVIDIA's data sheets.
GPUS = {"h100": (989e12, 3.35e12), "h200": (989e12, 4.8e12)}
BF16 = 2


def load_config(variant):
    with open(os.path.join(HERE, "configs", CONFIGS[variant])) as f:
        c = json.load(f)
    return c.get("text_config", c)


class Layer:
    """One decoder layer's shapes: weight elements by part, attention geometry."""

    def __init__(self, c, i):
        full = c["layer_types"][i] == "full_attention"
        self.window = None if full else c["sliding_window"]
        self.head_dim = (c.get("global_head_dim") if full else None) or c["head_dim"]
        self.q_heads = c["num_attention_heads"]
        self.kv_heads = c["num_key_value_heads"]
        h = c["hidden_size"]
        first_shared = c["num_hidden_layers"] - c["num_kv_shared_layers"]
        inter = c["intermediate_size"]
        inter = inter[i] if isinstance(inter, list) else inter
        if c.get("use_double_wide_mlp") and i >= first_shared:
            inter *= 2
        ple = c.get("hidden_size_per_layer_input") or 0
        q, kv = self.q_heads * self.head_dim, self.kv_heads * self.head_dim
        self.kv_proj = h * 2 * kv
        self.rest = h * q + q * h + 3 * h * inter + 2 * h * ple  # q, o, MLP, per-layer input
        if c.get("laurel_rank"):
            self.rest += 2 * h * c["laurel_rank"]
        self.weights = self.kv_proj + self.rest
        self.kv_bytes_per_token = 2 * kv * BF16

    def attention_pairs(self, n):
        """(query, key) pairs of a fresh prompt of n tokens."""
        if self.window is None:
            return n * (n + 1) // 2
        w = self.window + 1
        m = min(n, w)
        return m * (m + 1) // 2 + (n - m) * w

    def attention_flops(self, pairs):
        return 4 * self.head_dim * self.q_heads * pairs


class Phase:
    def __init__(self, name):
        self.name, self.flops, self.bytes = name, 0.0, 0.0

    def time(self, peak, bw):
        return max(self.flops / peak, self.bytes / bw)


def passes(c, seq, rows):
    """{kind: [phases]} for `rows` requests of `seq` new tokens each."""
    n_layers, shared = c["num_hidden_layers"], c["num_kv_shared_layers"]
    first_shared = n_layers - shared
    h, vocab = c["hidden_size"], c["vocab_size"]
    ple = c.get("hidden_size_per_layer_input") or 0
    layers = [Layer(c, i) for i in range(n_layers)]
    tokens = seq * rows
    out = {}
    for kind in ("ceiling", "fast", "floor"):
        every, last, logits = Phase("every token"), Phase("last tokens"), Phase("logits")
        # Embedding rows and the per-layer inputs of every layer (gather + projection GEMM).
        every.bytes += tokens * (h + n_layers * ple) * BF16
        every.flops += 2 * tokens * h * n_layers * ple
        every.bytes += h * n_layers * ple * BF16
        for i in range(first_shared):
            L = layers[i]
            kv_rw = 2 * tokens * L.kv_bytes_per_token  # written, then read by its attention
            if kind == "floor" and i == first_shared - 1:
                # K/V for every token; q, attention, o, MLP, per-layer input for the last.
                every.flops += 2 * tokens * L.kv_proj
                every.bytes += L.kv_proj * BF16 + kv_rw + tokens * h * BF16
                last.flops += 2 * rows * L.rest + rows * L.attention_flops(seq)
                last.bytes += L.rest * BF16 + rows * seq * L.kv_bytes_per_token
                continue
            every.flops += 2 * tokens * L.weights + rows * L.attention_flops(L.attention_pairs(seq))
            every.bytes += L.weights * BF16 + kv_rw + 2 * tokens * h * BF16
        if kind != "ceiling":
            for i in range(first_shared, n_layers):
                L = layers[i]
                keys = seq if L.window is None else min(seq, L.window + 1)
                last.flops += 2 * rows * (L.weights - L.kv_proj) + rows * L.attention_flops(keys)
                last.bytes += (L.weights - L.kv_proj) * BF16 + rows * keys * L.kv_bytes_per_token
                last.bytes += rows * ple * BF16
            last.bytes += 2 * rows * h * BF16
        logits.flops += 2 * rows * h * vocab
        logits.bytes += h * vocab * BF16
        out[kind] = [every, last, logits]
    return out


def measured_medians(paths):
    """{(len, batch): {mode: median_s}} from bench.py prefill JSON files (first seen wins)."""
    got = {}
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        for r in d["results"]:
            if "median_s" in r and "profile" not in r:
                got.setdefault((r["len"], r["batch"]), {}).setdefault(r["mode"], r["median_s"])
    return got


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--variants", default="e2b,e4b,3n-e2b")
    ap.add_argument("--points", default="1024x8,4096x1,8000x8")
    ap.add_argument("--gpu", default="h100", choices=sorted(GPUS))
    ap.add_argument("--measured", nargs="*", default=[], help="bench.py prefill JSON (one variant)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    peak, bw = GPUS[a.gpu]
    measured = measured_medians(a.measured)
    rows_out = []
    print(f"floor model at {a.gpu}: {peak / 1e12:.0f} TFLOP/s bf16, {bw / 1e12:.2f} TB/s")
    print("variant point | ceiling ms | fast ms | floor ms | floor/ceiling | last-token phase "
          "(fast: FLOP-bound ms, byte-bound ms) | measured on-all / ceiling ms | on-all / floor")
    for v in a.variants.split(","):
        c = load_config(v)
        for p in a.points.split(","):
            seq, rows = (int(x) for x in p.split("x"))
            work = passes(c, seq, rows)
            t = {k: sum(ph.time(peak, bw) for ph in phases) * 1e3 for k, phases in work.items()}
            last = work["fast"][1]
            row = {"variant": v, "point": p, "gpu": a.gpu, "ms": t,
                   "phases": {k: [{"phase": ph.name, "gflop": ph.flops / 1e9, "mb": ph.bytes / 1e6,
                                   "ms": ph.time(peak, bw) * 1e3} for ph in phases]
                              for k, phases in work.items()}}
            m = measured.get((seq, rows), {})
            line = (f"{v:6s} {p:7s} | {t['ceiling']:8.2f} | {t['fast']:8.2f} | {t['floor']:8.2f} | "
                    f"{t['floor'] / t['ceiling'] * 100:6.1f} % | {last.flops / peak * 1e3:.3f}, "
                    f"{last.bytes / bw * 1e3:.3f}")
            if "on-all" in m and "ceiling" in m:
                row["measured_ms"] = {k: m[k] * 1e3 for k in ("on-all", "ceiling")}
                line += (f" | {m['on-all'] * 1e3:.1f} / {m['ceiling'] * 1e3:.1f} | "
                         f"{m['on-all'] * 1e3 / t['floor']:.2f}x")
            print(line)
            rows_out.append(row)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpu": a.gpu, "peak_flops": peak, "bandwidth": bw, "rows": rows_out}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
