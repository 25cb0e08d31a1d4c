#!/usr/bin/env python3
"""The back half's one-row attention: triton's decode kernel at more KV splits (GPU).

    python benchmark/yoco_gemma4/back_half_splits.py OUT.json [--splits 8,16,32,64]
        [--lens 4096,8000] [--batches 1,8] [--repeats 50] [--warmup 10]

A KV-shared layer of the fast prefill's back half attends from each finishing request's
last token over its whole cached sequence: one decode row per request, through stock
triton's decode kernel (`decode_attention_fwd`) on the back half's own backend. Its
grid is rows x KV-head groups x KV splits, and the backend caps the splits at
`--triton-attention-num-kv-splits` (8): a full layer of one row runs 2 x 8 programs on a
GPU of 132 SMs. Here the kernel alone, on the shapes of Gemma-4's back half (E4B: full
layers 8 query heads over 2 KV heads of 512, sliding layers 2 KV heads of 256 over 513
keys; E2B: full layers over 1 KV head of 512), at each split count (every row split
alike), timed with CUDA events (median of --repeats after --warmup; each eager call with
its launches, or with --graph a CUDA graph's replay, the GPU time alone). Floor: the K and V
it must read at the GPU's HBM bandwidth (3.35 TB/s on H100, 4.8 on H200). Outputs are
compared with the 8-split result (max abs difference: the split reduction's rounding).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "frozen_kv_mtp"))

SHAPES = {  # name: (query heads, KV heads, head dim, window or None)
    "e4b-full": (8, 2, 512, None),
    "e4b-sliding": (8, 2, 256, 512),
    "e2b-full": (8, 1, 512, None),
}


def run_point(shape, seq, batch, splits, repeats, warmup, graph=False):
    import torch
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    from verify_kernel_bench import time_fn

    qh, kvh, d, window = SHAPES[shape]
    keys = seq if window is None else min(seq, window + 1)
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    k = torch.randn(batch * seq, kvh, d, device=dev, dtype=torch.bfloat16, generator=g)
    v = torch.randn(batch * seq, kvh, d, device=dev, dtype=torch.bfloat16, generator=g)
    q = torch.randn(batch, qh, d, device=dev, dtype=torch.bfloat16, generator=g)
    # each row attends the last `keys` of its own sequence
    idx = torch.cat([torch.arange(b * seq + seq - keys, (b + 1) * seq, device=dev) for b in range(batch)])
    indptr = torch.arange(0, (batch + 1) * keys, keys, device=dev, dtype=torch.int32)
    out = {}
    for s in splits:
        o = torch.empty(batch, qh, d, device=dev, dtype=torch.bfloat16)
        logits = torch.empty(batch, qh, s, d, device=dev, dtype=torch.float32)
        lse = torch.empty(batch, qh, s, device=dev, dtype=torch.float32)
        nsplit = torch.full((batch,), s, device=dev, dtype=torch.int32)

        def call():
            decode_attention_fwd(q, k, v, o, indptr, idx, logits, lse, nsplit, s, d ** -0.5, 1.0, 1.0)

        for _ in range(warmup):
            call()
        torch.cuda.synchronize()
        out[s] = (time_fn(call, repeats, graph), o.float().clone())
    ref = out[splits[0]][1]
    bytes_read = batch * keys * kvh * d * 2 * 2
    return keys, bytes_read, [
        {"splits": s, "median_ms": m, "max_abs_diff_vs_first": float((o - ref).abs().max())}
        for s, (m, o) in out.items()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("out")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--splits", default="8,16,32,64")
    ap.add_argument("--lens", default="4096,8000")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--graph", action="store_true",
                    help="time replays of a CUDA graph of the call (GPU time, no launch cost)")
    a = ap.parse_args()
    import torch

    name = torch.cuda.get_device_name()
    bw = 4.8e12 if "H200" in name else 3.35e12
    splits = [int(x) for x in a.splits.split(",")]
    rows = []
    for shape in a.shapes.split(","):
        for seq in (int(x) for x in a.lens.split(",")):
            for batch in (int(x) for x in a.batches.split(",")):
                keys, nbytes, res = run_point(shape, seq, batch, splits, a.repeats, a.warmup, a.graph)
                floor_ms = nbytes / bw * 1e3
                for r in res:
                    r.update(shape=shape, seq=seq, batch=batch, keys=keys, floor_ms=floor_ms)
                    print(f"RESULT {shape} seq={seq} rows={batch} splits={r['splits']}: "
                          f"{r['median_ms'] * 1e3:.1f} us (floor {floor_ms * 1e3:.1f} us, "
                          f"{r['median_ms'] / floor_ms:.1f}x) diff {r['max_abs_diff_vs_first']:.2e}",
                          flush=True)
                rows.extend(res)
    with open(a.out, "w") as f:
        json.dump({"device": name, "bandwidth": bw, "args": vars(a), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
