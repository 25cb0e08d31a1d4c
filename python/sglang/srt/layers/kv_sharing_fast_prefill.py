"""KV-sharing fast prefill ("YOCO", You Only Cache Once).

Models such as Gemma-4 E2B/E4B end with KV-shared layers: they write no KV cache
and attend over the cache of an earlier layer. In a prefill, the only output of
those layers anybody reads is the last token of each request (it is sampled;
nothing else is cached). So the back half runs on one token per request:

  1. ``plan_fast_prefill`` decides per forward pass whether that is safe and
     useful, and picks the rows (last token of each request whose prefill ends
     in this pass; an unfinished chunk needs no back-half output at all).
  2. ``make_back_half_batch`` shapes the back half as one decode step per
     request (its query attends over the whole sequence, which the front half
     already cached), or as an extend of that one token where the backend's
     ``back_half_is_extend()`` says its decode kernel would round differently.
     The backend builds that metadata (``init_back_half_metadata``) before the
     front half is launched and makes it current for the KV-shared layers only
     (``use_back_half_metadata``); the pass's own metadata is left intact.
     Where the model captured its back half at start-up (triton with CUDA
     graphs, ``KVSharedBackHalfGraphRunner``), the decode-shaped step replays
     that graph instead; its rows and metadata (in the graph's own backend)
     are staged when the back half starts, not before layer 0.
  3. The model scatters the rows back, so the final norm, LogitsProcessor and
     LAST hidden capture see exactly what the full computation produces there.

Gemma-4's per-layer inputs (PLE) are computed before layer 0 for every layer;
``per_layer_inputs_for_plan`` finishes the back half's layers' share for its
rows only (the plan is made before the embedding for that).

KV-cache writes are unchanged: the front half writes every token, the back half
writes nothing.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence

import torch
from sglang.srt.layers.kv_sharing_fast_prefill_rows import (
    bind_back_half_batch,
    call_layer,
    rows_entering_layers,
)
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.forward_context import get_attn_backend

if TYPE_CHECKING:
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

logger = logging.getLogger(__name__)


def first_kv_shared_layer(config) -> Optional[int]:
    """Index of the first KV-shared layer, or None when the model has none."""
    num_shared = getattr(config, "num_kv_shared_layers", 0) or 0
    if num_shared <= 0:
        return None
    return config.num_hidden_layers - num_shared


@dataclass
class FastPrefillPlan:
    """What the back half of one forward pass runs on."""

    first_shared_layer: int
    # Rows (into the pass's token dimension) of the tokens the back half runs on.
    token_index: torch.Tensor
    # Requests (into the batch) those rows belong to, and their count.
    req_index: torch.Tensor
    num_reqs: int
    # Host copies, so building the back-half batch never syncs the device.
    seq_lens_cpu: List[int]
    # The pass's cached prefix of each kept request (where its keys start).
    prefix_lens_cpu: List[int]
    # The back-half batch (decode- or extend-shaped) and its attention
    # metadata, built before the front half is launched (eager back half).
    batch: Optional[ForwardBatch] = None
    back_metadata: Optional[dict] = None
    # The model's captured back half (KVSharedBackHalfGraphRunner) that runs
    # these rows, or None: eager, with back_metadata.
    graphs: Optional[object] = None
    # The pass's batch, from which the graphs stage their rows at back-half time.
    source: Optional[ForwardBatch] = None
    # Per-layer inputs (Gemma-4 PLE) of the back half's layers for its rows,
    # [num_reqs, layers from first_shared_layer, dim] (per_layer_inputs_for_plan).
    back_per_layer_inputs: Optional[torch.Tensor] = None


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


def plan_fast_prefill(
    forward_batch: ForwardBatch,
    first_shared_layer: Optional[int],
    layers_to_capture: Sequence[int] = (),
    pp_size: int = 1,
    min_tokens: int = 0,
    graphs=None,
) -> Optional[FastPrefillPlan]:
    """The back-half plan for this pass, or None to run every layer on every token.
    ``graphs``: the model's captured back half, used when it holds the rows."""
    reason = fast_prefill_skip_reason(
        forward_batch, first_shared_layer, layers_to_capture, pp_size, min_tokens
    )
    if reason is not None:
        if first_shared_layer is not None and forward_batch.forward_mode.is_extend():
            logger.debug("KV-sharing fast prefill: full pass (%s)", reason)
        return None
    seq_cpu = _seq_lens_cpu(forward_batch)
    extend_lens = forward_batch.extend_seq_lens_cpu
    reqs = _finishing_requests(forward_batch, seq_cpu)
    rows = last_token_rows(extend_lens, reqs)
    device = forward_batch.seq_lens.device
    logger.debug(
        "KV-sharing fast prefill: back half on %d of %d tokens (%s)",
        len(rows),
        sum(extend_lens),
        forward_batch.forward_mode.name,
    )
    plan = FastPrefillPlan(
        first_shared_layer=first_shared_layer,
        token_index=torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True),
        req_index=torch.tensor(reqs, dtype=torch.int64).to(device, non_blocking=True),
        num_reqs=len(reqs),
        seq_lens_cpu=[seq_cpu[i] for i in reqs],
        prefix_lens_cpu=[seq_cpu[i] - extend_lens[i] for i in reqs],
    )
    if plan.num_reqs > 0:
        backend = get_attn_backend()
        if graphs is not None and graphs.can_run(plan.num_reqs):
            # Captured only where the back half is decode-shaped. The graph
            # stages its rows and metadata when the back half starts, where the
            # host runs ahead of the GPU, not here, where layer 0 waits on it.
            plan.graphs, plan.source = graphs, forward_batch
            return plan
        plan.batch = make_back_half_batch(
            forward_batch, plan, backend, extend_shaped=backend.back_half_is_extend()
        )
        plan.back_metadata = backend.init_back_half_metadata(
            plan.batch, plan.prefix_lens_cpu
        )
    return plan


def make_back_half_batch(
    forward_batch: ForwardBatch,
    plan: FastPrefillPlan,
    backend,
    extend_shaped: bool = False,
) -> ForwardBatch:
    """A shallow copy of the batch shaped as one decode step per kept request.

    The back half attends from each request's last token over its whole
    sequence, already cached by the front half: exactly a decode step with no
    KV write, so decode metadata (split-KV kernels) serves it. With
    ``extend_shaped``, an extend of that one token over a cached prefix of
    seq_len - 1 instead (same attention, extend kernels)."""
    ridx, rows = plan.req_index, plan.token_index
    fb = copy.copy(forward_batch)
    fb.forward_mode = ForwardMode.EXTEND if extend_shaped else ForwardMode.DECODE
    fb.batch_size = plan.num_reqs
    fb.req_pool_indices = forward_batch.req_pool_indices.index_select(0, ridx)
    fb.seq_lens = forward_batch.seq_lens.index_select(0, ridx)
    fb.seq_lens_cpu = torch.tensor(plan.seq_lens_cpu, dtype=torch.int64)
    fb.seq_lens_sum = sum(plan.seq_lens_cpu)
    if forward_batch.orig_seq_lens is not None:
        fb.orig_seq_lens = forward_batch.orig_seq_lens.index_select(0, ridx)
    fb.orig_seq_lens_cpu = None  # the pass's requests, not the kept ones
    fb.out_cache_loc = forward_batch.out_cache_loc.index_select(0, rows)
    fb.positions = forward_batch.positions.index_select(0, rows)
    if forward_batch.input_ids is not None:
        fb.input_ids = forward_batch.input_ids.index_select(0, rows)
    fb.extend_num_tokens = None
    fb.extend_seq_lens = fb.extend_prefix_lens = fb.extend_start_loc = None
    fb.extend_seq_lens_cpu = fb.extend_prefix_lens_cpu = None
    fb.extend_logprob_start_lens_cpu = None
    fb.spec_info = None
    fb.return_logprob = False
    fb._attn_output = None  # sized for the full pass
    if extend_shaped:
        n = plan.num_reqs
        lens = forward_batch.extend_seq_lens
        fb.extend_num_tokens = n
        fb.extend_seq_lens = torch.ones(n, dtype=lens.dtype, device=lens.device)
        fb.extend_prefix_lens = (fb.seq_lens - 1).to(lens.dtype)
        fb.extend_start_loc = torch.arange(n, dtype=lens.dtype, device=lens.device)
        fb.extend_seq_lens_cpu = [1] * n
        fb.extend_prefix_lens_cpu = [s - 1 for s in plan.seq_lens_cpu]
    bind_back_half_batch(backend, fb)
    return fb


def per_layer_inputs_for_plan(
    plan: FastPrefillPlan,
    projection: torch.Tensor,
    per_layer_inputs: Optional[torch.Tensor],
    combine: Callable,
) -> torch.Tensor:
    """Gemma-4's per-layer inputs for a fast-prefill pass.

    ``projection`` [tokens, layers, dim] is the model's projection GEMM as the
    full pass computes it (every row, every layer: a GEMM of another shape could
    round differently). ``combine`` is the model's rest: a scale, a norm over
    each ``dim``-wide vector, the sum with the token's own per-layer embedding
    (``per_layer_inputs``, same layout, or None). Each value of it depends only
    on its own vector, so it runs for the front layers on every row and for the
    back half's layers on the plan's rows only, with the full pass's bits.
    Returns the front layers' inputs; the back half's go to the plan."""
    first = plan.first_shared_layer
    front = combine(
        projection[:, :first],
        per_layer_inputs[:, :first] if per_layer_inputs is not None else None,
    )
    if plan.num_reqs:
        rows = plan.token_index
        plan.back_per_layer_inputs = combine(
            projection[:, first:].index_select(0, rows),
            (
                per_layer_inputs[:, first:].index_select(0, rows)
                if per_layer_inputs is not None
                else None
            ),
        )
    return front


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
    with rows_entering_layers(forward_batch, hidden_states) as h:
        for layer_idx in range(first_layer, end_layer):
            h = call_layer(
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


@dataclass
class KVSharedBackHalf:
    """A model's KV-shared layers, as its back-half CUDA graphs capture them."""

    layers: Sequence[torch.nn.Module]
    first_layer: int
    end_layer: int
    hidden_size: int
    per_layer_input_dim: int  # 0: the layers take no per-layer input

    def forward(self, forward_batch, hidden_states, per_layer_inputs):
        return run_layers(
            self.layers,
            self.first_layer,
            self.end_layer,
            forward_batch,
            hidden_states,
            per_layer_inputs,
        )


def run_back_half(
    layers,
    plan: FastPrefillPlan,
    end_layer: int,
    hidden_states: torch.Tensor,
    **kwargs,
) -> torch.Tensor:
    """Run layers [first_shared_layer, end_layer) on the planned rows only, with
    the plan's batch (positions, metadata) and per-layer inputs, and return
    ``hidden_states`` with those rows replaced (out of place: the input may also
    be a captured aux hidden state)."""
    if plan.num_reqs == 0:
        return hidden_states
    rows = plan.token_index
    if plan.graphs is not None:
        if not kwargs:
            h = plan.graphs.replay(plan, hidden_states)
            return hidden_states.index_copy(0, rows, h)
        # The graphs were captured without these layer arguments: run eager.
        backend = get_attn_backend()
        plan.batch = make_back_half_batch(plan.source, plan, backend)
        plan.back_metadata = backend.init_back_half_metadata(
            plan.batch, plan.prefix_lens_cpu
        )
    with get_attn_backend().use_back_half_metadata(plan.back_metadata):
        h = run_layers(
            layers,
            plan.first_shared_layer,
            end_layer,
            plan.batch,
            hidden_states.index_select(0, rows),
            plan.back_per_layer_inputs,
            **kwargs,
        )
    return hidden_states.index_copy(0, rows, h)
