"""How this release's decoder layers take a KV-sharing fast prefill's back-half rows.

The back half (``kv_sharing_fast_prefill``) runs the model's KV-shared layers on
a subset of the pass's rows. How a layer takes them depends on how this
release's decoder layers work; the rest of the fast prefill does not. Here a
decoder layer returns ``(hidden_states, residual)``, with the residual fused
inside the layer.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

import torch


@contextmanager
def rows_entering_layers(forward_batch: Any, hidden_states: torch.Tensor) -> Iterator[torch.Tensor]:
    """The rows as the back half's first layer takes them: as they are."""
    yield hidden_states


def call_layer(layer, **kwargs) -> torch.Tensor:
    hidden_states, _ = layer(**kwargs)
    return hidden_states
