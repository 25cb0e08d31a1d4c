"""How this release's decoder layers take a KV-sharing fast prefill's back-half rows.

The back half (``kv_sharing_fast_prefill``) runs the model's KV-shared layers on
a subset of the pass's rows. How a layer takes them depends on how this
release's decoder layers work; the rest of the fast prefill does not. Here a
decoder layer returns its output and keeps the residual in the batch's
``ResidualStream``.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch
from sglang.srt.layers.layer_boundary.residual import batch as residual_batch


@contextmanager
def rows_entering_layers(forward_batch: Any, hidden_states: torch.Tensor) -> Iterator[torch.Tensor]:
    """The rows as the back half's first layer takes them: a written residual,
    as the whole pass enters the first KV-shared layer, in a stream of the back
    half's batch, released on the way out."""
    try:
        yield residual_batch.set_written(hidden_states, forward_batch)
    finally:
        residual_batch.clear(forward_batch)


def call_layer(layer, **kwargs) -> torch.Tensor:
    return layer(**kwargs)
