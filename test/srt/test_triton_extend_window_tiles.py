"""Step triton-extend-window-start-tile: triton's extend kernels start a sliding-window
layer's key loops at the first tile the window reaches, and their output is the
stock loops' (from key 0), bit for bit.

Stock 0.5.17's `_fwd_kernel` walks every key tile of the prefix and of the extend from
key 0 and `_fwd_kernel_unified` every key of its list; a tile outside the window is
skipped by SKIP_TILE (no K/V load, no dot), so poisoning those keys cannot show the
loop: its mask and its block-wide reduction still run once per tile. So the kernels
run under Triton's interpreter (a fresh process: this file runs itself as a script)
with `tl.multiple_of` (called once per loop iteration) recording the key tile each
program visits. 0.5.23 already starts the extend loop there and bounds the causal
unified loop (upstream); its prefix loop still starts at key 0.

The reference for the equality is the installed module with every sliding-window loop
from key 0 again (0.5.17's stock; on 0.5.23 also the two loops upstream bounds), built
from its own source; fp32, so a changed summation shows.
"""

import functools
import os
import sys
import zlib

import pytest

from triton_interpret import print_result, run_as_script

# The loops the step bounds, and stock's (from key 0): the GPU timing's rewrite.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmark", "yoco_gemma4"))
import window_tiles  # noqa: E402

pytestmark = pytest.mark.stack("generic-fixes", step="triton-extend-window-start-tile")

HEADS, KV_HEADS, HEAD_DIM, POOL = 1, 1, 16, 4096  # one head: the loops are per head
BATCH = [(0, 130), (70, 37), (200, 1), (5, 70)]  # (prefix keys, new tokens) a request
# Windows a tile size: where the window's first key falls in or at the edge of a tile.
WINDOWS = {(64, 64): (1, 63, 64, 65, 100), (32, 16): (2, 15, 17), (16, 32): (1, 31, 33)}


def _cases():
    """(name, kernel, (BLOCK_M, BLOCK_N), window, requests, options)."""
    cases = []
    for (bm, bn), windows in WINDOWS.items():  # CPU's default, then M > N, M < N
        for w in windows:
            for kernel in ("extend", "unified"):
                cases.append((f"{kernel}_{bm}x{bn}_w{w}", kernel, (bm, bn), w, BATCH, {}))
    long = [(1100, 100), (1030, 1)]  # past a 1024-key window
    mask_reqs = [(150, 5), (40, 7)]
    cases += [
        ("extend_64x64_w1024", "extend", (64, 64), 1024, long, {}),
        ("unified_64x64_w1024", "unified", (64, 64), 1024, long, {}),
        ("extend_noncausal", "extend", (32, 16), 40, BATCH, {"causal": False}),
        ("unified_noncausal", "unified", (32, 16), 40, BATCH, {"causal": False}),
        # Speculative verify on a window: a custom mask, window offsets into it.
        ("extend_custom_mask", "extend", (32, 16), 40, mask_reqs, {"mask": True}),
        ("extend_custom_mask_prefix", "extend", (32, 16), 40, mask_reqs,
         {"mask": True, "mask_prefix": True}),
        ("unified_custom_mask", "unified", (32, 16), 40, mask_reqs, {"mask": True}),
        # Decode context parallel: each half alone, with its LSE.
        ("extend_dcp_prefix_only", "extend", (32, 16), 40, BATCH, {"skip_extend": True}),
        ("extend_dcp_extend_only", "extend", (32, 16), 40, BATCH, {"skip_prefix": True}),
        # Deterministic mode: window lists padded to absolute 128-key tiles (02/0015).
        ("unified_deterministic_tiles", "unified", (64, 64), 40,
         [(128 + 40, 90), (3 + 40, 150), (0, 64)], {"window_start": [128, 256, 0]}),
    ]
    return cases


def _stock_module(ea):
    """The installed extend_attention with its sliding-window loops from key 0, and
    how often each bounded loop was found (none before the step)."""
    with open(ea.__file__) as f:
        src, found = window_tiles.stock_loops(f.read(), window_tiles.LOOPS)
    return window_tiles.module_from_source(src), found


VISITS = []


def _record_tiles():
    """tl.multiple_of(start_n, BLOCK_N), once a loop iteration, records (program, start_n)."""
    from triton.runtime import interpreter

    patch_core = interpreter._patch_lang_core

    def patched(lang, scope):
        patch_core(lang, scope)
        multiple_of = lang.multiple_of

        def record(x, values):
            n = x if isinstance(x, int) else int(x.handle.data.item())
            VISITS.append((tuple(interpreter.interpreter_builder.grid_idx), n))
            return multiple_of(x, values)

        scope.set_attr(lang, "multiple_of", record)

    interpreter._patch_lang_core = patched


def _expected_tiles(kernel, bm, bn, w, p, e, m, opt):
    """The key tiles block m of a request needs, in loop order: every tile from the
    first one holding a key in the window of one of the block's rows (q <= kv + w;
    the block's first row reaches lowest) to the loop's stock end; the unified
    kernel's causal loop ends at the block's last row's own key."""
    def reach(lo, end):  # tiles in [0, end) whose last key lo or past
        return [t for t in range(0, end, bn) if t + bn - 1 >= lo]

    if kernel == "extend":
        prefix = [] if opt.get("skip_prefix") else reach(p + m * bm - w, p)
        end = min(e, (m + 1) * bm) if opt.get("causal", True) else e
        return prefix + ([] if opt.get("skip_extend") else reach(m * bm - w, end))
    if opt.get("causal", True) and not opt.get("mask"):
        return reach(p + m * bm - w, p + min(e, (m + 1) * bm))
    return list(range(0, p + e, bn))


def _run(ea, kernel, blocks, w, reqs, opt, g):
    import torch

    bm, bn = blocks
    ea._get_block_sizes_for_extend_attention = lambda lq, lv: (HEAD_DIM, 0, HEAD_DIM, bm, bn, 4)
    bs = len(reqs)
    p = torch.tensor([r[0] for r in reqs])
    e = torch.tensor([r[1] for r in reqs])
    n, max_e = int(e.sum()), int(e.max())
    q = torch.randn(n, HEADS, HEAD_DIM, generator=g)
    k_ext = torch.randn(n, KV_HEADS, HEAD_DIM, generator=g)
    v_ext = torch.randn(n, KV_HEADS, HEAD_DIM, generator=g)
    k_buf = torch.randn(POOL, KV_HEADS, HEAD_DIM, generator=g)
    v_buf = torch.randn(POOL, KV_HEADS, HEAD_DIM, generator=g)
    qo_indptr = torch.zeros(bs + 1, dtype=torch.int32)
    qo_indptr[1:] = torch.cumsum(e, 0)
    o = torch.zeros(n, HEADS, HEAD_DIM)
    causal = opt.get("causal", True)
    if kernel == "extend":
        kv_indptr = torch.zeros(bs + 1, dtype=torch.int32)
        kv_indptr[1:] = torch.cumsum(p, 0)
        kv_indices = torch.randperm(POOL, generator=g)[: int(p.sum())]  # pool slots
        mask = mask_indptr = offsets = None
        if opt.get("mask"):
            offsets = torch.tensor([3, 0][:bs], dtype=torch.int32)
            sizes = [int(ei * (pi + ei + oi)) for pi, ei, oi in zip(p, e, offsets)]
            mask = torch.rand(sum(sizes), generator=g) < 0.7
            mask_indptr = torch.zeros(bs + 1, dtype=torch.int64)
            mask_indptr[1:] = torch.cumsum(torch.tensor(sizes), 0)
        lse = torch.zeros(n, HEADS) if (opt.get("skip_prefix") or opt.get("skip_extend")) else None
        ea.extend_attention_fwd(
            q, k_ext, v_ext, o, k_buf, v_buf, qo_indptr, kv_indptr, kv_indices,
            mask, causal, mask_indptr, max_e, 1.0, 1.0,
            skip_prefix_custom_mask=not opt.get("mask_prefix", False),
            sliding_window_size=w, window_kv_offsets=offsets, lse_extend=lse,
            skip_prefix=opt.get("skip_prefix", False),
            skip_extend=opt.get("skip_extend", False),
        )
        return o if lse is None else torch.cat([o.flatten(), lse.flatten()])
    kv_indptr = torch.zeros(bs + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(p + e, 0)
    kv_indices = torch.randperm(POOL, generator=g)[: int((p + e).sum())]
    mask = mask_indptr = None
    if opt.get("mask"):
        sizes = [int(ei * (pi + ei)) for pi, ei in zip(p, e)]
        mask = torch.rand(sum(sizes), generator=g) < 0.7
        mask_indptr = torch.zeros(bs + 1, dtype=torch.int64)
        mask_indptr[1:] = torch.cumsum(torch.tensor(sizes), 0)
    start = torch.tensor(opt.get("window_start", [0] * bs), dtype=torch.int32)
    ea.extend_attention_fwd_unified(
        q, o, k_buf, v_buf, 1.0, 1.0, qo_indptr, kv_indptr, kv_indices,
        p.to(torch.int32), max_e, custom_mask=mask, mask_indptr=mask_indptr,
        is_causal=causal, sliding_window_size=w, window_start_pos=start,
    )
    return o


def _check():
    import torch

    from sglang.kernels.ops.attention import extend_attention as ea

    _record_tiles()
    stock, found = _stock_module(ea)
    out = {"loops_found": found, "equal": {}, "wrong_tiles": {}, "tiles": {}}
    # Before the step there is no bounded loop to compare with: the tile record only.
    kernels = (("patched", ea), ("stock", stock)) if any(found.values()) else (("patched", ea),)
    for name, kernel, blocks, w, reqs, opt in _cases():
        runs, visits = {}, {}
        for which, mod in kernels:
            del VISITS[:]
            g = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            runs[which] = _run(mod, kernel, blocks, w, reqs, opt, g).view(torch.int32)
            visits[which] = list(VISITS)
        if "stock" in runs:
            out["equal"][name] = torch.equal(runs["patched"], runs["stock"])
            out["tiles"][name] = [len(visits["patched"]), len(visits["stock"])]
        got = {}
        for prog, n in visits["patched"]:
            got.setdefault(prog, []).append(n)
        bm, bn = blocks
        wrong = []
        for s, (p, e) in enumerate(reqs):
            for h in range(HEADS):
                for m in range(-(-e // bm)):
                    want = _expected_tiles(kernel, bm, bn, w, p, e, m, opt)
                    if got.get((s, h, m), []) != want:
                        wrong.append([s, h, m, got.get((s, h, m), []), want])
        out["wrong_tiles"][name] = wrong[:3] + ([len(wrong)] if wrong else [])
    return out


@functools.lru_cache(maxsize=1)
def _result():
    return run_as_script(__file__)


@pytest.mark.stack("generic-fixes", step="triton-extend-window-start-tile", fails_before=True)
def test_out_of_window_tiles_are_not_visited():
    out = _result()
    wrong = {k: v for k, v in out["wrong_tiles"].items() if v}
    # Stock 0.5.17: every program walks its prefix and extend from key 0; 0.5.23: the
    # prefix from key 0 (the extend and the causal unified loop are bounded upstream).
    assert not wrong, wrong
    tiles = out["tiles"]
    assert tiles, out["loops_found"]
    # The cases are long enough that every kind skips tiles stock visits.
    for name in ("extend_64x64_w1", "unified_64x64_w1", "extend_64x64_w1024",
                 "unified_64x64_w1024", "extend_dcp_prefix_only", "extend_dcp_extend_only"):
        assert tiles[name][0] < tiles[name][1], (name, tiles[name])


def test_window_start_tile_output_is_stock_bit_for_bit():
    out = _result()
    # Every loop the step bounds is found (and turned back into stock's for the reference).
    assert all(c == 1 for c in out["loops_found"].values()), out["loops_found"]
    assert len(out["equal"]) == 32
    unequal = [k for k, v in out["equal"].items() if not v]
    assert not unequal, unequal


if __name__ == "__main__":
    print_result(_check)
