"""The release-specific part of running a KV-sharing fast prefill's back half.

The back half (``kv_sharing_fast_prefill``) runs the model's KV-shared layers on
a subset of the pass's rows, with a batch of its own. What that takes depends on
how this release's decoder layers, batches and backends work; the rest of the
fast prefill does not. Here a decoder layer returns its output and keeps the
residual in the batch's ``ResidualStream``, a batch reads the KV cache through
the ``KVLocPlan`` bound to it, whose tables are indexed by the batch's own rows,
and every backend a forward reaches carries the runner's ``KVIndexTranslator``.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import torch
from sglang.srt.layers.layer_boundary.residual import batch as residual_batch

if TYPE_CHECKING:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner


def bind_back_half_backend(
    model_runner: ModelRunner, backend: AttentionBackend
) -> None:
    """Make the back half's own backend carry the runner's translator, as the
    runner's backends do (the model's layers read it off the forward's backend)."""
    model_runner.kv_index_translator.bind_and_verify_backends([backend])


def bind_back_half_batch(
    backend: AttentionBackend, forward_batch: ForwardBatch
) -> None:
    """Make ``forward_batch`` (the back half's) read its own requests' KV: a
    plan over its own rows and lengths, its write ids used as they are (the
    back half writes no KV)."""
    translator = backend.kv_index_translator
    if translator is None:  # a backend that reads no plan
        return
    translator.bind_runner_slots(forward_batch)


@contextmanager
def rows_entering_layers(
    forward_batch: ForwardBatch, hidden_states: torch.Tensor
) -> Iterator[torch.Tensor]:
    """The rows as the back half's first layer takes them: a written residual,
    as the whole pass enters the first KV-shared layer, in a stream of the back
    half's batch, released on the way out."""
    try:
        yield residual_batch.set_written(hidden_states, forward_batch)
    finally:
        residual_batch.clear(forward_batch)


def call_layer(layer, **kwargs) -> torch.Tensor:
    return layer(**kwargs)


def back_half_output(
    hidden_states: torch.Tensor, forward_batch: ForwardBatch
) -> torch.Tensor:
    """The pass's hidden states once the back half's rows are back: a new
    tensor, which the pass's stream holds as written, as the last layer would
    have left it."""
    return residual_batch.set_written(hidden_states, forward_batch)
