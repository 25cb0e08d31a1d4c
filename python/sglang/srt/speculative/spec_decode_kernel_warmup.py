"""Compile, at start-up, the Triton kernels whose specialization a spec-v2
decode round picks from its batch size and step count.

A few small kernels on a round's host path take a ``tl.constexpr`` that moves
with the batch: the batch size's next power of two (``bs_upper``) or the step
count (the draft width, the accepted-token stride). ``assign_req_to_token_pool``
(``alloc_for_spec_decode``: ``bs_upper``) is the same on every release and is
launched here; the verify-side ones depend on the release's verify, and
``spec_decode_kernel_launches`` lists and launches them.

Triton compiles each new value on first use, on the scheduler thread, inside
the round's launch: tens of ms per kernel on a cold cache. A server paid it
the first time its batch passed 64 (or 128, ...) and the first time adaptive
speculation switched to a step count, mid-serving; at E4B chat 80 under
FROZEN_KV_MTP that added about 96 ms to one prefill batch's first tokens.
Launching each reachable value once here, on no-op rows, moves the cost to
start-up.
"""

from __future__ import annotations

import logging
import time
from typing import Iterable

import torch
from sglang.srt.mem_cache.allocation import assign_req_to_token_pool
from sglang.srt.speculative.spec_decode_kernel_launches import (
    both_alignments,
    launch_verify_kernels,
)
from sglang.srt.utils import is_cuda, is_hip, next_power_of_2

logger = logging.getLogger(__name__)


def batch_size_buckets(max_batch_size: int) -> list[int]:
    """Every ``bs_upper`` a decode batch of 1..max_batch_size compiles."""
    return sorted({next_power_of_2(bs) for bs in range(1, max_batch_size + 1)})


def step_configs(worker) -> list[tuple[int, int]]:
    """(draft steps, draft tokens) of every runtime state the worker can run."""
    configs = {(worker.speculative_num_steps, worker.speculative_num_draft_tokens)}
    controller = getattr(worker, "adaptive_controller", None)
    if controller is not None:
        # AdaptiveController.init_states builds each candidate as (s, s + 1).
        configs |= {(s, s + 1) for s in controller.candidate_steps}
    return sorted(configs)


def launch_spec_decode_kernels(
    req_to_token: torch.Tensor,
    batch_sizes: Iterable[int],
    configs: Iterable[tuple[int, int]],
    topk: int = 1,
) -> None:
    """Launch each kernel once per specialization: ``assign_req_to_token_pool``
    for every batch size, then the release's verify-side kernels for every
    (draft steps, draft tokens). Every row has start == end (or reads row 0
    into a scratch tensor), so ``req_to_token`` is not written."""
    device = req_to_token.device
    pool_len = req_to_token.shape[1]
    for bs in batch_sizes:
        # As alloc_for_spec_decode: int64 pool indices and out locations,
        # int32 kv lengths (eagle_prepare_for_decode).
        indices = torch.zeros(bs, dtype=torch.int64, device=device)
        lens = torch.zeros(bs, dtype=torch.int32, device=device)
        for out_cache_loc in both_alignments(1, torch.int64, device):
            assign_req_to_token_pool[(bs,)](
                indices, req_to_token, lens, lens, out_cache_loc, pool_len, bs
            )
    launch_verify_kernels(req_to_token, configs, topk)


def warm_spec_decode_kernels(worker) -> None:
    """Compile every specialization the worker's decode rounds can reach."""
    if not (is_cuda() or is_hip()):
        return  # other devices route these ops to non-Triton kernels
    pool = worker.target_worker.model_runner.req_to_token_pool
    tic = time.perf_counter()
    buckets = batch_size_buckets(pool.size)
    configs = step_configs(worker)
    launch_spec_decode_kernels(pool.req_to_token, buckets, configs, worker.topk)
    torch.cuda.synchronize()
    logger.info(
        f"Warmed spec decode kernels for batch buckets {buckets} and "
        f"(steps, draft tokens) {configs}: {time.perf_counter() - tic:.2f}s"
    )
