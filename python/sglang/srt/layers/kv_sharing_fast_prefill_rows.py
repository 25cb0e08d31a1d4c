"""The release-specific part of running a KV-sharing fast prefill's back half.

The back half (``kv_sharing_fast_prefill``) runs the model's KV-shared layers on
a subset of the pass's rows, with a batch of its own. What that takes depends on
how this release's decoder layers and batches work; the rest of the fast prefill
does not. Here a decoder layer returns ``(hidden_states, residual)``, with the
residual fused inside the layer, and a batch reads the KV cache through its own
``req_pool_indices``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import torch

if TYPE_CHECKING:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch


def bind_back_half_batch(backend: AttentionBackend, forward_batch: ForwardBatch) -> None:
    """Make ``forward_batch`` (the back half's) read its own requests' KV: it
    already does, nothing else is bound to a batch here."""


def run_layers(
    layers,
    first_layer: int,
    end_layer: int,
    forward_batch: ForwardBatch,
    hidden_states: torch.Tensor,
    per_layer_inputs: Optional[torch.Tensor],
    **kwargs,
) -> torch.Tensor:
    """Layers [first_layer, end_layer) on these rows, as the back half runs them
    (``per_layer_inputs``: [rows, those layers, dim], or None)."""
    h = hidden_states
    for layer_idx in range(first_layer, end_layer):
        h, _ = layers[layer_idx](
            positions=forward_batch.positions,
            hidden_states=h,
            per_layer_input=(
                per_layer_inputs[:, layer_idx - first_layer, :]
                if per_layer_inputs is not None
                else None
            ),
            forward_batch=forward_batch,
            **kwargs,
        )
    return h
