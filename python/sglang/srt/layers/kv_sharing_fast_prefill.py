"""KV-sharing fast prefill ("YOCO", You Only Cache Once): the model's side.

Models such as Gemma-4 E2B/E4B end with KV-shared layers: they write no KV cache
and attend over the cache of an earlier layer. In a prefill, the only output of
those layers anybody reads is the last token of each request (it is sampled;
nothing else is cached). So the back half runs on one token per request:

  1. The model declares its back half (``SupportsKVSharingFastPrefill``,
     ``KVSharedBackHalf``): the KV-shared layers, how many hidden-state streams
     a token carries and how its layers are called. That is all a model adds,
     besides one call at the split.
  2. The model runner plans each pass before the model runs
     (``model_executor/kv_sharing_fast_prefill_planner.py``): whether the fast
     path is safe and useful (``fast_prefill_skip_reason``) and which rows the
     back half runs on (the last token of each request whose prefill ends in
     the pass; an unfinished chunk needs no back-half output at all). The plan
     is published on the pass's ``ForwardBatch.fast_prefill``.
  3. The model runs its front layers on every token, then
     ``forward_batch.fast_prefill.run(forward_batch, ...)``: the plan gathers the rows, runs
     the back half on them (eager in ``BackHalfAttention``, or replayed from
     CUDA graphs) and scatters them back, so the final norm, LogitsProcessor
     and LAST hidden capture see exactly what the full computation produces
     there.

The back half attends in a context of its own, ``BackHalfAttention``: an
attention backend instance of the pass's kind, built once by the model runner,
whose metadata describes the back half's rows only; ``make_back_half_batch``
builds those rows' batch from the pass's host lists and index selects (one
decode step per request over its whole cached sequence, or an extend of that
one token where the backend's ``back_half_is_extend()`` says its decode kernel
would round differently). Neither the pass's backend nor its ForwardBatch is
written. KV-cache writes are unchanged: the front half writes every token, the
back half writes nothing.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import (
    TYPE_CHECKING,
    Callable,
    ContextManager,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
)

import torch
from sglang.srt.layers.kv_sharing_fast_prefill_rows import (
    back_half_output,
    bind_back_half_backend,
    bind_back_half_batch,
    call_layer,
    rows_entering_layers,
)
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.forward_context import (
    ForwardContext,
    forward_context,
    get_forward_context,
    has_forward_context,
)

if TYPE_CHECKING:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
    from sglang.srt.model_executor.model_runner import ModelRunner


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


class BackHalfAttention:
    """The attention context of the KV-shared back half.

    It owns an attention backend of the pass's kind, separate from the pass's
    (``AttentionBackend.make_back_half_backend``): its metadata describes the
    back half's rows, and the layers of the back half find it through the
    forward context. Eager passes build that metadata per pass
    (``prepare``); the back half's CUDA graphs capture with the same backend.
    """

    def __init__(self, backend: AttentionBackend):
        self.backend = backend
        self.extend_shaped = backend.back_half_is_extend()

    @classmethod
    def for_model_runner(cls, model_runner: ModelRunner) -> BackHalfAttention:
        backend = model_runner.attn_backend.make_back_half_backend(model_runner)
        bind_back_half_backend(model_runner, backend)
        return cls(backend)

    def prepare(self, forward_batch: ForwardBatch, rows: BackHalfRows) -> ForwardBatch:
        """The back half's batch for ``rows`` of pass ``forward_batch``, with its
        metadata current in this context's backend."""
        batch = make_back_half_batch(forward_batch, rows, self.extend_shaped)
        bind_back_half_batch(self.backend, batch)
        self.backend.init_back_half_metadata(batch, rows.prefix_lens_cpu)
        return batch

    @contextmanager
    def active(self) -> Iterator[None]:
        """Attention inside the block runs on this context's backend."""
        ctx = (
            replace(get_forward_context(), attn_backend=self.backend)
            if has_forward_context()
            else ForwardContext(attn_backend=self.backend)
        )
        with forward_context(ctx):
            yield


@dataclass(frozen=True)
class BackHalfRows:
    """Which rows of a pass the back half runs on."""

    first_shared_layer: int
    # Rows (into the pass's token dimension) of the tokens the back half runs on.
    token_index: torch.Tensor
    # Requests (into the batch) those rows belong to.
    req_index: torch.Tensor
    # Host copies, so building the back-half batch never syncs the device.
    seq_lens_cpu: Tuple[int, ...]
    # The pass's cached prefix of each kept request (where its keys start).
    prefix_lens_cpu: Tuple[int, ...]

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens_cpu)


@dataclass(frozen=True)
class FastPrefillPlan:
    """How one forward pass runs its back half: on ``rows`` of ``back_half``.
    Each kind of plan runs the rows its own way (``_back_half``)."""

    rows: BackHalfRows
    back_half: KVSharedBackHalf

    @property
    def first_shared_layer(self) -> int:
        return self.rows.first_shared_layer

    @property
    def num_reqs(self) -> int:
        return self.rows.num_reqs

    def run(
        self,
        forward_batch: ForwardBatch,
        hidden_states: torch.Tensor,
        per_layer_inputs: Optional[torch.Tensor],
    ) -> torch.Tensor:
        """The model's one call at the split: ``hidden_states`` (the front
        half's output on every row of pass ``forward_batch``) with the planned
        rows replaced by the back half's output. ``per_layer_inputs``: every
        layer's, every row's, as the full pass computes them ([tokens, layers,
        dim]), or None."""
        if not self.num_reqs:
            return hidden_states
        back_half, index = self.back_half, self.rows.token_index
        ple = None
        if per_layer_inputs is not None:
            ple = per_layer_inputs[:, back_half.first_layer : back_half.end_layer]
            ple = ple.index_select(0, index)
        rows = self._back_half(forward_batch, hidden_states, ple)
        out = scatter_rows(hidden_states, index, rows, back_half.token_dim)
        return back_half_output(out, forward_batch)

    def _back_half(
        self,
        forward_batch: ForwardBatch,
        hidden_states: torch.Tensor,
        per_layer_inputs: Optional[torch.Tensor],
    ) -> torch.Tensor:
        """The back half's output on the planned rows of ``hidden_states``."""
        raise NotImplementedError


@dataclass(frozen=True)
class FrontOnlyPlan(FastPrefillPlan):
    """No request's prefill ends in the pass: no back-half output is read."""

    def _back_half(self, forward_batch, hidden_states, per_layer_inputs):
        raise AssertionError("a pass without finishing requests runs no back half")


@dataclass(frozen=True)
class EagerBackHalfPlan(FastPrefillPlan):
    """The back half run eager, in ``attention`` on its own ``batch`` (decode-
    or extend-shaped; built and its metadata set before the model runs)."""

    attention: BackHalfAttention
    batch: ForwardBatch

    def _back_half(self, forward_batch, hidden_states, per_layer_inputs):
        rows = gather_rows(
            hidden_states, self.rows.token_index, self.back_half.token_dim
        )
        with self.attention.active():
            return self.back_half.forward(self.batch, rows, per_layer_inputs)


# Why a pass takes the full computation: (label of the pass counters, text).
SKIP_REASONS = {
    "no_kv_shared_layers": "model has no KV-shared layers",
    "forward_mode": "not a plain prefill pass",
    "pipeline_parallel": "pipeline parallelism",
    "one_token_per_request": "no request has more than one new token",
    "below_min_tokens": "fewer new tokens than --kv-sharing-fast-prefill-min-tokens",
    "input_logprobs": "input-token logprobs requested",
    "full_hidden_capture": "full hidden-state capture",
    "capture_in_back_half": "hidden-state capture inside the KV-shared layers",
    "pooled_output": "pooled/embedding output",
    "multi_item_scoring": "multi-item scoring",
    "input_embeds": "input embeddings without ids",
}


def fast_prefill_skip_reason(
    forward_batch: ForwardBatch,
    first_shared_layer: Optional[int],
    layers_to_capture: Sequence[int] = (),
    pp_size: int = 1,
    min_tokens: int = 0,
) -> Optional[str]:
    """None when YOCO may run this pass, else why the full computation is needed
    (or, below ``min_tokens`` new tokens, why it would not pay): a key of
    ``SKIP_REASONS``."""
    if first_shared_layer is None:
        return "no_kv_shared_layers"
    # Exactly EXTEND: DECODE/MIXED/TARGET_VERIFY/DRAFT_EXTEND/SPLIT_PREFILL/IDLE/
    # DLLM either save nothing or need every token's output.
    if forward_batch.forward_mode != ForwardMode.EXTEND:
        return "forward_mode"
    if pp_size > 1:
        return "pipeline_parallel"
    extend_lens = forward_batch.extend_seq_lens_cpu
    if extend_lens is None or not any(n > 1 for n in extend_lens):
        return "one_token_per_request"
    # A small pass is bound by kernel launches: the back half launches as many
    # kernels on one row per request as on every row, plus its own setup.
    if sum(extend_lens) < min_tokens:
        return "below_min_tokens"
    if forward_batch.return_logprob and forward_batch.extend_logprob_start_lens_cpu:
        for n, start in zip(extend_lens, forward_batch.extend_logprob_start_lens_cpu):
            if n - start > 0:
                return "input_logprobs"
    mode = forward_batch.capture_hidden_mode
    if mode is not None and mode.is_full():
        return "full_hidden_capture"
    # A capture at index i stores the input of layer i: the front half's output
    # (i == first shared layer) is complete, anything later is not.
    if any(i > first_shared_layer for i in layers_to_capture):
        return "capture_in_back_half"
    if forward_batch.return_pooled_hidden_states or forward_batch.dimensions:
        return "pooled_output"
    if forward_batch.multi_item_delimiter_indices is not None:
        return "multi_item_scoring"
    if forward_batch.input_embeds is not None and forward_batch.input_ids is None:
        return "input_embeds"
    return None


def _finishing_requests(forward_batch: ForwardBatch, seq_cpu: List[int]) -> List[int]:
    """Requests whose prefill ends in this pass (an unfinished chunk is dropped)."""
    bs = forward_batch.batch_size
    orig_cpu = forward_batch.orig_seq_lens_cpu
    if orig_cpu is None or len(orig_cpu) != bs:
        orig = forward_batch.orig_seq_lens
        if orig is None:
            return list(range(bs))
        # Not a scheduler prefill (no host copy): a device sync, before any
        # layer is launched.
        orig_cpu = orig[:bs].tolist()
    return [i for i in range(bs) if seq_cpu[i] >= orig_cpu[i]]


def _seq_lens_cpu(forward_batch: ForwardBatch) -> List[int]:
    if forward_batch.seq_lens_cpu is not None:
        return forward_batch.seq_lens_cpu[: forward_batch.batch_size].tolist()
    return [
        p + e
        for p, e in zip(
            forward_batch.extend_prefix_lens_cpu, forward_batch.extend_seq_lens_cpu
        )
    ]


def last_token_rows(
    extend_seq_lens_cpu: Sequence[int], reqs: Sequence[int]
) -> List[int]:
    """Row of each listed request's last new token (extend_start_loc + len - 1)."""
    starts, acc = [], 0
    for n in extend_seq_lens_cpu:
        starts.append(acc)
        acc += n
    return [starts[i] + extend_seq_lens_cpu[i] - 1 for i in reqs]


def back_half_rows(
    forward_batch: ForwardBatch, first_shared_layer: int
) -> BackHalfRows:
    """The last token of each request whose prefill ends in ``forward_batch``."""
    seq_cpu = _seq_lens_cpu(forward_batch)
    extend_lens = forward_batch.extend_seq_lens_cpu
    reqs = _finishing_requests(forward_batch, seq_cpu)
    rows = last_token_rows(extend_lens, reqs)
    device = forward_batch.seq_lens.device
    return BackHalfRows(
        first_shared_layer=first_shared_layer,
        token_index=torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True),
        req_index=torch.tensor(reqs, dtype=torch.int64).to(device, non_blocking=True),
        seq_lens_cpu=tuple(seq_cpu[i] for i in reqs),
        prefix_lens_cpu=tuple(seq_cpu[i] - extend_lens[i] for i in reqs),
    )


def make_back_half_batch(
    forward_batch: ForwardBatch, rows: BackHalfRows, extend_shaped: bool = False
) -> ForwardBatch:
    """The back half's own batch: one decode step per kept request.

    The back half attends from each request's last token over its whole
    sequence, already cached by the front half: exactly a decode step with no
    KV write, so decode metadata (split-KV kernels) serves it. With
    ``extend_shaped``, an extend of that one token over a cached prefix of
    seq_len - 1 instead (same attention, extend kernels). Built from the pass's
    host lists and index selects; the pass's batch is only read."""
    ridx, tok = rows.req_index, rows.token_index
    n = rows.num_reqs
    seq_lens = forward_batch.seq_lens.index_select(0, ridx)
    fb = ForwardBatch(
        forward_mode=ForwardMode.EXTEND if extend_shaped else ForwardMode.DECODE,
        batch_size=n,
        input_ids=(
            forward_batch.input_ids.index_select(0, tok)
            if forward_batch.input_ids is not None
            else None
        ),
        req_pool_indices=forward_batch.req_pool_indices.index_select(0, ridx),
        seq_lens=seq_lens,
        out_cache_loc=forward_batch.out_cache_loc.index_select(0, tok),
        seq_lens_sum=sum(rows.seq_lens_cpu),
        seq_lens_cpu=torch.tensor(rows.seq_lens_cpu, dtype=torch.int64),
        positions=forward_batch.positions.index_select(0, tok),
    )
    if extend_shaped:
        lens = forward_batch.extend_seq_lens
        fb.extend_num_tokens = n
        fb.extend_seq_lens = torch.ones(n, dtype=lens.dtype, device=lens.device)
        fb.extend_prefix_lens = (seq_lens - 1).to(lens.dtype)
        fb.extend_start_loc = torch.arange(n, dtype=lens.dtype, device=lens.device)
        fb.extend_seq_lens_cpu = [1] * n
        fb.extend_prefix_lens_cpu = [s - 1 for s in rows.seq_lens_cpu]
    return fb


def gather_rows(
    hidden_states: torch.Tensor, index: torch.Tensor, token_dim: int = 0
) -> torch.Tensor:
    """The rows ``index`` of the token dimension, whatever leads or follows it."""
    return hidden_states.index_select(token_dim, index)


def scatter_rows(
    hidden_states: torch.Tensor,
    index: torch.Tensor,
    rows: torch.Tensor,
    token_dim: int = 0,
) -> torch.Tensor:
    """``hidden_states`` with the rows ``index`` of the token dimension replaced
    by ``rows`` (out of place: the input may also be a captured aux state)."""
    return hidden_states.index_copy(token_dim, index, rows)
