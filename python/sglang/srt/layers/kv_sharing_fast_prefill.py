"""KV-sharing fast prefill ("YOCO", You Only Cache Once): what a model declares.

Models such as Gemma-4 E2B/E4B end with KV-shared layers: they write no KV cache
and attend over the cache of an earlier layer. In a prefill, the only output of
those layers anybody reads is the last token of each request (it is sampled;
nothing else is cached). So the back half can run on one token per request.

A model declares its back half (``SupportsKVSharingFastPrefill``,
``KVSharedBackHalf``): the KV-shared layers, how many hidden-state streams a
token carries and how its layers are called. It runs its front layers on every
token and, where the pass's ``ForwardBatch.fast_prefill`` holds a plan
(``BackHalfPlan``), hands the front half's output to ``plan.run``, which returns
the hidden states with each finishing request's last row through the back half.
That is all a model adds. Planning and running the back half (which rows, its
attention, its CUDA graphs) is the model runner's:
``model_executor/kv_sharing_fast_prefill_plan.py`` and its planner.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator, Optional, Protocol, Sequence

import torch
from sglang.srt.layers.kv_sharing_fast_prefill_rows import (
    call_layer,
    rows_entering_layers,
)

# The pass's ForwardBatch, by its role: this module is read by the forward
# batch's own module (its ``fast_prefill`` field), so it imports none of it.
ForwardBatch = Any


def first_kv_shared_layer(config) -> Optional[int]:
    """Index of the first KV-shared layer, or None when the model has none."""
    num_shared = getattr(config, "num_kv_shared_layers", 0) or 0
    if num_shared <= 0:
        return None
    return config.num_hidden_layers - num_shared


@dataclass(frozen=True)
class BackHalfLayerCall:
    """How a model's decoder layers take the back half's rows: ``entering``
    hands the rows to the first layer (and cleans up after the last), ``call``
    runs one layer and returns the hidden states the next one takes."""

    call: Callable[..., torch.Tensor]
    entering: Callable[[ForwardBatch, torch.Tensor], ContextManager[torch.Tensor]]


# This release's decoder-layer convention (Gemma-4's layers follow it).
DECODER_LAYER_CALL = BackHalfLayerCall(call_layer, rows_entering_layers)


@contextmanager
def _rows_as_they_are(
    forward_batch: ForwardBatch, hidden_states: torch.Tensor
) -> Iterator[torch.Tensor]:
    yield hidden_states


# Layers that take the hidden states and return the next ones, with no
# residual or other state threaded between them (Gemma-3n's).
PLAIN_LAYER_CALL = BackHalfLayerCall(
    lambda layer, **kwargs: layer(**kwargs), _rows_as_they_are
)


@dataclass(frozen=True)
class KVSharedBackHalf:
    """A model's KV-shared layers, as the fast prefill runs them."""

    layers: Sequence[torch.nn.Module]
    first_layer: int
    end_layer: int
    hidden_size: int
    per_layer_input_dim: int  # 0: the layers take no per-layer input
    # Hidden-state streams per token: 0, rows are [tokens, hidden]; n, rows are
    # [n, tokens, hidden] (Gemma-3n's AltUp).
    streams: int = 0
    layer_call: BackHalfLayerCall = DECODER_LAYER_CALL

    @classmethod
    def of(cls, config, layers, end_layer: int, per_layer_input_dim, **layout):
        """The back half of a model with this config, or None without one."""
        first = first_kv_shared_layer(config)
        if first is None:
            return None
        return cls(
            layers,
            first,
            end_layer,
            config.hidden_size,
            per_layer_input_dim or 0,
            **layout,
        )

    @property
    def token_dim(self) -> int:
        return 1 if self.streams else 0

    def forward(self, forward_batch, hidden_states, per_layer_inputs):
        """The layers on these rows (``per_layer_inputs``: [rows, the back
        half's layers, dim], or None). The layers get no other argument: the
        ones that declare a back half read none, and graphs could not take it."""
        call = self.layer_call
        with call.entering(forward_batch, hidden_states) as h:
            for i in range(self.first_layer, self.end_layer):
                h = call.call(
                    self.layers[i],
                    positions=forward_batch.positions,
                    hidden_states=h,
                    per_layer_input=(
                        per_layer_inputs[:, i - self.first_layer, :]
                        if per_layer_inputs is not None
                        else None
                    ),
                    forward_batch=forward_batch,
                )
            return h


class SupportsKVSharingFastPrefill:
    """A text model whose prefill can run its KV-shared layers on each
    finishing request's last token only (--kv-sharing-fast-prefill). The model
    runner finds it among the model's modules and plans its passes."""

    def kv_shared_back_half(self) -> Optional[KVSharedBackHalf]:
        """Its KV-shared layers, or None when it has none."""
        raise NotImplementedError


def find_kv_shared_back_half(model: torch.nn.Module):
    """(the module that declares a back half, its declaration), or None."""
    for module in model.modules():
        if isinstance(module, SupportsKVSharingFastPrefill):
            back_half = module.kv_shared_back_half()
            return None if back_half is None else (module, back_half)
    return None


class BackHalfPlan(Protocol):
    """What a model reads of the pass's plan (``ForwardBatch.fast_prefill``)."""

    @property
    def first_shared_layer(self) -> int:
        """The layer the front half ends before."""
        ...

    def run(
        self,
        forward_batch: ForwardBatch,
        hidden_states: torch.Tensor,
        per_layer_inputs: Optional[torch.Tensor],
    ) -> torch.Tensor:
        """``hidden_states`` (the front half's output on every row) with the
        planned rows replaced by the back half's output; ``per_layer_inputs``:
        every layer's, every row's ([tokens, layers, dim]), or None."""
        ...
