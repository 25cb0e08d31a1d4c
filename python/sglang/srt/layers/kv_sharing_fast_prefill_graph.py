"""CUDA graphs for the back half of KV-sharing fast prefill (YOCO).

The back half runs the KV-shared layers (20 on E2B, 18 on E4B) on one row per
request: a handful of rows and about 25 small kernels per layer. Eager, its
launches cost more than its arithmetic, and on passes of up to about 8k tokens
the front half's GPU work is too short to hide them. So, as decode does, the
back half is captured once per batch-size bucket at start-up and replayed.

A graph runs the same step as the eager back half
(``kv_sharing_fast_prefill.make_back_half_batch``): one query per request over
its whole cached sequence, no KV write. It reads its metadata from a private
triton backend with its own CUDA-graph buffers, so neither the pass's metadata
nor the decode graphs' buffers are written. Its decode metadata keeps W + 1
sliding-window keys, the window of the full pass's extend kernel, as the eager
back half's decode metadata does.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Dict, List, Optional

import torch
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

if TYPE_CHECKING:
    from sglang.srt.layers.kv_sharing_fast_prefill import FastPrefillPlan

logger = logging.getLogger(__name__)

# Set to 0 to run the back half eager (CUDA graphs stay on elsewhere).
GRAPH_ENV = "SGLANG_KV_SHARING_FAST_PREFILL_GRAPH"
# Finishing requests per prefill pass; a pass with more runs the back half eager.
BUCKETS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)


def bucket_for(buckets, n: int) -> Optional[int]:
    """Smallest captured batch size that holds n rows (None: none does)."""
    return next((b for b in buckets if b >= n), None)


def find_fast_prefill_text_model(model):
    """The module that runs YOCO (Gemma4TextModel with the flag on), or None."""
    for m in model.modules():
        if getattr(m, "fast_prefill_first_shared_layer", None) is not None:
            return m
    return None


def back_half_graph_skip_reason(model_runner, text_model) -> Optional[str]:
    """None when the back half can be captured, else why it stays eager."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    if text_model is None:
        return "no model runs --kv-sharing-fast-prefill"
    if os.environ.get(GRAPH_ENV, "1") == "0":
        return f"{GRAPH_ENV}=0"
    if model_runner.is_draft_worker:
        return "draft worker"
    if model_runner.device != "cuda":
        return f"device {model_runner.device}"
    if model_runner.server_args.disable_cuda_graph:
        return "--disable-cuda-graph"
    backend = model_runner.attn_backend
    if type(backend) is not TritonAttnBackend:
        return f"attention backend {type(backend).__name__} (triton only)"
    if getattr(backend, "enable_deterministic", False):
        # The back half is extend-shaped there (rounds exactly as the full pass).
        return "--enable-deterministic-inference"
    if getattr(backend, "dcp_size", 1) > 1:
        return "decode context parallelism"
    return None


class BackHalfCudaGraphs:
    """Captured KV-shared layers, one graph per batch-size bucket."""

    def __init__(
        self,
        layers,
        first_shared_layer: int,
        end_layer: int,
        backend,
        hidden_size: int,
        ple_dim: int,
        dtype: torch.dtype,
        device,
        max_bs: int = BUCKETS[-1],
    ):
        self.layers = layers
        self.first, self.end = first_shared_layer, end_layer
        self.buckets = [b for b in BUCKETS if b <= max_bs]
        self.max_bs = self.buckets[-1]
        self.backend = backend
        n, dev = self.max_bs, device
        self.hidden = torch.zeros(n, hidden_size, dtype=dtype, device=dev)
        self.ple = (
            torch.zeros(n, self.end - self.first, ple_dim, dtype=dtype, device=dev)
            if ple_dim
            else None
        )
        i64 = dict(dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, **i64)
        self.req_pool_indices = torch.zeros(n, **i64)
        fill = self.backend.get_cuda_graph_seq_len_fill_value()
        self.seq_len_fill = fill
        self.seq_lens = torch.full((n,), fill, **i64)
        self.out_cache_loc = torch.zeros(n, **i64)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.batches: Dict[int, ForwardBatch] = {}

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

    def _forward(self, bs: int, fb: ForwardBatch) -> torch.Tensor:
        h = self.hidden[:bs]
        for i in range(self.first, self.end):
            ple = self.ple[:bs, i - self.first] if self.ple is not None else None
            h, _ = self.layers[i](
                positions=fb.positions,
                hidden_states=h,
                per_layer_input=ple,
                forward_batch=fb,
            )
        return h

    def capture(self) -> None:
        from sglang.srt.distributed.parallel_state import graph_capture

        # A pool of its own (a few MB), so a replay inside a prefill never writes
        # memory where another graph's output may still be waiting to be read.
        pool = torch.cuda.graph_pool_handle()
        ctx = ForwardContext(attn_backend=self.backend)
        with torch.no_grad(), graph_capture() as gc, forward_context(ctx):
            for bs in reversed(
                self.buckets
            ):  # large first: the small ones reuse its memory
                fb = self._batch(bs)
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
        return bucket_for(self.buckets, num_reqs) is not None

    def run(
        self,
        plan: FastPrefillPlan,
        hidden_states: torch.Tensor,
    ) -> torch.Tensor:
        """The back-half rows of ``plan``, computed by the graph of its bucket."""
        n = plan.num_reqs
        bs = bucket_for(self.buckets, n)
        rows, reqs, src = plan.token_index, plan.req_index, plan.source
        torch.index_select(hidden_states, 0, rows, out=self.hidden[:n])
        if self.ple is not None:
            self.ple[:n].copy_(plan.back_per_layer_inputs)
        # Each kept request's last token: a decode step's geometry.
        self.positions[:n].copy_(src.positions.index_select(0, rows))
        self.req_pool_indices[:n].copy_(src.req_pool_indices.index_select(0, reqs))
        self.seq_lens[:n].copy_(src.seq_lens.index_select(0, reqs))
        self.out_cache_loc[:n].copy_(src.out_cache_loc.index_select(0, rows))
        pad = bs - n
        if pad:  # padding rows: a one-token sequence of request slot 0
            self.req_pool_indices[n:bs].zero_()
            self.seq_lens[n:bs].fill_(self.seq_len_fill)
            self.positions[n:bs].zero_()
        fb = self.batches[bs]
        seq_cpu: List[int] = list(plan.seq_lens_cpu) + [self.seq_len_fill] * pad
        fb.seq_lens_sum = sum(seq_cpu)
        fb.seq_lens_cpu = torch.tensor(seq_cpu, dtype=torch.int64)
        self.backend.init_forward_metadata_out_graph(fb, in_capture=False)
        self.graphs[bs].replay()
        return self.outputs[bs][:n]


def make_back_half_backend(model_runner, max_bs: int):
    """A private triton backend for the back half, with its own CUDA-graph
    buffers. Its decode metadata keeps W + 1 window keys, the keys
    the extend kernel of the full pass lets the token attend (q - k <= W)."""
    backend = model_runner._get_attention_backend()
    backend.init_cuda_graph_state(max_bs, max_bs)
    return backend


def capture_back_half_graphs(model_runner) -> Optional[BackHalfCudaGraphs]:
    """Capture the back half of a YOCO model at start-up (after the decode graphs);
    attach it to the text model, which then replays it. None where it stays eager."""
    text_model = find_fast_prefill_text_model(model_runner.model)
    reason = back_half_graph_skip_reason(model_runner, text_model)
    if reason is not None:
        if text_model is not None:
            logger.info("KV-sharing fast prefill: back half runs eager (%s)", reason)
        return None
    max_bs = min(BUCKETS[-1], model_runner.req_to_token_pool.size)
    backend = make_back_half_backend(model_runner, max_bs)
    if type(backend) is not type(model_runner.attn_backend):
        logger.info(
            "KV-sharing fast prefill: back half runs eager (a new backend is %s)",
            type(backend).__name__,
        )
        return None
    cfg = text_model.config
    graphs = BackHalfCudaGraphs(
        text_model.layers,
        text_model.fast_prefill_first_shared_layer,
        text_model.end_layer,
        backend,
        cfg.hidden_size,
        getattr(cfg, "hidden_size_per_layer_input", 0) or 0,
        model_runner.dtype,
        model_runner.device,
        max_bs,
    )
    graphs.capture()
    text_model.fast_prefill_graphs = graphs
    logger.info(
        "KV-sharing fast prefill: back half (layers %d-%d) captured for batch sizes %s",
        graphs.first,
        graphs.end - 1,
        graphs.buckets,
    )
    resolve_default_min_tokens(model_runner, text_model)
    return graphs


def resolve_default_min_tokens(model_runner, text_model) -> None:
    """Unset --kv-sharing-fast-prefill-min-tokens becomes 0 once the back half is
    captured, unless a prefill CUDA graph replays the small passes (its capture
    sizes were kept below DEFAULT_MIN_TOKENS by the server-arg hook): with the
    launches gone, short passes gain too."""
    if text_model.fast_prefill_min_tokens is not None:
        return
    # With the prefill graph disabled, 0.5.17 routes prefill through an
    # EagerRunner rather than leaving the slot None (capture_prefill_graph).
    from sglang.srt.model_executor.runner.eager_runner import EagerRunner

    runner = model_runner.prefill_cuda_graph_runner
    if runner is not None and not isinstance(runner, EagerRunner):
        return
    text_model.fast_prefill_min_tokens = 0
    logger.info(
        "KV-sharing fast prefill: every prefill pass takes the fast path (no prefill "
        "CUDA graph; set --kv-sharing-fast-prefill-min-tokens to change this)"
    )
