"""What the one-node greedy verify tail (``one_node_greedy_verify``) needs from
this release's verify: its simulated-acceptance sampler, and the workers and
batches whose stock verify does something per accepted step that the tail
would skip. This release's verify has none beyond those the tail checks."""

from __future__ import annotations

from sglang.srt.speculative.spec_utils import (
    _sample_simulated_acc_len as sample_simulated_acc_len,
)

__all__ = [
    "batch_needs_stock_verify",
    "sample_simulated_acc_len",
    "worker_needs_stock_verify",
]


def worker_needs_stock_verify(worker) -> bool:
    return False


def batch_needs_stock_verify(worker, batch) -> bool:
    return False
