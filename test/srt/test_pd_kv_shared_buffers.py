"""Step pd-skip-kv-shared-buffers: a PD prefill server leaves the KV-shared layers' buffers
(allocated, never written) out of what mooncake sends, in the full-attention list and the
sliding-window state alike; a model without KV sharing sends everything."""
import types

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.stack("generic-fixes", step="pd-skip-kv-shared-buffers")

# Gemma-4's layer pattern, shortened: (sliding, sliding, full) twice; the last two layers
# (one sliding, one full) read layers 1 and 2's cache when two layers share KV.
LAYER_TYPES = ["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2 + ["full_attention"]


def _pool():
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    ids = {t: [i for i, x in enumerate(LAYER_TYPES) if x == t] for t in set(LAYER_TYPES)}
    return SWAKVPool(size=16, size_swa=16, page_size=1, dtype=torch.float32, head_num=1, head_dim=4,
                     swa_attention_layer_ids=ids["sliding_attention"],
                     full_attention_layer_ids=ids["full_attention"], device="cpu")


def _manager(**fields):
    """A stand-in for a prefill server's MooncakeKVManager: the given fields, and the
    class's own helpers that its transfers call on it (those this release has)."""
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager

    manager = types.SimpleNamespace(pp_size=1, enable_deferred_decode_kv_release=False, **fields)
    for method in ("get_mha_kv_ptrs_with_pp", "_await_transfer_futures"):  # the latter: 0.5.23
        if hasattr(MooncakeKVManager, method):
            setattr(manager, method, getattr(MooncakeKVManager, method).__get__(manager))
    return manager


def _sent(pool, shared):
    """The source buffers mooncake's transfer writes from, per registered list (full KV,
    SWA state), for two pages, with the prefill server's KV args for `shared` layers."""
    from sglang.srt.disaggregation.kv_shared_buffers import never_written_data_ptrs
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager

    config = types.SimpleNamespace(num_hidden_layers=len(LAYER_TYPES), num_kv_shared_layers=shared)
    kv_args = types.SimpleNamespace(prefill_start_layer=0,
                                    never_written_data_ptrs=never_written_data_ptrs(pool, config))
    sent = []
    manager = _manager(kv_args=kv_args, is_mla_backend=False, is_hybrid_mla_backend=False,
                       enable_custom_mem_pool=False, max_transfer_batch_indices=0,
                       _transfer_data=lambda session, blocks: sent.extend(blocks) or 0)
    out = {}
    for name, (ptrs, _, item_lens) in (("full", pool.get_contiguous_buf_infos()),
                                       ("swa", pool.get_state_buf_infos())):
        sent.clear()
        rc = MooncakeKVManager._send_kvcache_generic(
            manager, mooncake_session_id="decode", src_data_ptrs=ptrs, dst_data_ptrs=[p + 1 for p in ptrs],
            item_lens=item_lens, prefill_data_indices=np.array([0, 1], dtype=np.int32),
            dst_data_indices=np.array([2, 3], dtype=np.int32), executor=None)
        assert rc == 0
        out[name] = {src for src, _, _ in sent}
    return out


def _layer(pool, layer_id):
    """(K, V) addresses of one layer's buffers, and of its first page."""
    index, is_swa = pool.layers_mapping[layer_id]
    sub = pool.swa_kv_pool if is_swa else pool.full_kv_pool
    return {sub.k_buffer[index].data_ptr(), sub.v_buffer[index].data_ptr()}


@pytest.mark.stack("generic-fixes", step="pd-skip-kv-shared-buffers", fails_before=True)
def test_the_kv_shared_layers_buffers_are_not_sent():
    pool = _pool()
    everything = _sent(pool, 0)
    assert everything["full"] == _layer(pool, 2) | _layer(pool, 5)
    assert everything["swa"] == set().union(*(_layer(pool, i) for i in (0, 1, 3, 4)))
    skipped = _sent(pool, 2)
    assert skipped["full"] == _layer(pool, 2)
    assert skipped["swa"] == set().union(*(_layer(pool, i) for i in (0, 1, 3)))


def _sliced_layers(shared):
    """The layers (K, V) whose buffers mooncake's head-sliced transfer (prefill TP 1, decode
    TP 2: each decode rank takes one of the two KV heads) reads, from one MHA pool of six
    layers, the last `shared` of them KV-shared."""
    import concurrent.futures

    from sglang.srt.disaggregation.kv_shared_buffers import never_written_data_ptrs
    from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

    layers, heads, dim = 6, 2, 4
    pool = MHATokenToKVPool(size=16, page_size=1, dtype=torch.float32, head_num=heads, head_dim=dim,
                            layer_num=layers, device="cpu", enable_memory_saver=False)
    ptrs, _, item_lens = pool.get_contiguous_buf_infos()
    config = types.SimpleNamespace(num_hidden_layers=layers, num_kv_shared_layers=shared)
    kv_args = types.SimpleNamespace(
        engine_rank=0, page_size=1, kv_data_ptrs=ptrs, kv_item_lens=item_lens, kv_layer_ids=[],
        kv_head_num=heads, total_kv_head_num=heads, prefill_start_layer=0,
        never_written_data_ptrs=never_written_data_ptrs(pool, config))
    read = []
    engine = types.SimpleNamespace(
        batch_transfer_sync=lambda session, src, dst, lens: read.extend(src) or 0)
    manager = _manager(kv_args=kv_args, attn_tp_size=1, engine=engine)
    with concurrent.futures.ThreadPoolExecutor(2) as executor:
        rc = MooncakeKVManager.send_kvcache_slice(
            manager, "decode", np.array([0, 1], dtype=np.int32), [p + 1 for p in ptrs],
            np.array([2, 3], dtype=np.int32), 0, 2, item_lens[0] // heads, executor)
    assert rc == 0 and read
    spans = [(name, i, b.data_ptr(), b.data_ptr() + b.nbytes)
             for name, bufs in (("k", pool.k_buffer), ("v", pool.v_buffer)) for i, b in enumerate(bufs)]
    return {(name, i) for addr in read for name, i, lo, hi in spans if lo <= addr < hi}


@pytest.mark.stack("generic-fixes", step="pd-skip-kv-shared-buffers", fails_before=True)
def test_the_head_sliced_transfer_leaves_them_out_too():
    # Prefill and decode servers of different TP sizes: each layer's heads are sliced.
    assert _sliced_layers(0) == {(kv, i) for kv in "kv" for i in range(6)}
    assert _sliced_layers(2) == {(kv, i) for kv in "kv" for i in range(4)}


@pytest.mark.stack("generic-fixes", step="pd-skip-kv-shared-buffers")
def test_the_prefill_server_says_where_they_are_still_sent():
    from sglang.srt.disaggregation.kv_shared_buffers import never_written_transfer_note
    from sglang.srt.disaggregation.utils import TransferBackend

    config = types.SimpleNamespace(num_hidden_layers=42, num_kv_shared_layers=18)
    assert never_written_transfer_note(TransferBackend.MOONCAKE, frozenset(), config) is None
    mooncake = never_written_transfer_note(TransferBackend.MOONCAKE, frozenset({1}), config)
    assert "18 of 42 layers" in mooncake and "left out" in mooncake
    assert "SGLANG_DISAGG_STAGING_BUFFER" in mooncake
    nixl = never_written_transfer_note(TransferBackend.NIXL, frozenset({1}), config)
    assert "the nixl transfer sends" in nixl and "only mooncake" in nixl
