"""This release's verify-side Triton kernels of a spec-v2 decode round whose
``tl.constexpr`` follows the step count, launched once per reachable value by
``spec_decode_kernel_warmup`` (which launches ``assign_req_to_token_pool``, the
same on every release, itself):

- ``assign_extend_cache_locs_uniform`` (``eagle_prepare_for_verify``):
  ``draft_token_num``;
- ``_verify_commit_outputs_kernel`` (``run_eagle_verify``'s fused commit on
  CUDA and ROCm): ``INDEX_STRIDE_0`` (the step count + 1) and, at topk 1,
  ``DRAFT_WIDTH`` (the draft tokens). ``fill_bonus_tokens`` runs only where
  this kernel does not, on devices the warmup skips.

The verify-side kernels are launched through the functions the round calls,
with the round's arguments: Triton specializes on None against a tensor, so a
launch with other optional arguments (the translated writes, positions and
anchors a draft-planned window passes) would compile a variant the round never
runs. FROZEN_KV_MTP and EAGLE without a prepared window call both without them,
and without mamba tracking (``TRACK_INTERVAL`` 0). The launches pass the
round's dtypes, and both 16-byte alignments where the round passes a tensor
view (Triton specializes pointers on it).
"""

from __future__ import annotations

from typing import Iterable

import torch
from sglang.kernels.ops.speculative.cache_locs import (
    assign_extend_cache_locs_uniform_func,
)
from sglang.kernels.ops.speculative.eagle import prepare_verify_commit_outputs


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
    only reads row 0, so ``req_to_token`` is not written."""
    device = req_to_token.device
    one_index = torch.zeros(1, dtype=torch.int64, device=device)
    for steps, draft_tokens in configs:
        # batch.seq_lens (int64) is both the verify's start offsets and the
        # commit's lengths.
        for seq_lens in both_alignments(1, torch.int64, device):
            # As eagle_prepare_for_verify without a prepared window.
            assign_extend_cache_locs_uniform_func(
                req_pool_indices=one_index,
                req_to_token=req_to_token,
                start_offset=seq_lens,
                batch_size=1,
                draft_token_num=draft_tokens,
                device=device,
            )
            # As run_eagle_verify after eagle_sample: int32 predictions over
            # the draft tokens, accept index of width steps + 1, accept lengths.
            predict = torch.zeros(draft_tokens, dtype=torch.int32, device=device)
            accept_index = torch.zeros((1, steps + 1), dtype=torch.int32, device=device)
            accept_lens = torch.ones(1, dtype=torch.int32, device=device)
            if topk == 1:
                prepare_verify_commit_outputs(
                    predict,
                    accept_index,
                    accept_lens,
                    seq_lens,
                    num_draft_tokens=draft_tokens,
                    mamba_track_interval=0,
                )
            else:
                prepare_verify_commit_outputs(
                    predict, accept_index, accept_lens, seq_lens
                )
