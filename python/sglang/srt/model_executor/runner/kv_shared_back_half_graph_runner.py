"""CUDA graphs for the KV-shared back half of --kv-sharing-fast-prefill (YOCO).

The back half runs a model's KV-shared layers (20 on Gemma-4 E2B, 18 on E4B)
on one row per request whose prefill ends in the pass: a handful of rows and
about 25 small kernels per layer. Eager, its launches cost more than its
arithmetic, and on passes of up to about 8k tokens the front half's GPU work is
too short to hide them. So, as decode does, the back half is captured once per
batch size at start-up and replayed.

A graph runs the step the eager back half runs
(``kv_sharing_fast_prefill_plan.make_back_half_batch``): one query per request over
its whole cached sequence, no KV write, in the same attention context
(``BackHalfAttention``: the back half's own backend), here with that backend's
CUDA-graph buffers, so neither the pass's metadata nor the decode graphs'
buffers are written; its decode metadata keeps the W + 1 sliding-window keys
that the pass's extend kernel lets the token attend.

Start-up decides whether to capture (the server-argument hook, which also
resolves the min-tokens from it); the model runner's planner captures and
plans passes on the graphs (``GraphBackHalfPlan``). This is not a
``BaseCudaGraphRunner``: that base drives a whole model forward over its input
buffers, this a slice of layers over hidden-state rows; it reuses the base's
helpers (bucket padding, GC freezing, ``graph_capture``). Its graph pool is its
own, not the global one of ``FullCudaGraphBackend``: it replays inside a
prefill forward, where a decode graph's output in that pool may still be
waiting to be read.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Optional

import torch
from sglang.srt.layers.kv_sharing_fast_prefill import KVSharedBackHalf
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.kv_sharing_fast_prefill_plan import (
    BackHalfAttention,
    BackHalfRows,
    FastPrefillPlan,
)
from sglang.srt.model_executor.kv_sharing_fast_prefill_release import (
    bind_back_half_batch,
)
from sglang.srt.model_executor.runner.base_cuda_graph_runner import (
    BaseCudaGraphRunner,
    freeze_gc,
    get_batch_sizes_to_capture,
)

# The model runner, by its role: it imports the planner, which imports this.
ModelRunner = Any

logger = logging.getLogger(__name__)

# Largest number of finishing requests per prefill pass that replays a graph (a
# pass with more runs the back half eager). Each batch size of the graph
# backend's buffers costs an index row of the whole context length.
MAX_BS = 64


def capture_batch_sizes(decode_bs: List[int]) -> List[int]:
    """The batch sizes the back half is captured at: the decode graphs' up to
    MAX_BS. Start-up captures the back half only where there is one
    (``back_half_graph_skip_reason``), and else runs it eager."""
    return sorted(bs for bs in decode_bs or () if bs <= MAX_BS)


class KVSharedBackHalfGraphRunner:
    """A model's KV-shared back half, captured at the decode graphs' batch sizes
    up to MAX_BS."""

    def __init__(
        self,
        back_half: KVSharedBackHalf,
        attention: BackHalfAttention,
        capture_bs: List[int],
        dtype: torch.dtype,
        device,
    ):
        self.back_half = back_half
        self.first, self.end = back_half.first_layer, back_half.end_layer
        self.capture_bs = sorted(capture_bs)
        self.max_bs = self.capture_bs[-1]
        self.attention = attention
        backend = self.backend = attention.backend
        n, dev = self.max_bs, device
        # The rows as the layers take them: [n, hidden], or [streams, n, hidden].
        self.token_dim = back_half.token_dim
        streams = (back_half.streams,) if back_half.streams else ()
        self.hidden = torch.zeros(
            *streams, n, back_half.hidden_size, dtype=dtype, device=dev
        )
        dim = back_half.per_layer_input_dim
        self.ple = (
            torch.zeros(n, self.end - self.first, dim, dtype=dtype, device=dev)
            if dim
            else None
        )
        i64 = dict(dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, **i64)
        self.req_pool_indices = torch.zeros(n, **i64)
        self.seq_len_fill = backend.get_cuda_graph_seq_len_fill_value()
        self.seq_lens = torch.full((n,), self.seq_len_fill, **i64)
        self.out_cache_loc = torch.zeros(n, **i64)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.batches: Dict[int, ForwardBatch] = {}

    @classmethod
    def capture_for(
        cls,
        model_runner: ModelRunner,
        back_half: KVSharedBackHalf,
        attention: BackHalfAttention,
    ) -> KVSharedBackHalfGraphRunner:
        """The back half captured in ``attention`` (its backend is triton)."""
        # The decode graphs' sizes as the model runner captures them (within
        # the request pool, which adds its own size where it is the smaller).
        capture_bs = capture_batch_sizes(get_batch_sizes_to_capture(model_runner)[0])
        if not capture_bs:
            raise RuntimeError(
                "--kv-sharing-fast-prefill: no decode CUDA graph batch size up to "
                f"{MAX_BS} is left to capture the back half at; give --cuda-graph-bs "
                "a smaller size, or set SGLANG_KV_SHARING_FAST_PREFILL_GRAPH=0 to "
                "run it eager."
            )
        attention.backend.init_cuda_graph_state(max(capture_bs), max(capture_bs))
        runner = cls(
            back_half, attention, capture_bs, model_runner.dtype, model_runner.device
        )
        runner.capture(model_runner.server_args.enable_cudagraph_gc)
        logger.info(
            "KV-sharing fast prefill: back half (layers %d-%d) captured for batch "
            "sizes %s",
            runner.first,
            runner.end - 1,
            runner.capture_bs,
        )
        return runner

    def _batch(self, bs: int) -> ForwardBatch:
        return ForwardBatch(
            forward_mode=ForwardMode.DECODE,
            batch_size=bs,
            input_ids=self.positions[:bs],  # never read: the rows are hidden states
            req_pool_indices=self.req_pool_indices[:bs],
            seq_lens=self.seq_lens[:bs],
            out_cache_loc=self.out_cache_loc[:bs],
            seq_lens_sum=bs * self.seq_len_fill,
            seq_lens_cpu=torch.full((bs,), self.seq_len_fill, dtype=torch.int64),
            positions=self.positions[:bs],
        )

    def _rows(self, t: torch.Tensor, n: int) -> torch.Tensor:
        """The first ``n`` rows of a buffer laid out as the hidden states."""
        return t.narrow(self.token_dim, 0, n)

    def _forward(self, bs: int, fb: ForwardBatch) -> torch.Tensor:
        ple = self.ple[:bs] if self.ple is not None else None
        return self.back_half.forward(fb, self._rows(self.hidden, bs), ple)

    def capture(self, enable_cudagraph_gc: bool = False) -> None:
        from sglang.srt.distributed.parallel_state import graph_capture

        # A pool of its own (a few MB): see the module docstring.
        pool = torch.cuda.graph_pool_handle()
        with torch.no_grad(), freeze_gc(enable_cudagraph_gc), graph_capture() as gc:
            with self.attention.active():
                # Large first: the small ones reuse its memory.
                for bs in reversed(self.capture_bs):
                    fb = self._batch(bs)
                    bind_back_half_batch(self.backend, fb)
                    self.backend.init_forward_metadata_out_graph(fb, in_capture=True)
                    for _ in range(2):  # autotune / allocate off the graph
                        self._forward(bs, fb)
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=pool, stream=gc.stream):
                        self.outputs[bs] = self._forward(bs, fb)
                    self.graphs[bs] = graph
                    self.batches[bs] = fb
        torch.cuda.synchronize()

    def can_run(self, num_reqs: int) -> bool:
        return num_reqs <= self.max_bs

    def plan(self, rows: BackHalfRows, src: ForwardBatch) -> GraphBackHalfPlan:
        """A plan on ``rows`` of pass ``src`` (read only). Stages now, before
        the front half is launched, what the rows' geometry decides: the
        graph's position, slot, length and cache-location buffers and its
        backend's metadata. The back half then only gathers its hidden rows
        and replays. The staged buffers hold one plan: the model runner runs
        each pass's plan before it plans the next."""
        n = rows.num_reqs
        bs = BaseCudaGraphRunner._pad_to_bucket(n, self.capture_bs)
        tokens, reqs = rows.token_index, rows.req_index
        # Each kept request's last token: a decode step's geometry.
        self.positions[:n].copy_(src.positions.index_select(0, tokens))
        self.req_pool_indices[:n].copy_(src.req_pool_indices.index_select(0, reqs))
        self.seq_lens[:n].copy_(src.seq_lens.index_select(0, reqs))
        self.out_cache_loc[:n].copy_(src.out_cache_loc.index_select(0, tokens))
        pad = bs - n
        if pad:  # padding rows: a one-token sequence of request slot 0
            self.req_pool_indices[n:bs].zero_()
            self.seq_lens[n:bs].fill_(self.seq_len_fill)
            self.positions[n:bs].zero_()
        fb = self.batches[bs]
        seq_cpu: List[int] = list(rows.seq_lens_cpu) + [self.seq_len_fill] * pad
        fb.seq_lens_sum = sum(seq_cpu)
        fb.seq_lens_cpu = torch.tensor(seq_cpu, dtype=torch.int64)
        bind_back_half_batch(self.backend, fb)  # this pass's rows
        self.backend.init_forward_metadata_out_graph(fb, in_capture=False)
        return GraphBackHalfPlan(rows, self.back_half, self, bs)

    def replay(
        self,
        bs: int,
        rows: BackHalfRows,
        hidden_states: torch.Tensor,
        per_layer_inputs: Optional[torch.Tensor],
    ) -> torch.Tensor:
        """The back half on ``rows`` (``hidden_states``: the pass's;
        ``per_layer_inputs``: the rows') by the graph of size ``bs``, staged by
        ``plan``. Only this runner's buffers are written."""
        n = rows.num_reqs
        if self.token_dim == 0:
            torch.index_select(hidden_states, 0, rows.token_index, out=self.hidden[:n])
        else:  # the buffer's first n rows of each stream are not contiguous
            self._rows(self.hidden, n).copy_(
                hidden_states.index_select(self.token_dim, rows.token_index)
            )
        if self.ple is not None:
            self.ple[:n].copy_(per_layer_inputs)
        self.graphs[bs].replay()
        return self._rows(self.outputs[bs], n)


@dataclass(frozen=True)
class GraphBackHalfPlan(FastPrefillPlan):
    """The back half replayed from ``graphs`` at batch size ``bs``, its
    geometry and metadata staged when the pass was planned."""

    graphs: KVSharedBackHalfGraphRunner
    bs: int

    def _back_half(self, forward_batch, hidden_states, per_layer_inputs):
        return self.graphs.replay(self.bs, self.rows, hidden_states, per_layer_inputs)
