"""The release-specific part of running a KV-sharing fast prefill's back half.

The back half (``kv_sharing_fast_prefill_plan``) runs the model's KV-shared
layers on a subset of the pass's rows, with a batch and an attention backend of
its own. What binds them depends on how this release's batches and backends
work; the rest of the fast prefill does not. Here a batch reads the KV cache
through the ``KVLocPlan`` bound to it, whose tables are indexed by the batch's
own rows, every backend a forward reaches carries the runner's
``KVIndexTranslator``, and the pass's residual lives in its ``ResidualStream``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from sglang.srt.layers.layer_boundary.residual import batch as residual_batch

if TYPE_CHECKING:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


def bind_back_half_backend(model_runner: Any, backend: AttentionBackend) -> None:
    """Make the back half's own backend carry the runner's translator, as the
    runner's backends do (the model's layers read it off the forward's backend)."""
    model_runner.kv_index_translator.bind_and_verify_backends([backend])


def bind_back_half_batch(backend: AttentionBackend, forward_batch: ForwardBatch) -> None:
    """Make ``forward_batch`` (the back half's) read its own requests' KV: a
    plan over its own rows and lengths, its write ids used as they are (the
    back half writes no KV)."""
    translator = backend.kv_index_translator
    if translator is None:  # a backend that reads no plan
        return
    translator.bind_runner_slots(forward_batch)


def back_half_output(hidden_states: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
    """The pass's hidden states once the back half's rows are back: a new
    tensor, which the pass's stream holds as written, as the last layer would
    have left it."""
    return residual_batch.set_written(hidden_states, forward_batch)
