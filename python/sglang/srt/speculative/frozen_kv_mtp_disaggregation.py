"""FROZEN_KV_MTP's first-round seed, on one server and on the decode server of PD.

The frozen drafter runs no forward at prefill: its seed for the first draft round is
the first sampled token and the *target's* hidden state at the last prompt position;
its own draft pass recomputes the top-k in the captured seed iteration. So a prefill
server has nothing draft-side to send but that hidden state, which goes in the PD
metadata's hidden-state slot, sized to the target's width on both servers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from sglang.srt.managers.overlap_utils import RelayPayload
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.speculative.frozen_kv_mtp_info import FrozenKVMTPDraftInput

if TYPE_CHECKING:
    from sglang.srt.managers.overlap_utils import FutureMap
    from sglang.srt.managers.schedule_batch import ScheduleBatch


def frozen_kv_mtp_seed(
    bonus_tokens: torch.Tensor, hidden_states: torch.Tensor, topk: int
) -> FrozenKVMTPDraftInput:
    """The seed of the next draft round: (bonus token, target hidden) per request."""
    seed = FrozenKVMTPDraftInput()
    seed.bonus_tokens = bonus_tokens.to(torch.int64)
    seed.hidden_states = hidden_states
    # Real-shaped zeros so filter_batch/merge_batch can slice them between rounds;
    # the captured seed iteration overwrites them.
    bs, device = bonus_tokens.shape[0], bonus_tokens.device
    seed.topk_p = torch.zeros((bs, topk), device=device, dtype=torch.float32)
    seed.topk_index = torch.zeros((bs, topk), device=device, dtype=torch.int64)
    seed.capture_hidden_mode = CaptureHiddenMode.LAST
    seed.num_tokens_per_req = 1
    seed.num_tokens_for_logprob_per_req = 1
    return seed


def frozen_kv_mtp_recurrent_hidden_size(draft_hf_config) -> int:
    """Width of the hidden state the drafter carries from round to round (and a prefill
    server sends): the target's, which the assistant's config names, not its own."""
    return int(draft_hf_config.backbone_hidden_size)


def build_frozen_kv_mtp_disagg_draft_input(
    batch: ScheduleBatch,
    last_tokens_tensor: torch.Tensor,
    future_map: FutureMap,
    topk: int,
) -> FrozenKVMTPDraftInput:
    """The decode server's seed for requests whose prefill ran on a prefill server."""
    hidden_states = torch.stack(
        [req.hidden_states_tensor for req in batch.reqs], dim=0
    ).to(batch.device)
    seed = frozen_kv_mtp_seed(last_tokens_tensor, hidden_states, topk)
    if batch.enable_overlap:
        seed.future_indices = batch.req_pool_indices
        # As for EAGLE: seed the relay with the known seq_lens, then the seed itself.
        future_map.publish(seed.future_indices, batch.seq_lens)
        future_map.stash(seed.future_indices, RelayPayload.from_draft_input(seed))
    return seed
