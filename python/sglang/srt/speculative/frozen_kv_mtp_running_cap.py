"""The running-request cap under FROZEN_KV_MTP, derived from the KV budget.

Stock fixes the cap at 48 for every speculative algorithm. On a hybrid sliding-window
model with the radix cache off, ``SWAChunkCapPoolConfigurator`` sizes the SWA pool from
that cap (each request reserves window + eviction interval x draft tokens + page +
decode allocation), so a large model's 48 reservations can exceed the whole KV budget
and the engine does not start, while a small model is held to 48 requests its memory
could multiply.

Here the cap is the largest number of requests whose sliding-window footprint both pools
hold, as stock's configurators size them for that cap, and at most the decode CUDA-graph
max batch size (``mem_fraction_static`` reserved graph memory for that many; the draft
and verify graphs are captured up to it). A cap the user sets is refused when the SWA
pool it reserves leaves the full pool unable to hold that many footprints.

The sizing is pure (``PoolShape``, ``largest_cap``, ``derive_cap``, ``check_user_cap``);
``resolve_running_cap`` reads a ``KVCacheConfigurator`` and applies the result.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

logger = logging.getLogger(__name__)

GIB = 1 << 30


def _ceil_align(x: int, a: int) -> int:
    return (x + a - 1) // a * a


@dataclass(frozen=True)
class PoolShape:
    """What the full and SWA pools cost, per token and per request."""

    full_bytes_per_token: int  # K+V of one token over every full-attention layer
    swa_bytes_per_token: int  # the same over every sliding-window layer
    window: int
    page_size: int
    draft_tokens: int
    decode_alloc: int  # KV tokens a decode round keeps allocated per request
    eviction_interval: int = 128  # SGLANG_SWA_EVICTION_INTERVAL
    # True: the SWA pool is sized from the cap (radix cache off, chunked prefill on);
    # False: both pools split the budget by swa_full_tokens_ratio, whatever the cap.
    swa_from_cap: bool = True
    # SWA tokens reserved besides the requests: prefill chunks in flight + one page
    # (PD decode: the transfer slots' windows).
    fixed_swa_tokens: int = 0
    swa_full_tokens_ratio: float = 0.8
    max_total_tokens: Optional[int] = None  # --max-total-tokens: the full pool's ceiling

    @property
    def swa_tokens_per_request(self) -> int:
        # SWAChunkCapPoolConfigurator: [padding][eviction interval][window] + decode.
        return (
            self.window
            + self.eviction_interval * self.draft_tokens
            + self.page_size
            + self.decode_alloc
        )


def pool_tokens(shape: PoolShape, budget_bytes: int, num_reqs: int) -> tuple[int, int]:
    """(full, swa) pool tokens stock's configurator gives ``num_reqs`` requests."""
    p = shape.page_size
    limit = shape.max_total_tokens
    if shape.swa_from_cap:
        swa = _ceil_align(num_reqs * shape.swa_tokens_per_request + shape.fixed_swa_tokens, p)
        rest = budget_bytes - swa * shape.swa_bytes_per_token
        full = int(rest // shape.full_bytes_per_token) // p * p if rest > 0 else 0
        if limit is not None and 0 < limit < full:
            # calculate_pool_sizes_from_max_tokens: the SWA pool keeps its cap, clipped.
            return limit // p * p, min(swa, limit)
        return max(full, 0), swa
    cell = shape.full_bytes_per_token + shape.swa_full_tokens_ratio * shape.swa_bytes_per_token
    full = int(budget_bytes // cell)
    if limit is not None:
        full = min(full, limit)
    full = full // p * p
    swa = int(full * shape.swa_full_tokens_ratio) // p * p
    return full, swa


def holds(shape: PoolShape, budget_bytes: int, num_reqs: int) -> bool:
    """Both pools hold ``num_reqs`` requests, each at its sliding-window footprint."""
    full, swa = pool_tokens(shape, budget_bytes, num_reqs)
    need = num_reqs * shape.swa_tokens_per_request
    return full > 0 and full >= need and swa >= need


def largest_cap(shape: PoolShape, budget_bytes: int) -> int:
    """The most requests ``holds`` allows (0: not even one)."""
    per_req = shape.swa_tokens_per_request * (
        shape.full_bytes_per_token + shape.swa_bytes_per_token * min(1.0, shape.swa_full_tokens_ratio)
    )
    lo, hi = 0, int(budget_bytes // max(per_req, 1)) + 2
    while lo < hi:  # holds() is monotone: more requests never fit better
        mid = (lo + hi + 1) // 2
        if holds(shape, budget_bytes, mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


@dataclass(frozen=True)
class CapDecision:
    cap: int  # per attention-DP worker
    fits: int  # what the memory holds
    graph_max_bs: int
    full_tokens: int
    swa_tokens: int
    reason: str


def _fix_hint() -> str:
    return (
        "raise --mem-fraction-static, lower SGLANG_SWA_EVICTION_INTERVAL, or keep the "
        "radix cache on (no --disable-radix-cache: the SWA pool is then not sized per request)"
    )


def _footprint(shape: PoolShape) -> str:
    return (
        f"{shape.swa_tokens_per_request} tokens a request (window {shape.window} + "
        f"eviction interval {shape.eviction_interval} x {shape.draft_tokens} draft tokens + "
        f"page {shape.page_size} + decode {shape.decode_alloc})"
    )


def derive_cap(shape: PoolShape, budget_bytes: int, graph_max_bs: int) -> CapDecision:
    """The default cap: what the budget holds, at most the decode CUDA-graph max batch."""
    fits = largest_cap(shape, budget_bytes)
    if fits < 1:
        raise RuntimeError(
            f"FROZEN_KV_MTP: the KV budget of {budget_bytes / GIB:.2f} GiB holds no request: "
            f"each needs {_footprint(shape)} in the sliding-window pool and as many in the "
            f"full pool, and the sliding-window pool also reserves {shape.fixed_swa_tokens} "
            f"tokens for prefill chunks in flight (--chunked-prefill-size). To fix: "
            f"{_fix_hint()}, or lower --chunked-prefill-size."
        )
    cap = min(fits, graph_max_bs)
    full, swa = pool_tokens(shape, budget_bytes, cap)
    why = (
        f"the decode CUDA-graph max batch size (the memory holds {fits})"
        if cap < fits
        else f"what the {budget_bytes / GIB:.2f} GiB KV budget holds"
    )
    pools = (
        "SWA pool sized per request"
        if shape.swa_from_cap
        else f"pools split by --swa-full-tokens-ratio {shape.swa_full_tokens_ratio}"
    )
    reason = (
        f"{why}: at page size {shape.page_size} and {shape.draft_tokens} draft tokens a "
        f"request's sliding-window footprint is {_footprint(shape)}; {pools}, {cap} requests "
        f"leave full={full} and swa={swa} tokens"
    )
    return CapDecision(cap, fits, graph_max_bs, full, swa, reason)


def check_user_cap(shape: PoolShape, budget_bytes: int, cap: int) -> None:
    """Refuse a cap whose SWA reservation leaves the full pool too small for it.

    Only where the SWA pool is sized from the cap; elsewhere the cap costs no KV memory
    and stock's scheduler admits by free tokens.
    """
    if not shape.swa_from_cap or holds(shape, budget_bytes, cap):
        return
    fits = largest_cap(shape, budget_bytes)
    full, swa = pool_tokens(shape, budget_bytes, cap)
    raise ValueError(
        f"--max-running-requests {cap} does not fit FROZEN_KV_MTP's KV budget of "
        f"{budget_bytes / GIB:.2f} GiB: with the radix cache off the sliding-window pool "
        f"reserves {_footprint(shape)} and {shape.fixed_swa_tokens} for prefill chunks, "
        f"{swa} tokens "
        f"({swa * shape.swa_bytes_per_token / GIB:.2f} GiB) for {cap} requests, which leaves "
        f"the full pool {full} tokens, fewer than the {cap * shape.swa_tokens_per_request} "
        f"they need. The largest cap that fits is {fits}: set --max-running-requests {fits} "
        f"or leave it unset (derived at start-up), or {_fix_hint()}."
    )


def bytes_per_token_from_text_config(cfg: dict, kv_bytes: int = 2, tp: int = 1) -> tuple[int, int]:
    """(full, swa) bytes a token costs over all layers, from a Gemma-4 text config dict,
    as ``HybridSWAPoolConfigurator`` counts them (every layer, K and V)."""
    cfg = cfg.get("text_config", cfg)
    types = cfg["layer_types"]
    swa_heads = max(1, cfg["num_key_value_heads"] // tp)
    full_heads = max(1, (cfg.get("num_global_key_value_heads") or cfg["num_key_value_heads"]) // tp)
    swa_dim = cfg["head_dim"]
    full_dim = cfg.get("global_head_dim") or swa_dim
    full = types.count("full_attention") * full_heads * 2 * full_dim * kv_bytes
    swa = types.count("sliding_attention") * swa_heads * 2 * swa_dim * kv_bytes
    return full, swa


# ----------------------------------------------------------------------------- engine glue


def _shape_from_configurator(kvc) -> Optional[PoolShape]:
    from sglang.srt.environ import envs
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_len_per_decode
    from sglang.srt.model_executor.pool_configurator import HybridSWAPoolConfigurator
    from sglang.srt.utils.common import spec_decode_alloc_len_per_request

    if not kvc.is_hybrid_swa or kvc.sliding_window_size is None:
        return None
    if len(kvc.model_config.full_attention_layer_ids) == 0:
        return None
    sa = kvc.server_args
    base = HybridSWAPoolConfigurator(kvc)
    if sa.disable_overlap_schedule:
        decode_alloc = spec_decode_alloc_len_per_request(sa)
    else:
        decode_alloc = 2 * get_alloc_len_per_decode(sa)
    page = kvc.page_size
    swa_from_cap = bool(sa.disable_radix_cache) and sa.chunked_prefill_size is not None
    if sa.disaggregation_mode == "decode":
        fixed = (kvc.sliding_window_size + page) * (sa.disaggregation_decode_extra_slots or 0)
    else:
        chunks_in_flight = 1 if sa.disable_overlap_schedule else 2
        fixed = chunks_in_flight * sa.chunked_prefill_size + page if swa_from_cap else 0
    return PoolShape(
        full_bytes_per_token=base._full_per_token
        * (base._full_layers_num + base._draft_full_layers_num)
        + base._swa_per_token * base._draft_swa_full_layers_num,
        swa_bytes_per_token=base._swa_per_token * base._swa_layers_num,
        window=kvc.sliding_window_size,
        page_size=page,
        draft_tokens=sa.speculative_num_draft_tokens or 1,
        decode_alloc=decode_alloc,
        eviction_interval=max(1, envs.SGLANG_SWA_EVICTION_INTERVAL.get()),
        swa_from_cap=swa_from_cap,
        fixed_swa_tokens=fixed,
        swa_full_tokens_ratio=sa.swa_full_tokens_ratio,
        max_total_tokens=sa.max_total_tokens,
    )


def resolve_running_cap(kvc, available_bytes: int) -> None:
    """Set (unset cap) or check (user's cap) max_running_requests under FROZEN_KV_MTP,
    before the pools are sized. The speculative hook leaves the cap unset for this."""
    from sglang.srt.runtime_context import get_context, get_schedule

    if kvc.is_draft_worker or not kvc.spec_algorithm.is_frozen_kv_mtp():
        return
    shape = _shape_from_configurator(kvc)
    requested = get_schedule().max_running_requests
    dp = kvc.ps.attn_dp_size
    if shape is None:
        return
    if requested is not None:
        check_user_cap(shape, available_bytes, requested // dp)
        return
    graph_max_bs = kvc.server_args.cuda_graph_config.decode.max_bs or 48
    decision = derive_cap(shape, available_bytes, graph_max_bs)
    cap = decision.cap * dp
    logger.info(
        "FROZEN_KV_MTP: max_running_requests=%d, %s. --max-running-requests overrides it.",
        cap,
        decision.reason,
    )
    # The SWA-cap configurator reads server_args; the request pool reads the schedule.
    kvc.server_args.override("frozen_kv_mtp_running_cap", max_running_requests=cap)
    get_context().override("frozen_kv_mtp_running_cap", max_running_requests=cap)
