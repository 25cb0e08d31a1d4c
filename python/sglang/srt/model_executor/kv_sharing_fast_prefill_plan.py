"""KV-sharing fast prefill (YOCO): how the model runner runs a back half.

The model declares its back half (``layers/kv_sharing_fast_prefill.py``). Here is
the rest of one pass, which the planner
(``model_executor/kv_sharing_fast_prefill_planner.py``) puts together before the
model runs: whether the fast path is safe and useful (``fast_prefill_skip_reason``),
which rows the back half runs on (``back_half_rows``: the last token of each
request whose prefill ends in the pass; an unfinished chunk needs no back-half
output at all), and the plan published on ``ForwardBatch.fast_prefill``, which
gathers those rows, runs the back half on them (eager in ``BackHalfAttention``, or
replayed from CUDA graphs) and scatters them back, so the final norm,
LogitsProcessor and LAST hidden capture see exactly what the full computation
produces there.

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
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Sequence, Tuple

import torch
from sglang.srt.layers.kv_sharing_fast_prefill import KVSharedBackHalf
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.forward_context import (
    ForwardContext,
    forward_context,
    get_forward_context,
    has_forward_context,
)
from sglang.srt.model_executor.kv_sharing_fast_prefill_release import (
    back_half_output,
    bind_back_half_backend,
    bind_back_half_batch,
)

if TYPE_CHECKING:
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

# The model runner, by its role: it imports the planner, which imports this.
ModelRunner = Any


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
