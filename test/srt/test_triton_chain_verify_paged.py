"""The chain verify with a paged KV cache (page size 1, 16, 64; bf16, grouped by default,
and fp8_e4m3, one decode row per draft token) attends like stock triton's extend-kernel
verify. Real pools and kernels under Triton's interpreter; req_to_token from random page
tables; windows and one request's draft tokens cross page boundaries. 0.5.23 has no
page-major pool: its cases are the NHD ones.
"""

import os
import types

import pytest

from release import RELEASE
from test_triton_chain_verify import (  # and the same heads, draft tokens (N), window
    HEAD_DIM, HEADS, KV_HEADS, N, WINDOW, attention_layer, chain_backend,
    verify_batch,
)
from triton_interpret import exact_bf16_dot, print_result, run_as_script

pytestmark = pytest.mark.stack("frozen-kv-mtp-speed")

PAGE_ENV = "CHAIN_VERIFY_TEST_PAGE_SIZE"
PREFIX = [5, 62, 90]  # cached tokens per request: below the window; drafts crossing a 64-page
MAX_CTX = 100  # the first draft token sees WINDOW + 1 keys
POOL_TOKENS = 2048

# Tolerances (outputs O(1); measured over page sizes 1/16/64):
# * bf16 KV: kernels round probabilities and output to bf16. Chain against stock: max
#   |diff| <= 7.8e-3 (one output ulp); 3e-2 allows a few. One key too few moves the
#   output by 0.38, a page read from the wrong place by 0.46-1.9.
# * fp8_e4m3 KV: stock's extend kernel takes the draft tokens' K/V from its bf16 inputs,
#   the decode rows read them back from the fp8 cache: max |diff| up to 0.27, about
#   stock's own distance to fp32 attention (0.18-0.31). So: relative RMS (measured
#   0.05-0.074, bound 0.12; a wrong page 0.21-0.61) and a loose max bound (0.5).
TOL = {"bfloat16": 3e-2, "float8_e4m3fn": 0.5}
FP8_REL_RMS = 0.12
CASES = (("nhd", "bfloat16"), ("nhd", "float8_e4m3fn")) + (() if RELEASE >= (0, 5, 23) else (("page_major", "bfloat16"),))


def _page_tables(g, ps, lens, num_pages):
    """req_to_token rows from random page tables (page 0 holds the padding slot), and
    the same rows with each request's page table rotated by one page (a position read
    from the wrong page; at page size 1, the neighbouring position's slot)."""
    import torch

    need = [-(-n // ps) for n in lens]
    pages = (torch.randperm(num_pages - 1, generator=g) + 1)[: sum(need)]
    rows = torch.zeros(len(lens) + 1, MAX_CTX + N + 4, dtype=torch.int32)  # as ReqToTokenPool
    wrong = rows.clone()
    at = 0
    for i, (n, k) in enumerate(zip(lens, need)):
        table = pages[at : at + k]
        at += k
        pos = torch.arange(n)
        rows[i + 1, :n] = (table[pos // ps] * ps + pos % ps).to(torch.int32)
        wrong[i + 1, :n] = (table.roll(1)[pos // ps] * ps + pos % ps).to(torch.int32)
    return rows, wrong


def _pool(layout, dtype, ps):
    import torch

    from sglang.srt.mem_cache import memory_pool

    cls = memory_pool.PageMajorMHATokenToKVPool if layout == "page_major" else memory_pool.MHATokenToKVPool
    # two layers, so that a page-major page interleaves layers (layer 1 is used)
    pool = cls(size=POOL_TOKENS - ps, page_size=ps, dtype=getattr(torch, dtype), head_num=KV_HEADS,
               head_dim=HEAD_DIM, layer_num=2, device="cpu", enable_memory_saver=False,
               enable_alt_stream=False)
    if layout == "page_major":
        # Its store is a CUDA-only Triton kernel; the same write through the 4-D views.
        def store(layer_idx, loc, cache_k, cache_v):
            pool.k_buffer[layer_idx][loc // ps, loc % ps] = cache_k.view(-1, KV_HEADS, HEAD_DIM)
            pool.v_buffer[layer_idx][loc // ps, loc % ps] = cache_v.view(-1, KV_HEADS, HEAD_DIM)

        pool._store_kv_layer = store
    g = torch.Generator().manual_seed(1)
    for buf in pool.k_buffer + pool.v_buffer:  # every slot a random key / value
        buf.view(pool.dtype).copy_(torch.randn(buf.shape, generator=g).to(pool.dtype))
    return pool


def _case(layout, dtype, ps, g):
    import torch

    from sglang.srt.layers.attention.triton_backend import update_sliding_window_buffer
    from sglang.srt.layers.attention.triton_chain_verify import ChainVerify

    bs, lens = len(PREFIX), [p + N for p in PREFIX]
    pool = _pool(layout, dtype, ps)
    req_to_token, wrong_pages = _page_tables(g, ps, lens, POOL_TOKENS // ps)
    be = chain_backend(pool, ps, req_to_token, bs, MAX_CTX)
    fb, plan = verify_batch(be, PREFIX)
    spec = fb.spec_info
    q = torch.randn(bs * N, HEADS * HEAD_DIM, generator=g).to(torch.bfloat16)
    k_new = torch.randn(bs * N, KV_HEADS, HEAD_DIM, generator=g).to(torch.bfloat16)
    v_new = torch.randn(bs * N, KV_HEADS, HEAD_DIM, generator=g).to(torch.bfloat16)

    def attend(window):  # saves the draft tokens' K/V, then attends
        return be.forward_extend(q, k_new, v_new, attention_layer(window, 1), fb).float()

    kinds = ((WINDOW, "sliding"), (-1, "full"))
    out = {}
    be.init_forward_metadata(fb)
    stock = {w: attend(w) for w, _ in kinds}
    for w, name in kinds:  # stock itself, against torch over the cache it saved into
        out[f"stock_vs_torch_{name}"] = (stock[w] - _torch_reference(pool, ps, be.req_to_token, q, w)).abs().max().item()

    out["window_bites"] = (stock[WINDOW] - stock[-1]).abs().max().item()
    # Control: the same attention over the rotated page tables is far from stock's.
    wrong = _torch_reference(pool, ps, wrong_pages, q, -1)
    out["wrong_pages_diff"] = (stock[-1] - wrong).abs().max().item()
    out["wrong_pages_rel_rms"] = _rel_rms(wrong, stock[-1])
    be.chain_verify = ChainVerify(be, update_sliding_window_buffer)
    out["grouped"] = be.chain_verify.grouped  # what the backend picks for this KV dtype
    # The verify that runs, eager and as a CUDA graph; on bf16 the per-draft-token rows
    # too (SGLANG_CHAIN_VERIFY_GROUPED=0). On a page-major pool only the grouped kernel
    # reads the 4-D views itself (the decode rows are stock's decode kernel).
    paths = [be.chain_verify.grouped] + ([False] if be.chain_verify.grouped and layout == "nhd" else [])
    for grouped in paths:
        tag = "grouped" if grouped else "per_row"
        be.chain_verify = ChainVerify(be, update_sliding_window_buffer)
        be.chain_verify.grouped = grouped
        be.init_forward_metadata(fb)
        eager = {w: attend(w) for w, _ in kinds}
        for w, name in kinds:
            out[f"{tag}_{name}_max_diff"] = (eager[w] - stock[w]).abs().max().item()
            out[f"{tag}_{name}_rel_rms"] = _rel_rms(eager[w], stock[w])
            ref = _torch_reference(pool, ps, be.req_to_token, q, w)
            out[f"{tag}_{name}_vs_torch"] = (eager[w] - ref).abs().max().item()
        if grouped == paths[0] and layout == "nhd":
            # CUDA-graph path of the verify that runs: buffers refilled as before a replay
            be.chain_verify.init_cuda_graph_state(bs * N)
            be._apply_cuda_graph_metadata(*plan, bs, fb.req_pool_indices, fb.seq_lens, fb.forward_mode, spec)
            be.forward_metadata = be._build_cuda_graph_forward_metadata(bs, fb.forward_mode, spec)
            for w, name in kinds:
                out[f"{tag}_{name}_graph_equals_eager"] = torch.equal(attend(w), eager[w])
    if dtype == "bfloat16" and layout == "nhd" and ps == 16:
        # Control: a window one key narrower is far beyond the bf16 tolerance.
        be.sliding_window_size = WINDOW - 1
        be.chain_verify = ChainVerify(be, update_sliding_window_buffer)
        be.init_forward_metadata(fb)
        out["narrower_window_diff"] = (attend(WINDOW - 1) - stock[WINDOW]).abs().max().item()
        be.sliding_window_size = WINDOW
    if dtype != "bfloat16":
        # Scale of fp8 rounding itself: stock over this cache against stock over the
        # same values in bf16 (the cache dequantized, the draft K/V rounded through it).
        k_b = [pool.get_key_buffer(i).to(torch.bfloat16) for i in range(2)]
        v_b = [pool.get_value_buffer(i).to(torch.bfloat16) for i in range(2)]
        be.token_to_kv_pool = types.SimpleNamespace(
            get_key_buffer=lambda i: k_b[i], get_value_buffer=lambda i: v_b[i],
            set_kv_buffer=lambda *a, **k: None, dtype=torch.bfloat16)
        be.chain_verify = None
        be.init_forward_metadata(fb)
        for w, name in kinds:
            ref = be.forward_extend(q, k_new, v_new, attention_layer(w, 1), fb, save_kv_cache=False).float()
            out[f"stock_fp8_vs_bf16_{name}"] = (ref - stock[w]).abs().max().item()
    return out


def _rel_rms(a, b):
    return ((a - b).norm() / b.norm()).item()


def _torch_reference(pool, ps, req_to_token, q, window):
    """fp32 attention of each draft row over its keys, read from the cache (layer 1).
    Over an fp8 cache q is rounded to e4m3 first, as the decode kernel casts it to the
    cache's dtype before its dot (k_descale 1)."""
    import torch

    if pool.dtype == torch.float8_e4m3fn:
        q = q.to(pool.dtype)

    def rows(buf, slots):
        return (buf[slots // ps, slots % ps] if buf.ndim == 4 else buf[slots]).float()

    k_buf, v_buf = pool.get_key_buffer(1), pool.get_value_buffer(1)
    q = q.float().view(-1, HEADS, HEAD_DIM)
    out = torch.zeros(q.shape[0], HEADS * HEAD_DIM)
    for b, p in enumerate(PREFIX):
        for t in range(N):
            pos = p + t
            slots = req_to_token[b + 1, max(0, pos - window) if window > 0 else 0 : pos + 1].long()
            k, v = rows(k_buf, slots), rows(v_buf, slots)
            for h in range(HEADS):
                prob = torch.softmax((k[:, h // (HEADS // KV_HEADS)] @ q[b * N + t, h]) * HEAD_DIM**-0.5, 0)
                out[b * N + t, h * HEAD_DIM : (h + 1) * HEAD_DIM] = prob @ v[:, h // (HEADS // KV_HEADS)]
    return out


def _check():
    import torch

    exact_bf16_dot()

    ps = int(os.environ[PAGE_ENV])
    g = torch.Generator().manual_seed(ps)
    return {
        f"{layout}/{dtype}": _case(layout, dtype, ps, g)
        for layout, dtype in CASES
    }


@pytest.mark.parametrize("page_size", [1, 16, 64])
def test_paged_chain_verify_attends_like_the_extend_kernel(page_size, monkeypatch):
    monkeypatch.setenv(PAGE_ENV, str(page_size))
    res = run_as_script(__file__)
    assert set(res) == {f"{layout}/{dtype}" for layout, dtype in CASES}, res
    for case, out in res.items():
        fp8 = case.endswith("float8_e4m3fn")
        tol = TOL[case.split("/")[1]]
        # bf16 groups by default; an fp8 KV cache keeps one decode row per draft token
        assert out["grouped"] == (not fp8), (case, out)
        paths = [k[: -len("_sliding_max_diff")] for k in out if k.endswith("_sliding_max_diff")]
        assert paths == (["per_row"] if fp8 else ["grouped"] if case.startswith("page") else ["grouped", "per_row"])
        for tag in paths:
            for name in ("sliding", "full"):
                assert out[f"{tag}_{name}_max_diff"] < tol, (case, tag, name, out)
                if fp8:
                    assert out[f"{tag}_{name}_rel_rms"] < FP8_REL_RMS, (case, tag, name, out)
                else:  # and against fp32 attention in torch over the same cache
                    assert out[f"{tag}_{name}_vs_torch"] < tol, (case, tag, name, out)
        # the controls: windows do cut keys; a wrong page is far beyond the tolerance
        assert out["window_bites"] > 3 * TOL["bfloat16"], (case, out)
        if fp8:
            assert out["wrong_pages_rel_rms"] > 1.5 * FP8_REL_RMS, (case, out)
        else:
            assert out["wrong_pages_diff"] > 3 * tol, (case, out)
        if case.startswith("nhd/"):  # the CUDA-graph metadata of the verify that runs
            first = paths[0]
            assert all(out[f"{first}_{name}_graph_equals_eager"] for name in ("sliding", "full")), (case, out)
    if page_size == 16:
        assert res["nhd/bfloat16"]["narrower_window_diff"] > 3 * TOL["bfloat16"], res["nhd/bfloat16"]


if __name__ == "__main__":
    print_result(_check)
