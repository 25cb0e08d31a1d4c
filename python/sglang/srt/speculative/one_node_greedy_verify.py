"""Sampling tail of a one-node verify on an all-greedy batch.

At 0 draft steps (FROZEN_KV_MTP's adaptive state for large batches) the target
verifies one node per request, the previous bonus token. Accepting it is
certain and the new bonus token is the target's argmax; yet ``eagle_sample``
walks a tree for it (zeros, full, argmax, ``verify_tree_greedy``, +1), the
verify then commits the accepted path (the accepted tokens, the bonus tokens,
the new lengths), and the frozen draft-extend selects each request's hidden
row with an index built from ``accept_lens``. Small launches between two
target graphs, each computing an identity: with the stock tail (twenty
launches where the commit is not fused) the 0-step round's inter-token latency
at E4B chat 80 stayed 0.7-1.0 % above a plain decode's.

This tail gives the same tokens (the argmax of the same logits) from one
argmax and one cast. It applies per batch only where ``eagle_sample`` takes its
greedy path and nothing reads the tree: every request greedy, no penalties or
logit bias, no grammar, no logprobs, not idle, nothing else the release's
verify does per accepted step (``one_node_greedy_verify_release``).
Everything else falls through to the stock verify unchanged.
``SGLANG_ONE_NODE_GREEDY_VERIFY=0`` turns it off (for A/B runs).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch
from sglang.srt.configs.hybrid_arch import mambaish_config
from sglang.srt.environ import envs
from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.speculative.eagle_info import EagleDraftInput
from sglang.srt.speculative.one_node_greedy_verify_release import (
    batch_needs_stock_verify,
    sample_simulated_acc_len,
    worker_needs_stock_verify,
)
from sglang.srt.speculative.spec_utils import (
    SIMULATE_ACC_LEN,
    SIMULATE_ACC_METHOD,
    SIMULATE_ACC_TOKEN_MODE,
)
from sglang.srt.utils.async_probe import sanitize_nan_logits

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.speculative.eagle_info import EagleVerifyInput


def one_node_greedy_verify_tail(worker) -> Optional["OneNodeGreedyVerifyTail"]:
    """The tail for ``worker``, or None where its verify must keep every step:
    a tree draft (topk > 1 compacts the accepted path) or mamba state committed
    per accepted step. (A KV cache that clears unaccepted draft states is
    checked at the first round: the pool does not exist yet at worker init.)"""
    if not envs.SGLANG_ONE_NODE_GREEDY_VERIFY.get():
        return None
    if worker.topk != 1:
        return None
    if mambaish_config(worker.target_worker.model_runner.model_config) is not None:
        return None
    if worker_needs_stock_verify(worker):
        return None
    return OneNodeGreedyVerifyTail(worker)


def one_node_greedy_applies(
    batch: ScheduleBatch, verify_input: EagleVerifyInput
) -> bool:
    """Host-only: would ``eagle_sample`` take its greedy path on a one-node tree,
    with nothing after it (grammar, logprobs) reading the tree?"""
    if verify_input.draft_token_num != 1 or batch.forward_mode.is_idle():
        return False
    if batch.has_grammar or batch.return_logprob:
        return False
    info = batch.sampling_info
    return (
        info.is_all_greedy
        and info.acc_additive_penalties is None
        and info.acc_scaling_penalties is None
        and info.logit_bias is None
    )


class OneNodeGreedyVerifyTail:
    """Called by ``run_eagle_verify`` after the target forward; returns the
    round's result, or None to let the stock sampling run."""

    def __init__(self, worker):
        self._worker = worker
        self._kv_cache_ok: Optional[bool] = None

    def _kv_cache_keeps_no_draft_state(self) -> bool:
        if self._kv_cache_ok is None:
            kv_cache = self._worker.token_to_kv_pool_allocator.get_kvcache()
            clear = getattr(kv_cache, "clear_unaccepted_c128_draft_states", None)
            self._kv_cache_ok = clear is None
        return self._kv_cache_ok

    def __call__(
        self,
        batch: ScheduleBatch,
        verify_input: EagleVerifyInput,
        forward_batch_output,
        verify_forward_batch,
        can_run_cuda_graph: bool,
    ) -> Optional[GenerationBatchResult]:
        if not one_node_greedy_applies(batch, verify_input):
            return None
        if batch_needs_stock_verify(self._worker, batch):
            return None
        if not self._kv_cache_keeps_no_draft_state():
            return None
        logits_output = forward_batch_output.logits_output
        logits = logits_output.next_token_logits
        sanitize_nan_logits(logits, "verify: target model logits")
        # int64, as the frozen seed keeps it: the seed's cast becomes a no-op.
        bonus_tokens = torch.argmax(logits, dim=-1)
        if SIMULATE_ACC_LEN > 0:
            # As generate_simulated_accept_index at width 1 (same host RNG use):
            # 'fixed' emits token 100, 'real-draft-token' the target's argmax.
            sample_simulated_acc_len(SIMULATE_ACC_LEN, SIMULATE_ACC_METHOD, 1)
            if SIMULATE_ACC_TOKEN_MODE == "fixed":
                bonus_tokens.fill_(100)
        accept_lens = torch.ones_like(bonus_tokens, dtype=torch.int32)
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=bonus_tokens.to(torch.int32),
            can_run_cuda_graph=can_run_cuda_graph,
            speculative_num_draft_tokens=1,
            next_draft_input=EagleDraftInput(bonus_tokens=bonus_tokens),
            accept_lens=accept_lens,
            new_seq_lens=batch.seq_lens + accept_lens,
            routed_experts_output=forward_batch_output.routed_experts_output,
            indexer_topk_output=forward_batch_output.indexer_topk_output,
            # As the stock verify: the scheduler pins the forward batch.
            extra_keep_alive_refs=[verify_forward_batch],
        )
