"""Sliding-window key lists of triton's deterministic extend, cut at absolute tiles.

Under ``--enable-deterministic-inference`` every extend runs triton's unified 1-stage
kernel (``_fwd_kernel_unified``), which sums a query's keys tile by tile, BLOCK_N keys
a tile, from the start of the request's key list. A full-attention layer's list starts
at position 0, so which tile a key falls in depends on its position only. A
sliding-window layer's list starts where the window of the pass's first query starts,
``prefix_len - min(prefix_len, window)``: a cold prefill of a prompt (prefix 0), a later
chunk of it and a prefix-cache hit on it start at different positions, cut the same
keys into different tiles and round differently, so a cached prompt's output is not
its cold output, even under deterministic inference.

``align_window_to_tiles`` pads each list at its front with copies of its first key
until it starts on a multiple of ``WINDOW_TILE`` (a multiple of every BLOCK_N the
kernel takes). The copies sit before the window, where the kernel's sliding-window
mask drops them (a fully masked tile adds exact zeros), so every pass cuts a
request's keys at the same absolute positions. They are copies of a key inside the
window, not the slots before it: those may have left the SWA pool already.

No device-to-host sync: the padded list is written into a buffer of a length known on
the host (at most ``WINDOW_TILE - 1`` more keys per request); the kernel reads it
through the new indptr only.
"""

from typing import Optional, Tuple

import torch

# A multiple of every BLOCK_N of _get_block_sizes_for_extend_attention (32, 64, 128).
WINDOW_TILE = 128


def align_window_to_tiles(
    metadata,
    window_kv_indptr: torch.Tensor,
    window_kv_indices: torch.Tensor,
    window_start_pos: Optional[torch.Tensor],
    bs: int,
) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor]]:
    """``(indptr, indices, start)`` of the window lists padded to start on a multiple
    of ``WINDOW_TILE``; ``start`` is each list's new first position. Computed once per
    pass and window list: kept on ``metadata`` (the backend's ForwardMetadata), for
    the other sliding-window layers of the pass."""
    if window_start_pos is None or WINDOW_TILE <= 1:
        return window_kv_indptr, window_kv_indices, window_start_pos
    memo = getattr(metadata, "_window_tiles", None)
    if memo is not None and memo[0] is window_kv_indices and memo[1] is window_kv_indptr:
        return memo[2]
    aligned = _pad_to_tiles(window_kv_indptr, window_kv_indices, window_start_pos, bs)
    if metadata is not None:
        metadata._window_tiles = (window_kv_indices, window_kv_indptr, aligned)
    return aligned


def _pad_to_tiles(indptr, indices, start, bs):
    n = indices.numel()
    if n == 0:
        # No request has a key before its extend: every window starts at 0.
        return indptr, indices, start
    dtype = start.dtype
    start = start[:bs].to(torch.int64)
    pad = start % WINDOW_TILE
    old_indptr = indptr[: bs + 1].to(torch.int64)
    new_indptr = torch.zeros_like(old_indptr)
    new_indptr[1:] = torch.cumsum(old_indptr[1:] - old_indptr[:-1] + pad, dim=0)
    # Output slot o belongs to request r, at j = o - new_indptr[r] in its list; the
    # first pad[r] slots repeat its first key. Slots past the end are never read.
    slot = torch.arange(n + bs * (WINDOW_TILE - 1), device=indices.device)
    req = torch.searchsorted(new_indptr[1:], slot, right=True).clamp_(max=bs - 1)
    src = old_indptr[req] + (slot - new_indptr[req] - pad[req]).clamp_(min=0)
    new_indices = indices[src.clamp_(max=n - 1)]
    return new_indptr.to(indptr.dtype), new_indices, (start - pad).to(dtype)
