"""What the one-node greedy verify tail (``one_node_greedy_verify``) needs from
this release's verify: its simulated-acceptance sampler, and the workers and
batches whose stock verify does something per accepted step that the tail
would skip."""

from __future__ import annotations

from sglang.srt.speculative.spec_utils import sample_simulated_acc_len
from sglang.srt.utils import is_hip

__all__ = [
    "batch_needs_stock_verify",
    "sample_simulated_acc_len",
    "worker_needs_stock_verify",
]


def worker_needs_stock_verify(worker) -> bool:
    """On ROCm, ``eagle_sample``'s greedy path broadcasts rank 0's tokens to the
    other TP ranks (their draft tokens may differ); the tail would not."""
    if not is_hip():
        return False
    from sglang.srt.layers.dp_attention import is_dp_attention_enabled
    from sglang.srt.runtime_context import get_parallel

    parallel = get_parallel()
    group = parallel.attn_tp_group if is_dp_attention_enabled() else parallel.tp_group
    return group.world_size > 1


def batch_needs_stock_verify(worker, batch) -> bool:
    """Host-only: does the stock verify read the accepted path for this batch?
    A watermark records the accepted tokens, HiSparse commits them through the
    accept index, and mamba tracking takes its states from the accepted steps."""
    watermark = worker.target_worker.model_runner.watermark_state
    if watermark is not None and batch.sampling_info.has_watermark_candidates:
        return True
    if batch.hisparse_coordinator is not None:
        return True
    return batch.mamba_track_indices is not None
