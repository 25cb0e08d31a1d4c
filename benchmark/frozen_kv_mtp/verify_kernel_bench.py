"""Time the attention of one FROZEN_KV_MTP target-verify step, kernel by kernel.

    python benchmark/frozen_kv_mtp/verify_kernel_bench.py OUT.json [--shape e4b|31b]
        [--batches 1,8] [--contexts 220,2460] [--draft 4] [--no-graph]

Under FROZEN_KV_MTP (topk 1, N draft tokens) the target verifies N tokens per request as a
TARGET_VERIFY pass. Triton runs it through `extend_attention_fwd`, whose grid is
(request, head, query block) with no split over the keys: each program walks its whole
prefix. This times, per layer kind (sliding / full) and per (batch, context):
- `extend`: that call, as the backend makes it (custom mask, causal);
- `splitkv`: upstream's split-KV verify kernel (`verify_splitkv_fwd`; the backend runs it
  on gfx95 only and it declines sliding windows: here sliding layers hand it the window's
  keys already cut, so it times what a window-aware version would cost);
- `decode`: the split-KV decode kernel over B*N queries, query i of a request seeing
  prefix + draft tokens 0..i (what a verify could be if run as N decode queries);
- `grouped`: the fork's `chain_verify_grouped_fwd`
  (`layers/attention/triton_chain_verify_grouped.py`): the same B*N rows, but one program
  computes all N draft rows of a request against each key tile, so the keys are read once
  a request, not once a draft token.
  `--grouped-alt h1,s16` adds launch alternatives of it to tune small batches: `hK` takes
  at most K query heads a program (more programs, keys read more often), `sK` K splits.
Each is captured in a CUDA graph and replayed (no launch overhead), median of --iters.
`step_ms` sums a variant over the model's layers (sliding x n_sliding + full x n_full);
the max abs difference against `extend` checks that the variants compute the same thing.
One `RESULT {json}` line per point.
"""

import argparse
import json
import statistics

import torch

SHAPES = {  # q heads, sliding (kv heads, dim, layers, window), full (kv heads, dim, layers)
    "e4b": dict(h=8, swa=(2, 256, 35, 512), full=(2, 512, 7)),
    "31b": dict(h=32, swa=(16, 256, 50, 1024), full=(4, 512, 10)),
    "tiny": dict(h=4, swa=(2, 16, 2, 8), full=(1, 32, 1)),  # CPU check under TRITON_INTERPRET=1
}


def problem(B, L, N, h, hkv, d, window, dev, gen, dtype):
    """One verify problem: B requests with L cached keys each (or the last `window`) + N new."""
    P = min(L, window) if window else L
    slots = B * (L + N) + 8
    kbuf = torch.randn(slots, hkv, d, generator=gen).to(dev, dtype)
    vbuf = torch.randn(slots, hkv, d, generator=gen).to(dev, dtype)
    q = torch.randn(B * N, h, d, generator=gen).to(dev, dtype)
    base = torch.arange(B, device=dev) * (L + N)
    # prefix ids: the last P cached keys of each request (the window for sliding layers)
    prefix = (base[:, None] + (L - P) + torch.arange(P, device=dev)[None]).reshape(-1)
    new = (base[:, None] + L + torch.arange(N, device=dev)[None]).reshape(-1)
    k_new, v_new = kbuf[new].contiguous(), vbuf[new].contiguous()
    i32 = dict(dtype=torch.int32, device=dev)
    qo_indptr = torch.arange(B + 1, **i32) * N
    kv_indptr = torch.arange(B + 1, **i32) * P
    # topk 1: the tree is a chain, each draft token sees the prefix and the ones before it
    tri = torch.tril(torch.ones(N, N, dtype=torch.bool, device=dev))
    mask = torch.cat([torch.ones(N, P, dtype=torch.bool, device=dev), tri], 1).reshape(-1).repeat(B)
    mask_indptr = torch.arange(B + 1, **i32) * (N * (P + N))
    # decode form: B*N queries, query (b, i) sees prefix(b) + new(b)[:i+1]
    ids = [torch.cat([prefix[b * P:(b + 1) * P], new[b * N:b * N + i + 1]]) for b in range(B) for i in range(N)]
    dec_indptr = torch.zeros(B * N + 1, **i32)
    dec_indptr[1:] = torch.cumsum(torch.tensor([len(x) for x in ids], device=dev), 0)
    # grouped form: one list a request, prefix(b) + new(b); query i sees its first P + i + 1
    req_ids = torch.cat([torch.cat([prefix[b * P:(b + 1) * P], new[b * N:(b + 1) * N]]) for b in range(B)])
    return dict(q=q, k_new=k_new, v_new=v_new, kbuf=kbuf, vbuf=vbuf, qo_indptr=qo_indptr,
                kv_indptr=kv_indptr, kv_indices=prefix.to(torch.int64), mask=mask, mask_indptr=mask_indptr,
                dec_indptr=dec_indptr, dec_indices=torch.cat(ids).to(torch.int64), N=N, B=B, P=P,
                req_indptr=torch.arange(B + 1, **i32) * (P + N), req_indices=req_ids.to(torch.int64))


def variants(p, splits, grouped_alt=()):
    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    from sglang.kernels.ops.attention.verify_splitkv import verify_splitkv_fwd
    from sglang.srt.layers.attention.triton_chain_verify_grouped import chain_verify_grouped_fwd

    d, dv = p["q"].shape[-1], p["vbuf"].shape[-1]
    sm = d ** -0.5
    out = {k: torch.zeros(p["q"].shape[0], p["q"].shape[1], dv, dtype=p["q"].dtype, device=p["q"].device)
           for k in ("extend", "splitkv", "decode", "grouped") + tuple(f"grouped_{x}" for x in grouped_alt)}
    extend_args = (p["q"], p["k_new"], p["v_new"])
    common = (p["kbuf"], p["vbuf"], p["qo_indptr"], p["kv_indptr"], p["kv_indices"], p["mask"], True,
              p["mask_indptr"], p["N"], 1.0, 1.0, sm)
    def scratch(n_split):
        shape = (p["q"].shape[0], p["q"].shape[1], n_split)
        return (torch.empty(*shape, dv, dtype=torch.float32, device=p["q"].device),
                torch.empty(*shape, dtype=torch.float32, device=p["q"].device))

    logits, lse = scratch(splits)
    nsplit = torch.full((p["q"].shape[0],), splits, dtype=torch.int32, device=p["q"].device)
    req_nsplit = torch.full((p["B"],), splits, dtype=torch.int32, device=p["q"].device)

    def extend():
        extend_attention_fwd(*extend_args, out["extend"], *common)

    def splitkv():
        return verify_splitkv_fwd(*extend_args, out["splitkv"], *common, max_bs=p["B"])

    def decode():
        decode_attention_fwd(p["q"], p["kbuf"], p["vbuf"], out["decode"], p["dec_indptr"], p["dec_indices"],
                             logits, lse, nsplit, splits, sm, 1.0, 1.0)

    def grouped():
        # the bench's sliding problem already cuts the window (every row sees all P
        # prefix keys), so no window here
        chain_verify_grouped_fwd(p["q"], p["kbuf"], p["vbuf"], out["grouped"], p["req_indptr"],
                                 p["req_indices"], p["N"], 0, logits, lse, req_nsplit, splits, sm)

    def grouped_alt_fn(alt):
        import sglang.srt.layers.attention.triton_chain_verify_grouped as m

        heads = int(alt[1:]) if alt[0] == "h" else None
        n_split = int(alt[1:]) if alt[0] == "s" else splits
        alt_nsplit = torch.full((p["B"],), n_split, dtype=torch.int32, device=p["q"].device)
        alt_logits, alt_lse = scratch(n_split)

        def run():
            stock = m.launch_config

            def capped(N, G, block_d, block_dv):
                hpp, _, block_n, warps = stock(N, G, block_d, block_dv)
                hpp = min(hpp, heads) if heads else hpp
                return hpp, max(16, 1 << (N * hpp - 1).bit_length()), block_n, warps

            m.launch_config = capped
            try:
                m.chain_verify_grouped_fwd(p["q"], p["kbuf"], p["vbuf"], out[f"grouped_{alt}"], p["req_indptr"],
                                           p["req_indices"], p["N"], 0, alt_logits, alt_lse, alt_nsplit, n_split, sm)
            finally:
                m.launch_config = stock

        return run

    fns = {"extend": extend, "splitkv": splitkv, "decode": decode, "grouped": grouped}
    fns.update({f"grouped_{x}": grouped_alt_fn(x) for x in grouped_alt})
    return fns, out


def zero_stock_splitkv_partials():
    """Stock verify_splitkv writes no partial output for a split with no keys (only
    a -inf lse) and its combine weighs that partial by 0, so uninitialized scratch
    holding NaN makes the result NaN (0 * NaN). The tiny CPU check has such splits
    (a window of 8 keys, 32-key split blocks): zero the scratch so the check
    compares attention, not leftover memory. GPU timings are unaffected."""
    from sglang.kernels.ops.attention import verify_splitkv

    for vk in verify_splitkv._VK_CACHE.values():
        vk.att_out.zero_()


def time_fn(fn, iters, graph):
    fn()  # compile / allocate outside the graph
    torch.cuda.synchronize()
    if graph:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        run = g.replay
    else:
        run = fn
    for _ in range(3):
        run()
    ts = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        run()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--shape", default="e4b", choices=sorted(SHAPES))
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--contexts", default="220,2460")
    ap.add_argument("--draft", type=int, default=4, help="draft tokens verified per request")
    ap.add_argument("--splits", type=int, default=8, help="decode kv splits (server default 8)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--no-graph", action="store_true", help="time eager launches (also: CPU interpreter)")
    ap.add_argument("--grouped-alt", default="", help="e.g. h1,h2,s16: grouped-kernel launch alternatives")
    a = ap.parse_args()
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    s = SHAPES[a.shape]
    results = []
    for B in (int(x) for x in a.batches.split(",")):
        for L in (int(x) for x in a.contexts.split(",")):
            rec = {"shape": a.shape, "batch": B, "context": L, "draft": a.draft}
            for kind, (hkv, d, n, window) in (("sliding", s["swa"]), ("full", s["full"] + (0,))):
                gen = torch.Generator().manual_seed(B * 100003 + L)
                p = problem(B, L, a.draft, s["h"], hkv, d, window, dev, gen, getattr(torch, a.dtype))
                alt = tuple(x for x in a.grouped_alt.split(",") if x)
                fns, out = variants(p, a.splits, alt)
                for name, fn in fns.items():
                    if name == "splitkv" and not fn():
                        raise SystemExit("verify_splitkv_fwd declined the problem")
                    if dev == "cuda":
                        rec[f"{kind}_{name}_ms"] = time_fn(fn, a.iters, not a.no_graph)
                    else:
                        if name == "splitkv":
                            zero_stock_splitkv_partials()
                        fn()
                    if name != "extend":
                        rec[f"{kind}_{name}_maxdiff"] = (out[name].float() - out["extend"].float()).abs().max().item()
                rec[f"{kind}_layers"] = n
            for name in fns:
                if dev == "cuda":
                    rec[f"step_{name}_ms"] = (rec[f"sliding_{name}_ms"] * s["swa"][2]
                                              + rec[f"full_{name}_ms"] * s["full"][2])
            print("RESULT " + json.dumps(rec), flush=True)
            results.append(rec)
    with open(a.out, "w") as f:
        json.dump({"args": vars(a), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
