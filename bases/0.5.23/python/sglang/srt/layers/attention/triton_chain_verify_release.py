"""The triton chain verify's pieces that follow this release's backend
(`triton_chain_verify.py` holds the rest): the verify width, how a key list's
indices are filled (through the KVIndexTranslator and the batch's KVLocPlan), the
ForwardMetadata fields of this release, and the decode call of the per-draft-token
rows.

The backend selects the chain verify as a mode of the split-KV verify
(`_select_verify_splitkv` in triton_backend.py, under SGLANG_ENABLE_SPLITKV_VERIFY);
it is not selected where reads are translated (the unified pool), so the index
fill below reads `req_to_token` rows passed through.
"""

import torch


def num_draft_tokens(backend, spec_info) -> int:
    """Query rows a request verifies."""
    return backend._target_verify_num_tokens_per_req(spec_info)


def key_list_plan(forward_batch):
    """The plan the index fill reads through."""
    return forward_batch.kv_loc_plan


def fill_key_lists(
    backend,
    update_sliding_window_buffer,
    plan,
    rows,
    lens,
    kv_indptr,
    kv_indices,
    window,
    window_kv_indptr,
    window_kv_indices,
):
    """The backend's decode index builders over key lists (pool row `rows[i]`, its
    first `lens[i]` keys); with a `window`, also the lists' last `window` keys.
    Returns the window lengths (None without a window)."""
    m = rows.shape[0]
    kv_indptr[1 : m + 1] = torch.cumsum(lens, dim=0)
    backend.kv_index_translator.pack_read_stream(
        plan,
        req_pool_indices=rows,
        seq_lens=lens,
        indptr=kv_indptr[: m + 1],
        out=kv_indices,
    )
    if window is None:
        return None
    _, _, window_lens, _ = update_sliding_window_buffer(
        window_kv_indptr,
        backend.kv_index_translator,
        plan,
        rows,
        window,
        lens,
        m,
        token_to_kv_pool=backend.token_to_kv_pool,
        window_kv_indices=window_kv_indices,
    )
    return window_lens


def graph_metadata_fields(backend) -> dict:
    """ForwardMetadata fields of this release for the CUDA-graph verify: none. No
    Lean decode buffers (the rows run the standard split-KV kernel, see
    `decode_rows`) and no uneven-batch flag (the splits are sized without it)."""
    return {}


def decode_rows(backend, q, k, v, layer, forward_batch, **kwargs):
    """The split-KV decode kernel over the verify's rows (K/V already saved).

    forward_decode may pick Lean decode from the batch's request count and
    length sum, while these rows are bs x N and the verify's metadata carries
    no Lean buffers: keep the standard kernel for them."""
    lean = backend.enable_lean_attention
    backend.enable_lean_attention = False
    try:
        return backend.forward_decode(
            q, k, v, layer, forward_batch, save_kv_cache=False, **kwargs
        )
    finally:
        backend.enable_lean_attention = lean
