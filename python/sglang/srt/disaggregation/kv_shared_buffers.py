"""Buffers of KV-shared layers: allocated, never written, so never worth transferring.

A model with KV sharing (Gemma-3n, Gemma-4 E2B/E4B: ``num_kv_shared_layers``) runs its
last layers' attention on an earlier layer's cache. The KV pool still holds a buffer for
each of those layers, which nothing writes and nothing reads. A PD prefill server sends
every registered buffer; these it can skip (their copies on the decode server stay as
unwritten there, where the same layers read the same earlier layers' cache).
"""

from __future__ import annotations

from typing import FrozenSet


def kv_shared_layer_ids(hf_text_config) -> range:
    """The global ids of the layers that read another layer's cache (none without sharing)."""
    num_layers = hf_text_config.num_hidden_layers
    shared = getattr(hf_text_config, "num_kv_shared_layers", 0) or 0
    return range(num_layers - shared, num_layers)


def _layer_entries(pool, index: int):
    """The (K, V) entries of one layer of a pool, as its PD registration lists them."""
    ptrs, _, _ = pool.get_contiguous_buf_infos()
    half = len(ptrs) // 2
    return ptrs[index], ptrs[half + index]


def never_written_data_ptrs(token_to_kv_pool, hf_text_config) -> FrozenSet[int]:
    """Data pointers of the KV-shared layers' buffers, as the pool registers them for
    transfer (full-attention list and sliding-window state alike). Empty for a model
    without KV sharing and for pools laid out otherwise than per layer K then V."""
    shared = kv_shared_layer_ids(hf_text_config)
    if not shared:
        return frozenset()
    ptrs = set()
    mapping = getattr(token_to_kv_pool, "layers_mapping", None)
    if (
        mapping is not None
    ):  # SWAKVPool: {global layer id: (index in its sub-pool, is_swa)}
        if not hasattr(token_to_kv_pool, "full_kv_pool"):
            return frozenset()
        for layer_id in shared:
            if layer_id in mapping:
                index, is_swa = mapping[layer_id]
                sub_pool = (
                    token_to_kv_pool.swa_kv_pool
                    if is_swa
                    else token_to_kv_pool.full_kv_pool
                )
                ptrs.update(_layer_entries(sub_pool, index))
    elif hasattr(token_to_kv_pool, "k_buffer") and hasattr(
        token_to_kv_pool, "v_buffer"
    ):  # one MHA pool: a buffer per layer from start_layer on
        start = getattr(token_to_kv_pool, "start_layer", 0) or 0
        for layer_id in shared:
            if 0 <= layer_id - start < token_to_kv_pool.layer_num:
                ptrs.update(_layer_entries(token_to_kv_pool, layer_id - start))
    return frozenset(ptrs)
