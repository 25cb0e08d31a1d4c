"""KV-sharing fast prefill ("YOCO", You Only Cache Once).

Models such as Gemma-4 E2B/E4B end with KV-shared layers: they write no KV cache
and attend over the cache of an earlier layer. In a prefill, the only output of
those layers anybody reads is the last token of each request (it is sampled;
nothing else is cached). So the back half runs on one token per request:

  1. ``plan_fast_prefill`` decides once per forward pass whether that is safe
     and useful, and picks the rows (last token of each request whose prefill
     ends in this pass; an unfinished chunk needs no back-half output at all).
     Its ``FastPrefillPlan`` is immutable.
  2. The back half attends in a context of its own, ``BackHalfAttention``: an
     attention backend instance of the pass's kind, built once by the model
     runner (as each draft step of a multi-step draft backend has its own),
     whose metadata describes the back half's rows only. ``make_back_half_batch``
     builds those rows' batch from the pass's host lists and index selects: one
     decode step per request (its query attends over the whole sequence, which
     the front half already cached), or an extend of that one token where the
     backend's ``back_half_is_extend()`` says its decode kernel would round
     differently. The KV-shared layers run under a forward context whose
     backend is that one, so neither the pass's backend nor its ForwardBatch is
     written.
  3. The model scatters the rows back, so the final norm, LogitsProcessor and
     LAST hidden capture see exactly what the full computation produces there.

Rows are gathered and scattered along the token dimension of hidden states of
any leading shape (``token_dim``), so a model that carries several streams per
token (``[streams, tokens, hidden]``, Gemma-3n's AltUp) passes them through
unchanged. How a model's decoder layers take the rows is its own
(``BackHalfLayerCall``): by default this release's decoder-layer convention
(``kv_sharing_fast_prefill_rows``), or layers that return their next hidden
states and thread nothing else (``PLAIN_LAYER_CALL``).

Per-layer inputs (Gemma-4's and Gemma-3n's PLE) are computed before layer 0
for every layer; ``per_layer_inputs_for_plan`` finishes the back half's
layers' share for its rows only (the plan is made before the embedding for
that).

KV-cache writes are unchanged: the front half writes every token, the back half
writes nothing.
"""

from __future__ import annotations

import logging
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
    from sglang.srt.model_executor.runner.kv_shared_back_half_graph_runner import (
        KVSharedBackHalfGraphRunner,
    )
    from sglang.srt.model_executor.model_runner import ModelRunner

logger = logging.getLogger(__name__)


def first_kv_shared_layer(config) -> Optional[int]:
    """Index of the first KV-shared layer, or None when the model has none."""
    num_shared = getattr(config, "num_kv_shared_layers", 0) or 0
    if num_shared <= 0:
        return None
    return config.num_hidden_layers - num_shared


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
    """How one forward pass runs its back half. Exactly one of ``batch`` (eager,
    in ``attention``) and ``graphs`` is set, or neither when no request
    finishes in the pass."""

    rows: BackHalfRows
    attention: Optional[BackHalfAttention] = None
    # The back half's own batch (decode- or extend-shaped), whose metadata
    # ``attention`` holds: built before the front half is launched.
    batch: Optional[ForwardBatch] = None
    # The model's captured back half, which stages its rows from the pass's
    # batch (read only) when the back half starts (the host runs ahead of the
    # GPU there), not before layer 0.
    graphs: Optional[KVSharedBackHalfGraphRunner] = None
    pass_batch: Optional[ForwardBatch] = None

    @property
    def first_shared_layer(self) -> int:
        return self.rows.first_shared_layer

    @property
    def num_reqs(self) -> int:
        return self.rows.num_reqs


def fast_prefill_skip_reason(
    forward_batch: ForwardBatch,
    first_shared_layer: Optional[int],
    layers_to_capture: Sequence[int] = (),
    pp_size: int = 1,
    min_tokens: int = 0,
) -> Optional[str]:
    """None when YOCO may run this pass, else why the full computation is needed
    (or, below ``min_tokens`` new tokens, why it would not pay)."""
    if first_shared_layer is None:
        return "model has no KV-shared layers"
    # Exactly EXTEND: DECODE/MIXED/TARGET_VERIFY/DRAFT_EXTEND/SPLIT_PREFILL/IDLE/
    # DLLM either save nothing or need every token's output.
    if forward_batch.forward_mode != ForwardMode.EXTEND:
        return f"forward mode {forward_batch.forward_mode.name}"
    if pp_size > 1:
        return "pipeline parallelism"
    extend_lens = forward_batch.extend_seq_lens_cpu
    if extend_lens is None or not any(n > 1 for n in extend_lens):
        return "no request has more than one new token"
    # A small pass is bound by kernel launches: the back half launches as many
    # kernels on one row per request as on every row, plus its own setup.
    if sum(extend_lens) < min_tokens:
        return (
            f"fewer than {min_tokens} new tokens "
            "(--kv-sharing-fast-prefill-min-tokens)"
        )
    if forward_batch.return_logprob and forward_batch.extend_logprob_start_lens_cpu:
        for n, start in zip(extend_lens, forward_batch.extend_logprob_start_lens_cpu):
            if n - start > 0:
                return "input-token logprobs requested"
    mode = forward_batch.capture_hidden_mode
    if mode is not None and mode.is_full():
        return "full hidden-state capture"
    # A capture at index i stores the input of layer i: the front half's output
    # (i == first shared layer) is complete, anything later is not.
    if any(i > first_shared_layer for i in layers_to_capture):
        return "hidden-state capture inside the KV-shared layers"
    if forward_batch.return_pooled_hidden_states or forward_batch.dimensions:
        return "pooled/embedding output"
    if forward_batch.multi_item_delimiter_indices is not None:
        return "multi-item scoring"
    if forward_batch.input_embeds is not None and forward_batch.input_ids is None:
        return "input embeddings without ids"
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


def plan_fast_prefill(
    forward_batch: ForwardBatch,
    first_shared_layer: Optional[int],
    layers_to_capture: Sequence[int] = (),
    pp_size: int = 1,
    min_tokens: int = 0,
    attention: Optional[BackHalfAttention] = None,
    graphs: Optional[KVSharedBackHalfGraphRunner] = None,
) -> Optional[FastPrefillPlan]:
    """The back-half plan for this pass, or None to run every layer on every
    token. ``attention``: the model's back-half attention context (eager);
    ``graphs``: its captured back half, used when it holds the rows."""
    reason = fast_prefill_skip_reason(
        forward_batch, first_shared_layer, layers_to_capture, pp_size, min_tokens
    )
    if reason is not None:
        if first_shared_layer is not None and forward_batch.forward_mode.is_extend():
            logger.debug("KV-sharing fast prefill: full pass (%s)", reason)
        return None
    rows = back_half_rows(forward_batch, first_shared_layer)
    logger.debug(
        "KV-sharing fast prefill: back half on %d of %d tokens (%s)",
        rows.num_reqs,
        sum(forward_batch.extend_seq_lens_cpu),
        forward_batch.forward_mode.name,
    )
    if rows.num_reqs == 0:
        return FastPrefillPlan(rows)
    if graphs is not None and graphs.can_run(rows.num_reqs):
        # Captured only where the back half is decode-shaped.
        return FastPrefillPlan(rows, graphs=graphs, pass_batch=forward_batch)
    if attention is None:
        raise RuntimeError(
            "--kv-sharing-fast-prefill: the model's back-half attention was not "
            "set up (SupportsKVSharingFastPrefill.set_back_half_attention)"
        )
    return FastPrefillPlan(
        rows, attention=attention, batch=attention.prepare(forward_batch, rows)
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


def per_layer_inputs_for_plan(
    plan: FastPrefillPlan,
    projection: torch.Tensor,
    per_layer_inputs: Optional[torch.Tensor],
    combine: Callable,
) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Per-layer inputs (Gemma-4's, Gemma-3n's) for a fast-prefill pass: (the
    front layers' for every row, the back half's layers' for the plan's rows,
    or None).

    ``projection`` [tokens, layers, dim] is the model's projection GEMM as the
    full pass computes it (every row, every layer: a GEMM of another shape could
    round differently). ``combine`` is the model's rest: a scale, a norm over
    each ``dim``-wide vector, the sum with the token's own per-layer embedding
    (``per_layer_inputs``, same layout, or None). Each value of it depends only
    on its own vector, so it runs for the front layers on every row and for the
    back half's layers on the plan's rows only, with the full pass's bits."""
    first = plan.first_shared_layer
    front = combine(
        projection[:, :first],
        per_layer_inputs[:, :first] if per_layer_inputs is not None else None,
    )
    if not plan.num_reqs:
        return front, None
    rows = plan.rows.token_index
    back = combine(
        gather_rows(projection[:, first:], rows),
        (
            gather_rows(per_layer_inputs[:, first:], rows)
            if per_layer_inputs is not None
            else None
        ),
    )
    return front, back


def run_layers(
    layers,
    first_layer: int,
    end_layer: int,
    forward_batch: ForwardBatch,
    hidden_states: torch.Tensor,
    per_layer_inputs: Optional[torch.Tensor],
    layer_call: BackHalfLayerCall = DECODER_LAYER_CALL,
    **kwargs,
) -> torch.Tensor:
    """Layers [first_layer, end_layer) on these rows, as the back half runs them
    (``per_layer_inputs``: [rows, those layers, dim], or None)."""
    with layer_call.entering(forward_batch, hidden_states) as h:
        for layer_idx in range(first_layer, end_layer):
            h = layer_call.call(
                layers[layer_idx],
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


@dataclass(frozen=True)
class KVSharedBackHalf:
    """A model's KV-shared layers, as its back-half CUDA graphs capture them."""

    layers: Sequence[torch.nn.Module]
    first_layer: int
    end_layer: int
    hidden_size: int
    per_layer_input_dim: int  # 0: the layers take no per-layer input
    # Hidden-state streams per token: 0, rows are [tokens, hidden]; n, rows are
    # [n, tokens, hidden] (Gemma-3n's AltUp).
    streams: int = 0
    layer_call: BackHalfLayerCall = DECODER_LAYER_CALL

    @property
    def token_dim(self) -> int:
        return 1 if self.streams else 0

    def forward(self, forward_batch, hidden_states, per_layer_inputs):
        return run_layers(
            self.layers,
            self.first_layer,
            self.end_layer,
            forward_batch,
            hidden_states,
            per_layer_inputs,
            self.layer_call,
        )


class SupportsKVSharingFastPrefill:
    """A model whose prefill can run its KV-shared layers on each finishing
    request's last token only (--kv-sharing-fast-prefill). The model runner
    asks it for its back half and hands it the back half's attention context
    and, where captured, graphs."""

    def kv_shared_back_half(self) -> Optional[KVSharedBackHalf]:
        """Its KV-shared layers, or None where the fast prefill is off."""
        raise NotImplementedError

    def set_back_half_attention(self, attention: BackHalfAttention) -> None:
        raise NotImplementedError

    def set_back_half_graphs(
        self, graphs: Optional[KVSharedBackHalfGraphRunner]
    ) -> None:
        raise NotImplementedError


def run_back_half(
    layers,
    plan: FastPrefillPlan,
    end_layer: int,
    hidden_states: torch.Tensor,
    per_layer_inputs: Optional[torch.Tensor],
    token_dim: int = 0,
    layer_call: BackHalfLayerCall = DECODER_LAYER_CALL,
    **kwargs,
) -> torch.Tensor:
    """Run layers [first_shared_layer, end_layer) on the planned rows only,
    with the back half's per-layer inputs, and return ``hidden_states`` with
    those rows replaced along ``token_dim``. ``layer_call``: how the layers
    take the rows (as the model's ``KVSharedBackHalf`` declares it)."""
    if plan.num_reqs == 0:
        return hidden_states
    index = plan.rows.token_index
    if plan.graphs is not None:
        # Gathers straight into the graph's input buffer.
        h = plan.graphs.replay(
            plan.rows, plan.pass_batch, hidden_states, per_layer_inputs
        )
    else:
        with plan.attention.active():
            h = run_layers(
                layers,
                plan.first_shared_layer,
                end_layer,
                plan.batch,
                gather_rows(hidden_states, index, token_dim),
                per_layer_inputs,
                layer_call,
                **kwargs,
            )
    return scatter_rows(hidden_states, index, h, token_dim)
