"""The chain verify: a top-1 draft chain verified as decode queries attends over the same
keys as stock triton's extend-kernel verify (real kernels under Triton's interpreter, fp32;
requests below, at and above the sliding window). The split-KV sum rounds differently, so
the check is allclose; an off-by-one in the keys moves the output far more (the control).
"""

import types

import pytest

from release import RELEASE
from triton_interpret import print_result, run_as_script

pytestmark = pytest.mark.stack("frozen-kv-mtp-speed", step="chain-verify-kv-shared-no-gather")

PREFIX = [3, 38, 40, 41, 90]  # cached tokens per request; WINDOW sits among them
N = 4  # draft tokens verified per request (steps 3, topk 1)
WINDOW = 40  # backend.sliding_window_size
HEADS, KV_HEADS, HEAD_DIM, POOL, MAX_CTX = 4, 2, 32, 1024, 128
# The decode kernels' grid has a program per (row, head, split) up to this many splits;
# under the interpreter each one costs alike, empty or not. 4 still splits the longest
# requests' keys (asserted below).
SPLITS = 4


def release_fields(be, pool, n):
    """What the release's __init__ also sets and the verify paths read (n draft tokens a
    request)."""
    if RELEASE >= (0, 5, 23):
        from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator

        be.__dict__.update(
            target_verify_num_tokens_per_req=n, dllm_attention=None, use_dense_fp8_chunked_prefill=False,
            use_verify_shared_kv=False, _dense_one_shot_kv_indptr=None,
            # Lean decode on auto, and its gate saying yes: the chain's rows carry no Lean
            # buffers, so they must keep the standard kernel.
            enable_lean_attention=None, _lean_decode_seqlen_gate=lambda *a: True,
            _lean_capture_policy=lambda *a: True,
        )
        be.kv_index_translator = KVIndexTranslator(
            req_to_token=be.req_to_token, token_to_kv_pool_allocator=None, token_to_kv_pool=pool,
            page_size=be.page_size, device="cpu",
        )


def chain_backend(pool, page_size, req_to_token, bs, max_ctx):
    """A triton backend with what the verify paths read, as __init__ and
    init_cuda_graph_state set them, for bs requests of N draft tokens."""
    import torch

    from sglang.kernels.ops.attention.decode_attention import decode_attention_fwd
    from sglang.kernels.ops.attention.extend_attention import extend_attention_fwd
    from sglang.srt.layers.attention import triton_backend

    be = object.__new__(triton_backend.TritonAttnBackend)
    be.__dict__.update(
        sliding_window_size=WINDOW, token_to_kv_pool=pool, use_sliding_window_kv_pool=False,
        dcp_size=1, page_size=page_size, device="cpu", _translate_kv_loc=None, enable_deterministic=False,
        use_mla=False, skip_prefill=False, is_draft_runner=False, topk=1, num_draft_tokens=N, num_head=HEADS,
        max_kv_splits=SPLITS, num_kv_head=KV_HEADS, v_head_dim=HEAD_DIM, swa_v_head_dim=None,
        static_kv_splits=False, device_core_count=132, split_tile_size=None, use_pdl=False,
        max_context_len=max_ctx, use_verify_splitkv=False, extend_attention_fwd=extend_attention_fwd,
        decode_attention_fwd=decode_attention_fwd, chain_verify=None, req_to_token=req_to_token,
    )
    for name, dtype in (("kv_indptr", torch.int32), ("window_kv_indptr", torch.int32),
                        ("qo_indptr", torch.int64), ("mask_indptr", torch.int64)):
        setattr(be, name, torch.zeros(bs + 1, dtype=dtype))
    m = bs * N  # CUDA-graph buffers, as init_cuda_graph_state sizes them
    be.cuda_graph_kv_indices = torch.zeros(m * max_ctx, dtype=torch.int64)
    be.cuda_graph_num_kv_splits = torch.zeros(m, dtype=torch.int32)
    be.cuda_graph_window_num_kv_splits = torch.zeros(m, dtype=torch.int32)
    be.cuda_graph_attn_logits = torch.zeros(m, HEADS, SPLITS, HEAD_DIM)
    be.cuda_graph_attn_lse = torch.zeros(m, HEADS, SPLITS)
    be.cuda_graph_swa_attn_logits = None
    release_fields(be, pool, N)
    return be


def verify_batch(be, prefix):
    """The verify batch as prepare_for_v2_verify leaves it: draft slots already in
    req_to_token, seq_lens = cached prefix, a chain tree mask per request; and the
    release's KV plan arguments of the graph metadata."""
    import torch

    from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

    bs = len(prefix)
    tri = torch.tril(torch.ones(N, N, dtype=torch.bool))
    mask = torch.cat([torch.cat([torch.ones(N, p, dtype=torch.bool), tri], 1).reshape(-1) for p in prefix])
    spec = types.SimpleNamespace(custom_mask=mask, draft_token_num=N, num_tokens_per_req=N)
    fb = ForwardBatch(
        forward_mode=ForwardMode.TARGET_VERIFY, batch_size=bs, input_ids=torch.zeros(bs * N, dtype=torch.int64),
        req_pool_indices=torch.arange(1, bs + 1), seq_lens=torch.tensor(prefix),
        out_cache_loc=torch.cat([be.req_to_token[i + 1, p : p + N].long() for i, p in enumerate(prefix)]),
        seq_lens_sum=sum(prefix), spec_info=spec,
    )
    if RELEASE >= (0, 5, 23):
        be.kv_index_translator.bind_own_plan(fb)
        return fb, (fb.kv_loc_plan,)
    else:
        return fb, ()


def attention_layer(window, layer_id):
    from sglang.srt.layers.radix_attention import AttentionType

    return types.SimpleNamespace(
        sliding_window_size=window, layer_id=layer_id, tp_q_head_num=HEADS, qk_head_dim=HEAD_DIM,
        v_head_dim=HEAD_DIM, k_scale=None, v_scale=None, scaling=HEAD_DIM**-0.5,
        xai_temperature_len=-1, logit_capping_method="tanh", logit_cap=0.0,
        is_cross_attention=False, attn_type=AttentionType.DECODER,
    )


def _check():
    import torch

    from sglang.srt.layers.attention.triton_backend import update_sliding_window_buffer
    from sglang.srt.layers.attention.triton_chain_verify import ChainVerify

    g = torch.Generator().manual_seed(0)
    k_buf = torch.randn(POOL, KV_HEADS, HEAD_DIM, generator=g)
    v_buf = torch.randn(POOL, KV_HEADS, HEAD_DIM, generator=g)

    def set_kv_buffer(layer, loc, k, v, *args, **kwargs):
        k_buf[loc.loc] = k.view(-1, KV_HEADS, HEAD_DIM)
        v_buf[loc.loc] = v.view(-1, KV_HEADS, HEAD_DIM)

    pool = types.SimpleNamespace(
        get_key_buffer=lambda i: k_buf, get_value_buffer=lambda i: v_buf, set_kv_buffer=set_kv_buffer
    )
    bs = len(PREFIX)
    req_to_token = torch.zeros(bs + 1, MAX_CTX + N + 4, dtype=torch.int32)  # as ReqToTokenPool
    slots = torch.randperm(POOL, generator=g)[: sum(PREFIX) + bs * N].to(torch.int32)
    lens = [p + N for p in PREFIX]
    for i, n in enumerate(lens):
        req_to_token[i + 1, :n] = slots[sum(lens[:i]) : sum(lens[: i + 1])]
    be = chain_backend(pool, 1, req_to_token, bs, MAX_CTX)
    fb, plan = verify_batch(be, PREFIX)
    spec = fb.spec_info
    q = torch.randn(bs * N, HEADS * HEAD_DIM, generator=g)
    k_new = torch.randn(bs * N, KV_HEADS, HEAD_DIM, generator=g)
    v_new = torch.randn(bs * N, KV_HEADS, HEAD_DIM, generator=g)

    def attend(window):
        return be.forward_extend(q, k_new, v_new, attention_layer(window, 0), fb).clone()

    out = {}
    be.init_forward_metadata(fb)
    stock = {w: attend(w) for w in (WINDOW, -1)}
    be.chain_verify = ChainVerify(be, update_sliding_window_buffer)
    out["grouped_by_default"] = be.chain_verify.grouped
    be.chain_verify.grouped = False  # one decode row per draft token (SGLANG_CHAIN_VERIFY_GROUPED=0)
    be.init_forward_metadata(fb)
    out["eager_is_decode_shaped"] = be.forward_metadata.qo_indptr is None
    chain = {w: attend(w) for w in (WINDOW, -1)}
    # CUDA-graph path: the backend's static buffers, refilled as before a replay.
    m = bs * N
    be.chain_verify.init_cuda_graph_state(m)
    # rows reach seq_len + N keys: the index buffer grows to whole req_to_token rows
    out["graph_kv_indices_fit_rows"] = be.cuda_graph_kv_indices.numel() == m * (MAX_CTX + N + 4)

    def compare(eager, tag):
        """Refill the graph buffers as before a replay; eager vs stock, graph vs eager,
        and a KV-shared layer against the graph."""
        be._apply_cuda_graph_metadata(*plan, bs, fb.req_pool_indices, fb.seq_lens, fb.forward_mode, spec)
        be.forward_metadata = be._build_cuda_graph_forward_metadata(bs, fb.forward_mode, spec)
        graph = {w: attend(w) for w in (WINDOW, -1)}
        # A KV-shared layer (k = v = None: its keys are already cached, here by the
        # calls above) reads the same keys. The stand-in pool has no get_kv_buffer,
        # so the stock K/V gather, unused under chain verify, would raise (step chain-verify-kv-shared-no-gather).
        shared = {}
        for w in (WINDOW, -1):
            try:
                shared[w] = be.forward_extend(q, None, None, attention_layer(w, 0), fb).clone()
            except AttributeError as e:
                shared[w] = repr(e)
        for w, name in ((WINDOW, "sliding"), (-1, "full")):
            out[name + tag + "_max_diff"] = (eager[w] - stock[w]).abs().max().item()
            out[name + tag + "_graph_equals_eager"] = torch.equal(graph[w], eager[w])
            out[name + tag + "_kv_shared_equals_chain"] = (
                torch.equal(shared[w], graph[w]) if torch.is_tensor(shared[w]) else shared[w]
            )

    compare(chain, "")
    out["splits"] = be.cuda_graph_num_kv_splits.tolist()
    # Grouped (the default): one key list a request, all draft
    # rows of a request per key tile; eager and CUDA-graph metadata.
    be.chain_verify = ChainVerify(be, update_sliding_window_buffer)
    be.init_forward_metadata(fb)
    out["grouped_lists_per_request"] = (be.forward_metadata.kv_indptr.shape[0] == bs + 1
                                        and be.forward_metadata.window_kv_indptr.shape[0] == bs + 1)
    grouped = {w: attend(w) for w in (WINDOW, -1)}
    # A layer the grouped kernel does not handle (xai temperature), eager: that layer
    # alone runs one decode row per draft token, and the grouped metadata stays.
    def attend_xai(window):
        layer = attention_layer(window, 0)
        layer.xai_temperature_len = 4
        return be.forward_extend(q, k_new, v_new, layer, fb).clone()

    grouped_md = be.forward_metadata
    fallback = {w: attend_xai(w) for w in (WINDOW, -1)}
    out["fallback_keeps_grouped_metadata"] = be.forward_metadata is grouped_md
    be.chain_verify.grouped = False
    be.init_forward_metadata(fb)
    per_row_xai = {w: attend_xai(w) for w in (WINDOW, -1)}
    out["fallback_equals_per_row"] = all(torch.equal(fallback[w], per_row_xai[w]) for w in (WINDOW, -1))
    out["xai_changes_output"] = (per_row_xai[-1] - chain[-1]).abs().max().item()
    be.chain_verify = ChainVerify(be, update_sliding_window_buffer)
    be.init_forward_metadata(fb)
    be.chain_verify.init_cuda_graph_state(m)
    compare(grouped, "_grouped")
    # Control: a window one key narrower (what triton's decode metadata keeps)
    # moves the output far beyond the tolerance.
    be.sliding_window_size = WINDOW - 1
    be.chain_verify = ChainVerify(be, update_sliding_window_buffer)
    be.init_forward_metadata(fb)
    out["narrower_window_diff"] = (attend(WINDOW - 1) - stock[WINDOW]).abs().max().item()
    return out


# Its KV-shared-layer check needs the next step too, so it runs after both.
@pytest.mark.stack("frozen-kv-mtp-speed", step="chain-verify-kv-shared-no-gather", fails_before=True)
def test_chain_verify_attends_like_the_extend_kernel():
    out = run_as_script(__file__)
    assert out["eager_is_decode_shaped"]
    assert out["grouped_by_default"]
    assert out["grouped_lists_per_request"]
    assert out["fallback_keeps_grouped_metadata"] and out["fallback_equals_per_row"]
    assert out["xai_changes_output"] > 1e-3, out["xai_changes_output"]
    # per-draft-token rows (""), and the grouped kernel (keys read once a request)
    for tag in ("", "_grouped"):
        for kind in ("full", "sliding"):
            assert out[f"{kind}{tag}_max_diff"] < 1e-5, out
            assert out[f"{kind}{tag}_graph_equals_eager"], out
            # a KV-shared layer: same output, and no K/V gather (step chain-verify-kv-shared-no-gather)
            assert out[f"{kind}{tag}_kv_shared_equals_chain"] is True, out
    assert out["graph_kv_indices_fit_rows"]
    assert max(out["splits"]) > 1  # the decode kernel did split the keys
    assert out["narrower_window_diff"] > 1e-3  # the tolerance sees one key too few



def test_eager_index_list_is_sized_from_the_host_sum():
    """The eager verify sizes its key lists without a device sync, from the batch's
    host length sum, exactly (grouped: one list a request; else one a draft token),
    or without a sum by a req_to_token row a list."""
    import torch

    from sglang.srt.layers.attention.triton_chain_verify import (
        chain_query_lens,
        eager_kv_indices_len,
    )

    seq_lens, rows, n = torch.tensor([3, 40, 90]), torch.tensor([1, 2, 3]), 4
    fb = types.SimpleNamespace(req_pool_indices=rows, seq_lens_sum=int(seq_lens.sum()))
    grouped = seq_lens + n
    _, per_row = chain_query_lens(seq_lens, rows, n)
    for lens in (grouped, per_row):
        assert eager_kv_indices_len(fb, lens, len(rows) * n, 128) == int(lens.sum())
    fb.seq_lens_sum = None
    for lens in (grouped, per_row):
        assert eager_kv_indices_len(fb, lens, len(rows) * n, 128) == lens.numel() * 128


if __name__ == "__main__":
    print_result(_check)
