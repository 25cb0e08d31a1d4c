"""Buffers of KV-shared layers: allocated, never written, so never worth transferring.

A model with KV sharing (Gemma-3n, Gemma-4 E2B/E4B: ``num_kv_shared_layers``) runs its
last layers' attention on an earlier layer's cache. The KV pool still holds a buffer for
each of those layers, which nothing writes and nothing reads. A PD prefill server sends
every registered buffer; these it can skip (their copies on the decode server stay as
unwritten there, where the same layers read the same earlier layers' cache).

Mooncake's per-layer transfers skip them, at equal TP sizes and head-sliced between
different ones. Its staged transfer packs every layer into one buffer whose layout both
servers compute, its decode-context-parallel transfer plans tokens, not layers, and the
other backends send every registered buffer: the prefill server says at start-up which
it is (``never_written_transfer_note``).
"""

from __future__ import annotations

from typing import FrozenSet, Optional


def kv_shared_layer_ids(hf_text_config) -> range:
    """The global ids of the layers that read another layer's cache (none without sharing)."""
    num_layers = hf_text_config.num_hidden_layers
    shared = getattr(hf_text_config, "num_kv_shared_layers", 0) or 0
    return range(num_layers - shared, num_layers)


def _layer_entries(pool, indices) -> list:
    """The K and V entries of the given layers of a pool, as its PD registration lists
    them (every layer's K, then every layer's V)."""
    ptrs, _, _ = pool.get_contiguous_buf_infos()
    half = len(ptrs) // 2
    return [ptrs[i] for i in indices] + [ptrs[half + i] for i in indices]


def never_written_data_ptrs(token_to_kv_pool, hf_text_config) -> FrozenSet[int]:
    """Data pointers of the KV-shared layers' buffers, as the pool registers them for
    transfer (full-attention list and sliding-window state alike). Empty for a model
    without KV sharing and for pools laid out otherwise than per layer K then V."""
    shared = kv_shared_layer_ids(hf_text_config)
    if not shared:
        return frozenset()
    pool = token_to_kv_pool
    mapping = getattr(pool, "layers_mapping", None)
    if mapping is not None:
        # SWAKVPool: {global layer id: (index in its sub-pool, is_swa)}
        if not hasattr(pool, "full_kv_pool"):
            return frozenset()
        indices = {False: [], True: []}
        for layer_id in shared:
            if layer_id in mapping:
                index, is_swa = mapping[layer_id]
                indices[is_swa].append(index)
        return frozenset(
            _layer_entries(pool.full_kv_pool, indices[False])
            + _layer_entries(pool.swa_kv_pool, indices[True])
        )
    if hasattr(pool, "k_buffer") and hasattr(pool, "v_buffer"):
        # One MHA pool: a buffer per layer from start_layer on.
        start = getattr(pool, "start_layer", 0) or 0
        indices = [i - start for i in shared if 0 <= i - start < pool.layer_num]
        return frozenset(_layer_entries(pool, indices))
    return frozenset()


def never_written_transfer_note(
    transfer_backend, never_written, hf_text_config
) -> Optional[str]:
    """The prefill server's start-up line on what its transfer does with these buffers
    (None for a model without KV sharing)."""
    if not never_written:
        return None
    shared = len(kv_shared_layer_ids(hf_text_config))
    layers = f"{shared} of {hf_text_config.num_hidden_layers} layers"
    backend = getattr(transfer_backend, "value", transfer_backend)
    if backend == "mooncake":
        return (
            f"PD: the KV-shared layers' buffers ({layers}, never written) are left "
            "out of the KV transfer; a staged (SGLANG_DISAGG_STAGING_BUFFER) or "
            "decode-context-parallel transfer still sends them"
        )
    return (
        f"PD: the {backend} transfer sends the KV-shared layers' buffers too "
        f"({layers}, never written, so never read); only mooncake's transfer "
        "leaves them out"
    )
