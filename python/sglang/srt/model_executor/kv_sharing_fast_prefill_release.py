"""The release-specific part of running a KV-sharing fast prefill's back half.

The back half (``kv_sharing_fast_prefill_plan``) runs the model's KV-shared
layers on a subset of the pass's rows, with a batch and an attention backend of
its own. What binds them depends on how this release's batches and backends
work; the rest of the fast prefill does not. Here a batch reads the KV cache
through its own ``req_pool_indices``, and a backend takes what it reads from
the model runner when it is built.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


def bind_back_half_backend(model_runner: Any, backend: AttentionBackend) -> None:
    """Bind the back half's own backend to the runner's state: its
    construction already did, nothing else is bound to a backend here."""


def bind_back_half_batch(backend: AttentionBackend, forward_batch: ForwardBatch) -> None:
    """Make ``forward_batch`` (the back half's) read its own requests' KV: it
    already does, nothing else is bound to a batch here."""


def back_half_output(hidden_states: torch.Tensor, forward_batch: ForwardBatch) -> torch.Tensor:
    """The pass's hidden states once the back half's rows are back: as they are."""
    return hidden_states
