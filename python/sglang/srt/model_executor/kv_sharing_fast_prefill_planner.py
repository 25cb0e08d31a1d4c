"""The model runner's part of --kv-sharing-fast-prefill (YOCO).

The model declares its KV-shared back half (``layers/kv_sharing_fast_prefill.py``),
a pass runs it by a plan (``kv_sharing_fast_prefill_plan.py``); everything else is
resolved here, once, at start-up: the back half's attention
context, its CUDA graphs, the min-tokens threshold. Each forward pass is then
planned before the model runs, and the plan published on the pass's
``ForwardBatch.fast_prefill``, where the model's one call at the split finds it.

Every prefill pass is counted, by the path it took: the fast path, or the full
computation and why (``SKIP_REASONS``). The counts are in the scheduler's
internal state and, with --enable-metrics, in Prometheus as
``sglang:kv_sharing_fast_prefill_passes_total{path, reason}``.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, Optional

from sglang.srt.layers.kv_sharing_fast_prefill import (
    KVSharedBackHalf,
    find_kv_shared_back_half,
)
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.kv_sharing_fast_prefill_plan import (
    SKIP_REASONS,
    BackHalfAttention,
    EagerBackHalfPlan,
    FastPrefillPlan,
    FrontOnlyPlan,
    back_half_rows,
    fast_prefill_skip_reason,
)
from sglang.srt.model_executor.runner.kv_shared_back_half_graph_runner import (
    KVSharedBackHalfGraphRunner,
)
from sglang.srt.runtime_context import (
    get_exec,
    get_observability,
    get_parallel,
    get_serving,
)

# The model runner, by its role: it imports this module.
ModelRunner = Any

logger = logging.getLogger(__name__)

# The passes counted: those that prefill (MIXED adds decode rows to one).
_PREFILL_MODES = (ForwardMode.EXTEND, ForwardMode.MIXED, ForwardMode.SPLIT_PREFILL)

_PROMETHEUS_COUNTER = None


def _prometheus_counter():
    """One counter per process (a second registration of the name would fail)."""
    global _PROMETHEUS_COUNTER
    if _PROMETHEUS_COUNTER is None:
        from prometheus_client import Counter as PrometheusCounter

        _PROMETHEUS_COUNTER = PrometheusCounter(
            name="sglang:kv_sharing_fast_prefill_passes_total",
            documentation="Prefill passes by the path they took with "
            "--kv-sharing-fast-prefill: fast (the KV-shared layers on the last "
            "tokens only) or full, with the reason.",
            labelnames=["model_name", "path", "reason"],
        )
    return _PROMETHEUS_COUNTER


@dataclass(frozen=True)
class FastPrefillSettings:
    """--kv-sharing-fast-prefill as start-up resolved it (kv_sharing_fast_prefill_hook,
    once, into the flag's own fields), read once by the planner."""

    min_tokens: int  # passes of fewer new tokens run in full
    back_half_graphs: bool = False  # the back half replays CUDA graphs, else eager

    @classmethod
    def resolved(cls) -> FastPrefillSettings:
        features = get_exec().features
        return cls(
            features.kv_sharing_fast_prefill_min_tokens,
            features.kv_sharing_fast_prefill_back_half_graphs,
        )


class KVSharingFastPrefillPlanner:
    """Plans each forward pass of a model that declares a KV-shared back half."""

    def __init__(
        self,
        model: object,
        back_half: KVSharedBackHalf,
        attention: BackHalfAttention,
        settings: FastPrefillSettings,
        pp_size: int = 1,
        metrics_model_name: Optional[str] = None,
    ):
        self.model = model  # the module that declared the back half
        self.back_half = back_half
        self.attention = attention
        self.settings = settings
        self.pp_size = pp_size
        self.graphs = None  # the back half's CUDA graphs, where captured
        self.passes: Counter = Counter()
        # Counted into Prometheus by one rank per model (None: not at all).
        self._metrics_model_name = metrics_model_name

    @classmethod
    def for_model_runner(
        cls, model_runner: ModelRunner
    ) -> Optional[KVSharingFastPrefillPlanner]:
        """The planner of a target model runner with the flag on and a model
        that declares a back half, else None. A draft worker's passes are
        drafts (never a plain prefill): it plans nothing."""
        features = get_exec().features
        if not features.kv_sharing_fast_prefill or model_runner.is_draft_worker:
            return None
        found = find_kv_shared_back_half(model_runner.model)
        if found is None:
            return None
        model, back_half = found
        parallel = get_parallel()
        count_metrics = get_observability().enable_metrics and parallel.tp_rank == 0
        return cls(
            model,
            back_half,
            BackHalfAttention.for_model_runner(model_runner),
            FastPrefillSettings.resolved(),
            parallel.pp_size,
            get_serving().served_model_name if count_metrics else None,
        )

    def capture_graphs(self, model_runner: ModelRunner) -> None:
        """Capture the back half in CUDA graphs where start-up decided so (the
        decision that also resolved the min-tokens)."""
        if self.settings.back_half_graphs:
            self.graphs = KVSharedBackHalfGraphRunner.capture_for(
                model_runner, self.back_half, self.attention
            )

    def plan(self, forward_batch: ForwardBatch) -> Optional[FastPrefillPlan]:
        """How this pass runs the back half, or None to run every layer on
        every token."""
        reason = fast_prefill_skip_reason(
            forward_batch,
            self.back_half.first_layer,
            getattr(self.model, "layers_to_capture", ()),
            self.pp_size,
            self.settings.min_tokens,
        )
        if reason is not None:
            if forward_batch.forward_mode in _PREFILL_MODES:
                self._count("full", reason)
                logger.debug(
                    "KV-sharing fast prefill: full pass (%s)", SKIP_REASONS[reason]
                )
            return None
        rows = back_half_rows(forward_batch, self.back_half.first_layer)
        # A pass whose only request is an unfinished chunk runs no back half.
        self._count("fast", "" if rows.num_reqs else "chunk_only")
        logger.debug(
            "KV-sharing fast prefill: back half on %d of %d tokens",
            rows.num_reqs,
            sum(forward_batch.extend_seq_lens_cpu),
        )
        if rows.num_reqs == 0:
            return FrontOnlyPlan(rows, self.back_half)
        if self.graphs is not None and self.graphs.can_run(rows.num_reqs):
            return self.graphs.plan(rows, forward_batch)
        return EagerBackHalfPlan(
            rows,
            self.back_half,
            self.attention,
            self.attention.prepare(forward_batch, rows),
        )

    def _count(self, path: str, reason: str) -> None:
        self.passes[f"{path}:{reason}" if reason else path] += 1
        if self._metrics_model_name is not None:
            _prometheus_counter().labels(
                model_name=self._metrics_model_name, path=path, reason=reason
            ).inc()

    def pass_counts(self) -> Dict[str, int]:
        """Prefill passes so far, by path: "fast", "fast:chunk_only" (no
        request finished) or "full:<reason>" (a key of SKIP_REASONS)."""
        return dict(self.passes)
