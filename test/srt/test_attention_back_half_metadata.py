"""The back half's attention of KV-sharing fast prefill, on CPU: a backend of its own whose
metadata (triton, trtllm_mha, torch_native) is one query per request over the keys its last
token attends in the pass, built while the pass's is current, writing nothing of the pass's.
"""

import pytest
import torch
from attention_stand_ins import (  # noqa: F401 (_restore_kernels: autouse fixture)
    _restore_kernels, assert_same_batch, assert_same_state, assert_same_trtllm_metadata,
    back_half_backend_of, back_half_batch, backend_state, batch_state, make_batch, make_decode_batch,
    make_torch_native_backend, make_trtllm_backend, make_triton_backend, set_deterministic, trtllm_keys,
)
from hypothesis import given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.stack("yoco-model", step="attention-back-half-metadata")

# (new tokens, cached prefix) per request of the pass
REQS = st.lists(st.tuples(st.integers(1, 120), st.integers(0, 100)), min_size=1, max_size=6)


def build_untouched(be, fb, extend=False):
    """The back half of pass ``fb`` in a backend of its own, built while ``be`` holds the
    pass's metadata, asserting it wrote nothing of the pass's backend or batch."""
    before, batch_before = backend_state(be), batch_state(fb)
    back = back_half_backend_of(be)
    assert back is not be and back.back_half_is_extend() == extend
    back.init_back_half_metadata(back_half_batch(fb, extend, backend=back), fb.extend_prefix_lens_cpu)
    assert_same_state(be, before)
    assert_same_batch(fb, batch_before)
    return back


@pytest.mark.stack("yoco-model", step="attention-back-half-metadata", fails_before=True)
@settings(max_examples=40, deadline=None)
@given(window=st.sampled_from([3, 15, 63, 400]), reqs=REQS)
def test_triton_back_half_metadata_is_one_query_per_request(window, reqs):
    be = make_triton_backend(window)
    ext, pre = zip(*reqs)
    fb = make_batch(list(ext), list(pre), backend=be)
    # The pass's own (front-half) metadata lives in the persistent buffers.
    be.kv_indptr[1 : len(ext) + 1] = torch.cumsum(torch.tensor(pre), 0)
    be.qo_indptr[1 : len(ext) + 1] = torch.cumsum(torch.tensor(ext), 0)
    be.forward_metadata = object()
    back = build_untouched(be, fb)  # building touched nothing of the pass's
    meta = back.forward_metadata

    seq = [p + e for p, e in zip(pre, ext)]
    rows = [be.req_to_token[i + 1] for i in range(len(seq))]
    # full-attention layers: every key of the sequence, as a decode step reads it
    assert meta.kv_indptr.tolist() == [0] + torch.cumsum(torch.tensor(seq), 0).tolist()
    assert torch.equal(meta.kv_indices, torch.cat([r[:s] for r, s in zip(rows, seq)]))
    # sliding layers: the extend pass's window, W + 1 keys ending at the token
    w = [min(s, window + 1) for s in seq]
    assert meta.window_kv_indptr.tolist() == [0] + torch.cumsum(torch.tensor(w), 0).tolist()
    expect = torch.cat([r[s - k : s] for r, s, k in zip(rows, seq, w)])
    assert torch.equal(meta.window_kv_indices, be.token_to_kv_pool.translate_loc_from_full_to_swa(expect))


# 0.5.17's deterministic extend kernel tiles a window list from its first key,
# so the back half's list is made to start where the pass's did
# (_set_back_half_extend_window); 0.5.23 pads both to absolute tiles instead.
@pytest.mark.stack("yoco-model", step="attention-back-half-metadata", bases=("0.5.17",))
@settings(max_examples=40, deadline=None)
@given(window=st.sampled_from([3, 15, 63, 400]), reqs=REQS)
def test_deterministic_triton_back_half_is_an_extend_with_the_pass_key_layout(window, reqs):
    be = make_triton_backend(window)
    be.enable_deterministic = True
    ext, pre = zip(*reqs)
    fb = make_batch(list(ext), list(pre))
    be.forward_metadata = object()
    assert be.back_half_is_extend()
    back = build_untouched(be, fb, extend=True)
    meta = back.forward_metadata
    seq = [p + e for p, e in zip(pre, ext)]
    n = len(seq)
    assert meta.qo_indptr.tolist() == list(range(n + 1)) and meta.max_extend_len == 1
    rows = [be.req_to_token[i + 1] for i in range(n)]
    # full-attention layers: every cached key before the token, from key 0
    assert meta.kv_indptr.tolist() == [0] + torch.cumsum(torch.tensor(seq) - 1, 0).tolist()
    assert torch.equal(meta.kv_indices, torch.cat([r[: s - 1] for r, s in zip(rows, seq)]))
    # sliding layers: the cached keys before the token, from where the full
    # pass's window started (its prefix minus up to W keys), not the last W
    start = [p - min(p, window) for p in pre]
    w = [s - 1 - b for s, b in zip(seq, start)]
    assert meta.window_kv_indptr.tolist() == [0] + torch.cumsum(torch.tensor(w), 0).tolist()
    expect = torch.cat([r[b : s - 1] for r, s, b in zip(rows, seq, start)])
    assert torch.equal(meta.window_kv_indices, be.token_to_kv_pool.translate_loc_from_full_to_swa(expect))
    assert meta.window_kv_offsets.tolist() == start


TILE = 128  # align_window_kv_to_tiles' tile: a multiple of every BLOCK_N


def unified_keys(kv_indptr, kv_indices, new_keys, b, prefix_len):
    """(absolute position of its first key, the key list) that
    _forward_extend_unified hands the unified kernel for request b: its prefix
    list, which ends at prefix_len, then the keys of its new tokens."""
    prefix = kv_indices[int(kv_indptr[b]) : int(kv_indptr[b + 1])]
    return prefix_len - len(prefix), torch.cat([prefix, new_keys])


@pytest.mark.stack("yoco-model", step="attention-back-half-metadata", bases=("0.5.23",))
@settings(max_examples=40, deadline=None)
@given(window=st.sampled_from([3, 15, 63, 127, 128, 400]),
       reqs=st.lists(st.tuples(st.integers(1, 300), st.integers(0, 500)), min_size=1, max_size=6))
def test_deterministic_triton_back_half_is_an_extend_over_the_pass_tiles(window, reqs):
    """The unified extend kernel sums keys tile by tile from a list's start; deterministic
    inference pads window lists to absolute tiles. Each last token's back-half lists start
    on the tile the pass's give its first key and hold the pass's keys from there on."""
    be = set_deterministic(make_triton_backend(window, ctx=1024))
    ext, pre = zip(*reqs)
    fb = make_batch(list(ext), list(pre), backend=be)
    seq = [p + e for p, e in zip(pre, ext)]
    n = len(seq)
    # The pass's new tokens sit in req_to_token before its forward, as the
    # scheduler writes them: the back half reads them back from there.
    loc = fb.out_cache_loc.split(ext)
    for b, (p, s) in enumerate(zip(pre, seq)):
        be.req_to_token[b + 1, p:s] = loc[b]
    be.init_forward_metadata(fb)  # the pass's own metadata, current meanwhile
    pass_meta = be.forward_metadata
    assert pass_meta.aligned_window_kv_indptr is not None  # deterministic
    assert be.back_half_is_extend()
    back = build_untouched(be, fb, extend=True)  # wrote nothing of the pass's
    meta = back.forward_metadata
    assert meta is not pass_meta
    assert meta.qo_indptr.tolist() == list(range(n + 1)) and meta.max_extend_len == 1

    swa = be.token_to_kv_pool.translate_loc_from_full_to_swa
    pass_swa_new = pass_meta.swa_out_cache_loc.split(ext)
    for b, (p, s) in enumerate(zip(pre, seq)):
        q = s - 1  # the last token's position
        row = be.req_to_token[b + 1]
        # full-attention layers: both lists start at key 0, a tile boundary,
        # and hold the same keys; the back half's are the whole sequence
        start, keys = unified_keys(meta.kv_indptr, meta.kv_indices, loc[b][-1:], b, q)
        p_start, p_keys = unified_keys(pass_meta.kv_indptr, pass_meta.kv_indices, loc[b], b, p)
        assert start == p_start == 0
        assert torch.equal(keys, p_keys) and torch.equal(keys, row[:s])
        # sliding layers: the tile holding the token's first in-window key
        first = max(0, q - window)
        start, keys = unified_keys(meta.aligned_window_kv_indptr, meta.aligned_window_kv_indices,
                                   meta.swa_out_cache_loc[b : b + 1], b, q)
        p_start, p_keys = unified_keys(pass_meta.aligned_window_kv_indptr,
                                       pass_meta.aligned_window_kv_indices, pass_swa_new[b], b, p)
        assert start % TILE == 0 and p_start % TILE == 0
        assert start == first // TILE * TILE and p_start <= start
        assert len(keys) == s - start and len(p_keys) == s - p_start
        # from its first in-window key on (the keys before it in that tile
        # are masked: copies of the list's first key, or keys past the window)
        assert torch.equal(keys[first - start :], p_keys[first - p_start :])
        assert torch.equal(keys[first - start :], swa(row[first:s]))


def test_torch_native_back_half_metadata():
    be = make_torch_native_backend()
    fb = make_batch([9, 30, 2], backend=be)
    be.swa_out_cache_loc = be.token_to_kv_pool.translate_loc_from_full_to_swa(fb.out_cache_loc)
    back = build_untouched(be, fb)
    last = torch.cumsum(fb.extend_seq_lens, 0) - 1
    assert torch.equal(back.swa_out_cache_loc, be.token_to_kv_pool.translate_loc_from_full_to_swa(
        fb.out_cache_loc[last]))


@settings(max_examples=40, deadline=None)
@given(page_size=st.sampled_from([1, 16, 64]), window=st.sampled_from([-1, 0, 3, 15, 63, 400]), reqs=REQS)
def test_trtllm_back_half_metadata_is_a_decode_step(page_size, window, reqs):
    be = make_trtllm_backend(page_size)
    ext, pre = zip(*reqs)
    fb = make_batch(list(ext), list(pre), backend=be)
    be.init_forward_metadata(fb)  # the pass's own (front-half) metadata
    pass_meta = be.forward_metadata
    back = build_untouched(be, fb)  # building touched nothing of the pass's
    meta = back.forward_metadata

    # what trtllm_mha builds for a genuine decode step of these requests
    seq = [p + e for p, e in zip(pre, ext)]
    last = torch.cumsum(torch.tensor(ext), 0) - 1
    ref = make_trtllm_backend(page_size)
    ref.init_forward_metadata(make_decode_batch(fb.req_pool_indices, fb.seq_lens, fb.out_cache_loc[last],
                                                backend=ref))
    assert_same_trtllm_metadata(meta, ref.forward_metadata, seq, page_size)
    # ... which is: one query per request over its whole sequence
    assert meta.max_seq_len_q == 1
    assert meta.cache_seqlens_int32.tolist() == seq
    assert meta.cu_seqlens_q.tolist() == list(range(len(seq) + 1))
    assert meta.cu_seqlens_k.tolist() == [0] + torch.cumsum(torch.tensor(seq), 0).tolist()
    swa = be.token_to_kv_pool.translate_loc_from_full_to_swa
    assert torch.equal(meta.swa_out_cache_loc, swa(fb.out_cache_loc[last]))
    # Each request's last token reads, in full and sliding layers, the keys it
    # reads in the extend pass: the last window + 1 of its sequence (no W + 1
    # fix-up as for triton: the window is the kernels', not the metadata's).
    for b, s in enumerate(seq):
        row = be.req_to_token[b + 1, max(0, s - 1 - window) if window >= 0 else 0 : s]
        for is_swa, slots in ((False, row.long()), (True, swa(row.long()))):
            keys = trtllm_keys(be, meta, b, window, is_swa)
            assert torch.equal(keys, slots)
            assert torch.equal(keys, trtllm_keys(be, pass_meta, b, window, is_swa))


def test_a_backend_without_it_refuses_with_the_flag_named():
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    class Other(AttentionBackend):
        pass

    with pytest.raises(NotImplementedError, match="--kv-sharing-fast-prefill"):
        Other().make_back_half_backend(model_runner=None)
    assert not Other().back_half_is_extend()
