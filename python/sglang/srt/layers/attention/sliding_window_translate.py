"""Full -> SWA translation of a sliding window's KV indices without a device sync.

``update_sliding_window_buffer`` (triton backend) fills each request's last
``window`` token ids into a flat buffer, then maps them to the SWA pool. Stock
0.5.17 slices that buffer by the window's end, a 0-dim GPU tensor: the slice
needs its value on the host, a device-to-host sync in every decode and verify
metadata update of a sliding-window model (Gemma-4, every step). The host then
cannot prepare the next step while the GPU runs this one.

The end is at most ``bs * window``, a host number, so the translation runs over
that prefix and a mask on the GPU keeps the entries past the end unchanged.
"""

import torch


def translate_window_in_place(
    token_to_kv_pool,
    window_kv_indices: torch.Tensor,
    window_kv_indptr: torch.Tensor,
    bs: int,
    window: int,
) -> None:
    """``window_kv_indices[:window_kv_indptr[bs]]`` full -> SWA ids, in place,
    without reading ``window_kv_indptr`` on the host."""
    bound = min(bs * window, window_kv_indices.numel())
    head = window_kv_indices[:bound]
    inside = torch.arange(bound, device=head.device) < window_kv_indptr[bs]
    # Entries past the end hold stale ids: translate a valid one (0) there and
    # write back what was there.
    swa = token_to_kv_pool.translate_loc_from_full_to_swa(torch.where(inside, head, 0))
    head.copy_(torch.where(inside, swa, head))
