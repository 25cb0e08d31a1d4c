"""Under --enable-deterministic-inference, a sliding-window layer's prefill output is the
same, bit for bit, whether the prompt runs cold, in chunks or as a prefix-cache hit.

Every deterministic extend runs triton's unified 1-stage kernel, which sums a query's
keys in tiles of BLOCK_N from the start of the request's key list. For a
sliding-window layer stock 0.5.17 starts that list at the pass's window,
prefix_len - min(prefix_len, window): a cold pass, a later chunk and a cache hit cut
the same keys into different tiles and round differently. The step pads the list to
start on an absolute multiple of 128 keys (0.5.23 has upstream's padding of its own:
there this test checks upstream's).

The real backend metadata and kernel run on CPU through Triton's interpreter
(TRITON_INTERPRET=1, read when the kernels are defined, hence a fresh process: run
this file as a script). Buffers are fp32 so that a different rounding order shows;
a full-attention layer, whose list always starts at 0, is the control that the
passes compare exactly apart from the window's tiles.
"""

import types

import pytest
import torch

from triton_interpret import print_result, row_invariant_dot, run_as_script

pytestmark = pytest.mark.stack("generic-fixes", step="deterministic-sliding-window-tile-align")

PROMPTS = [300, 230, 90]  # tokens per request
WINDOW = 40  # backend.sliding_window_size (config sliding_window - 1)
# Passes over the prompts: cold; prefix-cache hits (request 2 cold beside them);
# chunks of 128 tokens.
PASSES = {  # {request: (cached prefix, new tokens)} a batch
    "cold": [{0: (0, 300), 1: (0, 230), 2: (0, 90)}],
    "cache_hit": [{0: (170, 130), 1: (101, 129), 2: (0, 90)}],
    "chunked": [
        {0: (0, 128), 1: (0, 128), 2: (0, 90)},
        {0: (128, 128), 1: (128, 102)},
        {0: (256, 44)},
    ],
}
HEADS, KV_HEADS, HEAD_DIM, POOL = 2, 1, 32, 2048


def _backend(g, k_buf, v_buf):
    from attention_stand_ins import HAS_KV_LOC_PLAN, attach_translator

    from sglang.kernels.ops.attention import extend_attention
    from sglang.srt.layers.attention import triton_backend

    pool = types.SimpleNamespace(
        get_key_buffer=lambda layer_id: k_buf, get_value_buffer=lambda layer_id: v_buf
    )
    bs = len(PROMPTS)
    be = object.__new__(triton_backend.TritonAttnBackend)
    be.sliding_window_size = WINDOW
    be.req_to_token = torch.zeros(bs + 1, max(PROMPTS), dtype=torch.int32)
    slots = torch.randperm(POOL, generator=g)[: sum(PROMPTS)].to(torch.int32)
    for i, s in enumerate(PROMPTS):
        be.req_to_token[i + 1, :s] = slots[sum(PROMPTS[:i]) : sum(PROMPTS[: i + 1])]
    be.token_to_kv_pool = pool
    be.use_sliding_window_kv_pool = False
    be.dcp_size, be.page_size, be.device = 1, 1, "cpu"
    be.chain_verify = None  # what a later step's __init__ sets (split-KV verify off)
    be._translate_kv_loc = None
    be.enable_deterministic = True
    be.extend_attention_fwd_unified = extend_attention.extend_attention_fwd_unified
    be.build_unified_kv_indices = extend_attention.build_unified_kv_indices
    for name in ("kv_indptr", "qo_indptr", "window_kv_indptr", "mask_indptr"):
        setattr(be, name, torch.zeros(bs + 1, dtype=torch.int32))
    if HAS_KV_LOC_PLAN:  # what 0.5.23's __init__ adds for the extend path
        be.max_context_len, be._dense_one_shot_kv_indptr = max(PROMPTS), None
        be.align_window_kv_to_tiles = extend_attention.align_window_kv_to_tiles
        attach_translator(be)
    return be


def _batch(be, reqs, chunk):
    """A real ForwardBatch of requests ``reqs`` (indices into PROMPTS), each with
    ``chunk[i] = (prefix, new tokens)``."""
    from attention_stand_ins import bind_plan

    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardBatch,
        ForwardMode,
    )

    pre = [p for p, _ in chunk]
    ext = [e for _, e in chunk]
    seq = [p + e for p, e in chunk]
    n = sum(ext)
    fb = ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=len(reqs),
        input_ids=torch.zeros(n, dtype=torch.int64),
        req_pool_indices=torch.tensor(reqs) + 1,
        seq_lens=torch.tensor(seq),
        out_cache_loc=torch.cat(
            [be.req_to_token[r + 1, p:s].long() for r, p, s in zip(reqs, pre, seq)]
        ),
        seq_lens_sum=sum(seq),
    )
    fb.seq_lens_cpu = torch.tensor(seq)
    fb.orig_seq_lens = torch.tensor([PROMPTS[r] for r in reqs])
    fb.extend_seq_lens_cpu, fb.extend_prefix_lens_cpu = ext, pre
    fb.extend_seq_lens = torch.tensor(ext, dtype=torch.int32)
    fb.extend_prefix_lens = torch.tensor(pre, dtype=torch.int32)
    fb.extend_start_loc = torch.cumsum(torch.tensor([0] + ext[:-1]), 0).to(torch.int32)
    fb.extend_num_tokens = n
    fb.positions = torch.cat([torch.arange(p, s) for p, s in zip(pre, seq)])
    fb.capture_hidden_mode = CaptureHiddenMode.NULL
    return bind_plan(be, fb)


def _check():
    from sglang.srt.layers.radix_attention import AttentionType

    row_invariant_dot()
    g = torch.Generator().manual_seed(0)
    k_buf = torch.randn(POOL, KV_HEADS, HEAD_DIM, generator=g)
    v_buf = torch.randn(POOL, KV_HEADS, HEAD_DIM, generator=g)
    # One query per request and position, whichever pass computes it.
    q = [torch.randn(s, HEADS * HEAD_DIM, generator=g) for s in PROMPTS]
    be = _backend(g, k_buf, v_buf)

    def run(passes, window):
        """Each request's output rows, by position, over the passes."""
        layer = types.SimpleNamespace(
            sliding_window_size=window, layer_id=0, tp_q_head_num=HEADS,
            qk_head_dim=HEAD_DIM, v_head_dim=HEAD_DIM, k_scale=None, v_scale=None,
            scaling=HEAD_DIM**-0.5, xai_temperature_len=-1,
            attn_type=AttentionType.DECODER, logit_cap=0.0,
        )
        rows = {r: [None] * s for r, s in enumerate(PROMPTS)}
        for batch in passes:
            reqs, chunk = list(batch), list(batch.values())
            fb = _batch(be, reqs, chunk)
            be.init_forward_metadata(fb)
            qs = torch.cat([q[r][p : p + e] for r, (p, e) in batch.items()])
            o = torch.empty(len(qs), HEADS * HEAD_DIM)
            out = be._forward_extend_unified(qs, o, layer, fb, True, 0.0, None)
            at = 0
            for r, (p, e) in batch.items():
                rows[r][p : p + e] = list(out[at : at + e])
                at += e
        return rows

    result = {}
    for window, name in ((WINDOW, "sliding"), (-1, "full")):
        runs = {k: run(v, window) for k, v in PASSES.items()}
        cold = runs.pop("cold")
        for kind, rows in runs.items():
            # Per request: how many of its rows differ from the cold pass's.
            result[f"{name}_{kind}"] = [
                sum(a is not None and not torch.equal(a, b) for a, b in zip(rows[r], cold[r]))
                for r in range(len(PROMPTS))
            ]
    return result


@pytest.mark.stack("generic-fixes", step="deterministic-sliding-window-tile-align",
                   fails_before=True)
def test_cached_and_chunked_prompt_attends_as_cold_bit_for_bit():
    out = run_as_script(__file__)
    none = [0] * len(PROMPTS)
    # The control: full attention's key list starts at position 0 in every pass.
    assert out["full_cache_hit"] == none and out["full_chunked"] == none
    # Stock 0.5.17: rows of requests 0 and 1 differ (passes that start their window
    # past position 0, off a tile boundary: 130 and 61 of the hits, 88 of the
    # chunks); request 2 always runs in one cold pass.
    assert out["sliding_cache_hit"] == none, out["sliding_cache_hit"]
    assert out["sliding_chunked"] == none, out["sliding_chunked"]


@pytest.mark.stack("generic-fixes", step="deterministic-sliding-window-tile-align",
                   bases=("0.5.17",))
def test_window_lists_padded_to_absolute_tiles():
    """The padded lists: each starts on a multiple of 128, led by copies of its
    first key, then the window's keys unchanged; computed once per pass."""
    from sglang.srt.layers.attention import deterministic_window_tiles as tiles

    lens, starts = [0, 5, 40, 40], [0, 0, 130, 300]
    indptr = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    indices = torch.arange(1000, 1000 + sum(lens))
    start = torch.tensor(starts, dtype=torch.int32)
    meta = types.SimpleNamespace()
    new_indptr, new_indices, new_start = tiles.align_window_to_tiles(
        meta, indptr, indices, start, len(lens)
    )
    assert new_start.tolist() == [0, 0, 128, 256]
    assert new_start.dtype == start.dtype and new_indptr.dtype == indptr.dtype
    pads = [0, 0, 2, 44]
    assert new_indptr.tolist() == [0] + torch.tensor(
        [n + p for n, p in zip(lens, pads)]).cumsum(0).tolist()
    for i, (n, p) in enumerate(zip(lens, pads)):
        got = new_indices[new_indptr[i] : new_indptr[i + 1]].tolist()
        keys = indices[indptr[i] : indptr[i + 1]].tolist()
        assert got == keys[:1] * p + keys
    # The other sliding layers of the pass reuse the lists.
    again = tiles.align_window_to_tiles(meta, indptr, indices, start, len(lens))
    assert again[1] is new_indices
    # No window key before any extend: nothing to pad.
    empty = torch.zeros(0, dtype=torch.int64)
    zero = torch.zeros(3, dtype=torch.int32)
    out = tiles.align_window_to_tiles(None, torch.zeros(4, dtype=torch.int32), empty, zero, 3)
    assert out[1] is empty


if __name__ == "__main__":
    print_result(_check)
