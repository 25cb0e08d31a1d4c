"""The release-specific part of running a KV-sharing fast prefill's back half.

The back half (``kv_sharing_fast_prefill``) runs the model's KV-shared layers on
a subset of the pass's rows, with a batch of its own. What that takes depends on
how this release's decoder layers, batches and backends work; the rest of the
fast prefill does not. Here a decoder layer returns ``(hidden_states,
residual)``, with the residual fused inside the layer, a batch reads the KV
cache through its own ``req_pool_indices``, and a backend takes what it reads
from the model runner when it is built.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

import torch

if TYPE_CHECKING:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch
    from sglang.srt.model_executor.model_runner import ModelRunner


def bind_back_half_backend(
    model_runner: ModelRunner, backend: AttentionBackend
) -> None:
    """Bind the back half's own backend to the runner's state: its
    construction already did, nothing else is bound to a backend here."""


def bind_back_half_batch(
    backend: AttentionBackend, forward_batch: ForwardBatch
) -> None:
    """Make ``forward_batch`` (the back half's) read its own requests' KV: it
    already does, nothing else is bound to a batch here."""


@contextmanager
def rows_entering_layers(
    forward_batch: ForwardBatch, hidden_states: torch.Tensor
) -> Iterator[torch.Tensor]:
    """The rows as the back half's first layer takes them: as they are."""
    yield hidden_states


def call_layer(layer, **kwargs) -> torch.Tensor:
    hidden_states, _ = layer(**kwargs)
    return hidden_states


def back_half_output(
    hidden_states: torch.Tensor, forward_batch: ForwardBatch
) -> torch.Tensor:
    """The pass's hidden states once the back half's rows are back: as they are."""
    return hidden_states
