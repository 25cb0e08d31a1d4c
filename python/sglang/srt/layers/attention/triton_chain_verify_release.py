"""The triton chain verify's pieces that follow this release's backend
(`triton_chain_verify.py` holds the rest): the switch, the verify width, how a
key list's indices are filled (straight from `req_to_token`), the ForwardMetadata
fields of this release, and the decode call of the per-draft-token rows.

The switch is `--triton-attention-split-kv-verify` (see
`arg_groups/triton_split_kv_verify_hook.py`); `chain_verify_enabled` keeps it off
where the backend takes a verify path the chain form is not wired into.
"""

import logging

import torch
from sglang.kernels.ops.kvcache.kv_indices import create_flashinfer_kv_indices_triton

logger = logging.getLogger(__name__)


def chain_verify_enabled(backend, server_args) -> bool:
    """Whether this backend verifies top-1 chains as decode queries."""
    if not getattr(server_args, "triton_attention_split_kv_verify", False):
        return False
    if backend.skip_prefill or backend.is_draft_runner or backend.topk != 1:
        return (
            False  # no TARGET_VERIFY here (drafts); topk > 1 is a tree (hook rejects)
        )
    # Each of these takes a path of its own in forward_extend / the metadata
    # builders; the chain form is only wired for the plain one.
    unwired = [
        name
        for name, on in (
            ("deterministic inference", backend.enable_deterministic),
            ("decode context parallelism", backend.dcp_size > 1),
            ("the unified memory pool", backend._translate_kv_loc is not None),
            ("MLA", backend.use_mla),
        )
        if on
    ]
    if unwired:
        logger.warning(
            "--triton-attention-split-kv-verify is ignored with %s: verify keeps the "
            "extend kernel",
            ", ".join(unwired),
        )
    return not unwired


def num_draft_tokens(backend, spec_info) -> int:
    """Query rows a request verifies."""
    # DSpark's draft propose verifies gamma tokens (< the verify window).
    n = getattr(spec_info, "draft_token_num", None) if spec_info is not None else None
    return backend.num_draft_tokens if n is None else int(n)


def key_list_plan(forward_batch):
    """What the index fill reads through: nothing here, it reads req_to_token."""
    return None


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
    create_flashinfer_kv_indices_triton[(m,)](
        backend.req_to_token,
        rows,
        lens,
        kv_indptr,
        None,
        kv_indices,
        backend.req_to_token.stride(0),
    )
    if window is None:
        return None
    _, _, window_lens, _ = update_sliding_window_buffer(
        window_kv_indptr,
        backend.req_to_token,
        window,
        lens,
        rows,
        m,
        token_to_kv_pool=backend.token_to_kv_pool,
        window_kv_indices=window_kv_indices,
    )
    return window_lens


def graph_metadata_fields(backend, out_cache_loc_full_physical=None) -> dict:
    """ForwardMetadata fields of this release for the CUDA-graph verify."""
    return dict(out_cache_loc_full_physical=out_cache_loc_full_physical)


def decode_rows(backend, q, k, v, layer, forward_batch, **kwargs):
    """The split-KV decode kernel over the verify's rows (K/V already saved)."""
    return backend.forward_decode(
        q, k, v, layer, forward_batch, save_kv_cache=False, **kwargs
    )
