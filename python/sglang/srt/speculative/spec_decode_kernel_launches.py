"""This release's verify-side Triton kernels of a spec-v2 decode round whose
``tl.constexpr`` follows the step count, launched once per reachable value by
``spec_decode_kernel_warmup`` (which launches ``assign_req_to_token_pool``, the
same on every release, itself):

- ``assign_extend_cache_locs_uniform`` (verify prep): ``draft_token_num``;
- ``fill_bonus_tokens`` (after verify): ``accept_stride``, the step count + 1.

The launches pass the same argument dtypes as the round, and both 16-byte
alignments where the round passes a tensor view (Triton specializes pointers
on it).
"""

from __future__ import annotations

from typing import Iterable

import torch
from sglang.kernels.ops.speculative.cache_locs import assign_extend_cache_locs_uniform
from sglang.kernels.ops.speculative.eagle import fill_bonus_tokens


def both_alignments(n: int, dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Two ``n``-element tensors, one 16-byte-aligned and one offset by one
    element: the allocator hands out slices of its free list, so the round
    sees either (the warm-up of ``assign_req_to_token_pool`` uses it too)."""
    buf = torch.zeros(n + 1, dtype=dtype, device=device)
    return buf[:n], buf[1:]


def launch_verify_kernels(
    req_to_token: torch.Tensor,
    configs: Iterable[tuple[int, int]],
    topk: int = 1,
) -> None:
    """Launch each kernel once per (draft steps, draft tokens). The verify prep
    reads row 0 into a scratch tensor, so ``req_to_token`` is not written.
    ``topk`` does not change what these kernels compile: every tree width
    commits through ``fill_bonus_tokens`` with the chain's stride."""
    device = req_to_token.device
    pool_len = req_to_token.shape[1]
    one_index = torch.zeros(1, dtype=torch.int64, device=device)
    for steps, draft_tokens in configs:
        # As eagle_prepare_for_verify: start offsets are batch.seq_lens (int64).
        for start in both_alignments(1, torch.int64, device):
            scratch = torch.empty(draft_tokens, dtype=torch.int64, device=device)
            assign_extend_cache_locs_uniform[(1,)](
                one_index, req_to_token, start, scratch, pool_len, draft_tokens
            )
        # As run_eagle_verify: int32 accepted tokens, lengths and bonus tokens.
        accept_tokens = torch.zeros(steps + 1, dtype=torch.int32, device=device)
        accept_lens = torch.ones(1, dtype=torch.int32, device=device)
        bonus = torch.empty(1, dtype=torch.int32, device=device)
        fill_bonus_tokens[(1,)](accept_tokens, accept_lens, bonus, steps + 1)
