"""Under --enable-deterministic-inference, the YOCO back half's attention is the
full pass's, bit for bit, on triton's real unified extend kernel.

The kernel runs on CPU through Triton's interpreter (TRITON_INTERPRET=1, read
when the kernels are defined, hence a fresh process: run this file as a script).
Buffers are fp32 so that a different rounding order shows in the output: the
control check proves the test can see one. On 0.5.17 the back half's window list
starts where the pass's did; on both bases triton pads every window list to
absolute 128-key tiles (0.5.17: step deterministic-sliding-window-tile-align), so
the back half would round as the pass even with a window of its own. The control:
the window triton builds for a one-token extend by itself, without that padding,
rounds differently.
"""

import types
import pytest

from triton_interpret import print_result, row_invariant_dot, run_as_script

pytestmark = pytest.mark.stack("yoco-model", step="gemma4-fast-prefill-branch")

SEQ = [(0, 150), (0, 37), (45, 90), (170, 3)]  # (cached prefix, new tokens)
WINDOW = 40  # backend.sliding_window_size (config sliding_window - 1)
HEADS, KV_HEADS, HEAD_DIM, POOL = 2, 1, 32, 2048


def _check():
    import torch

    from attention_stand_ins import (
        HAS_KV_LOC_PLAN,
        attach_translator,
        back_half_backend_of,
        bind_plan,
    )

    from sglang.kernels.ops.attention import extend_attention
    from sglang.kernels.ops.attention.extend_attention import (
        build_unified_kv_indices,
        extend_attention_fwd_unified,
    )
    from sglang.srt.layers import kv_sharing_fast_prefill as yoco
    from sglang.srt.layers.attention import triton_backend
    from sglang.srt.layers.radix_attention import AttentionType
    from sglang.srt.model_executor.forward_batch_info import (
        CaptureHiddenMode,
        ForwardBatch,
        ForwardMode,
    )

    row_invariant_dot()

    g = torch.Generator().manual_seed(0)
    k_buf = torch.randn(POOL, KV_HEADS, HEAD_DIM, generator=g)
    v_buf = torch.randn(POOL, KV_HEADS, HEAD_DIM, generator=g)
    pool = types.SimpleNamespace(
        get_key_buffer=lambda layer_id: k_buf, get_value_buffer=lambda layer_id: v_buf
    )

    bs = len(SEQ)
    seq = [p + e for p, e in SEQ]
    be = object.__new__(triton_backend.TritonAttnBackend)
    be.sliding_window_size = WINDOW
    be.req_to_token = torch.zeros(bs + 1, max(seq), dtype=torch.int32)
    slots = torch.randperm(POOL, generator=g)[: sum(seq)].to(torch.int32)
    for i, s in enumerate(seq):
        be.req_to_token[i + 1, :s] = slots[sum(seq[:i]) : sum(seq[: i + 1])]
    be.token_to_kv_pool = pool
    be.use_sliding_window_kv_pool = False
    be.dcp_size, be.page_size, be.device = 1, 1, "cpu"
    be.chain_verify = None  # __init__ sets it (split-KV verify off)
    be._translate_kv_loc = None
    be.enable_deterministic = True
    be.extend_attention_fwd_unified = extend_attention_fwd_unified
    be.build_unified_kv_indices = build_unified_kv_indices
    for name in ("kv_indptr", "qo_indptr", "window_kv_indptr", "mask_indptr"):
        setattr(be, name, torch.zeros(bs + 1, dtype=torch.int32))
    if HAS_KV_LOC_PLAN:  # what 0.5.23's __init__ adds for the extend path
        be.max_context_len, be._dense_one_shot_kv_indptr = max(seq), None
        be.align_window_kv_to_tiles = extend_attention.align_window_kv_to_tiles
        attach_translator(be)

    ext = [e for _, e in SEQ]
    pre = [p for p, _ in SEQ]
    n = sum(ext)
    fb = ForwardBatch(
        forward_mode=ForwardMode.EXTEND,
        batch_size=bs,
        input_ids=torch.zeros(n, dtype=torch.int64),
        req_pool_indices=torch.arange(1, bs + 1),
        seq_lens=torch.tensor(seq),
        out_cache_loc=torch.cat(
            [be.req_to_token[i + 1, p:s].long() for i, (p, s) in enumerate(zip(pre, seq))]
        ),
        seq_lens_sum=sum(seq),
    )
    fb.seq_lens_cpu = torch.tensor(seq)
    fb.orig_seq_lens = torch.tensor(seq)
    fb.extend_seq_lens_cpu, fb.extend_prefix_lens_cpu = ext, pre
    fb.extend_seq_lens = torch.tensor(ext, dtype=torch.int32)
    fb.extend_prefix_lens = torch.tensor(pre, dtype=torch.int32)
    fb.extend_start_loc = torch.cumsum(torch.tensor([0] + ext[:-1]), 0).to(torch.int32)
    fb.extend_num_tokens = n
    fb.positions = torch.cat([torch.arange(p, s) for p, s in zip(pre, seq)])
    fb.capture_hidden_mode = CaptureHiddenMode.NULL
    bind_plan(be, fb)
    q = torch.randn(n, HEADS * HEAD_DIM, generator=g)

    def attend(be, batch, rows, window):
        layer = types.SimpleNamespace(
            sliding_window_size=window, layer_id=0, tp_q_head_num=HEADS,
            qk_head_dim=HEAD_DIM, v_head_dim=HEAD_DIM, k_scale=None, v_scale=None,
            scaling=HEAD_DIM**-0.5, xai_temperature_len=-1,
            attn_type=AttentionType.DECODER,
        )
        o = torch.empty(len(rows), HEADS * HEAD_DIM)
        return be._forward_extend_unified(q[rows], o, layer, batch, True, 0.0, None)

    out = {}
    be.init_forward_metadata(fb)  # the full pass
    full = {w: attend(be, fb, torch.arange(n), w) for w in (WINDOW, -1)}
    back_be = back_half_backend_of(be)
    # what the planner's eager plan holds: the rows and their batch, prepared
    planned = yoco.back_half_rows(fb, first_shared_layer=1)
    batch = yoco.BackHalfAttention(back_be).prepare(fb, planned)
    rows = planned.token_index
    for w, name in ((WINDOW, "sliding"), (-1, "full")):
        back = attend(back_be, batch, rows, w)
        out[name] = [torch.equal(back[i], full[w][r]) for i, r in enumerate(rows)]
    out["back_half_mode"] = batch.forward_mode.name
    # Control: the window triton builds for a one-token extend on its own, with
    # its window lists not padded to tiles.
    if HAS_KV_LOC_PLAN:
        back_be.align_window_kv_to_tiles = lambda *args: (None, None)
    else:
        from sglang.srt.layers.attention import deterministic_window_tiles

        deterministic_window_tiles.WINDOW_TILE = 1  # no padding
    back_be.init_forward_metadata(batch)
    stock = attend(back_be, batch, rows, WINDOW)
    out["stock_window"] = [torch.equal(stock[i], full[WINDOW][r]) for i, r in enumerate(rows)]
    return out


def test_deterministic_back_half_attention_is_the_full_pass_bit_for_bit():
    out = run_as_script(__file__)
    assert out["back_half_mode"] == "EXTEND"
    assert out["full"] == [True] * len(SEQ)
    assert out["sliding"] == [True] * len(SEQ)
    # Requests longer than the window: the control's list starts at seq - 1 - W,
    # not on the pass's tile, and rounds differently.
    long_ones = [i for i, (p, e) in enumerate(SEQ) if p + e - 1 > WINDOW]
    assert not all(out["stock_window"][i] for i in long_ones)


if __name__ == "__main__":
    print_result(_check)
