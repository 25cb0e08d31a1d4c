"""Per-state CUDA graph batch sizes for adaptive speculation.

``AdaptiveController.init_states`` prunes, for each candidate step count, the
decode batch sizes that can reach it (``cuda_graph_bs_for_step``), and EAGLE
v2 passes that list to each state's capture through
``get_context().override(cuda_graph_bs_decode=...)``. The graph runners read
neither: ``get_batch_sizes_to_capture`` reads the resolved
``cuda_graph_config.decode.bs`` (and ``init_states`` got the raw flag, which is
``None`` unless ``--cuda-graph-bs-decode`` was given). So every state captured
every batch size: verify graphs 8 rows wide at batch sizes that only ever run
0 or 1 draft steps, paid in start-up time and graph memory.

``capture_sizes`` applies the pruned list where the runners read it, for the
duration of one state's capture.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, List, Optional

from sglang.srt.model_executor.cuda_graph_config import Backend
from sglang.srt.runtime_context import get_exec


def decode_capture_sizes() -> Optional[List[int]]:
    """The decode batch sizes CUDA graphs are captured for, or ``None`` when
    decode graphs are off (what ``init_states`` expects)."""
    cfg = get_exec().graph.cuda_graph_config
    if cfg is None or cfg.decode.backend == Backend.DISABLED:
        return None
    return list(cfg.decode.bs)


@contextlib.contextmanager
def capture_sizes(bs: Optional[List[int]]) -> Iterator[None]:
    """Capture decode graphs for exactly ``bs`` inside the block. ``None``
    changes nothing; an empty list (no batch size reaches the step count)
    captures no graph, as stock's ``disable_cuda_graph`` override meant to."""
    cfg = get_exec().graph.cuda_graph_config
    if bs is None or cfg is None:
        yield
        return
    saved = (cfg.decode.bs, cfg.decode.backend, cfg.prefill.backend)
    if bs:
        cfg.decode.bs = list(bs)
    else:
        # Both phases: the draft runner's check is cuda_graph_fully_disabled().
        cfg.decode.backend = cfg.prefill.backend = Backend.DISABLED
    try:
        yield
    finally:
        cfg.decode.bs, cfg.decode.backend, cfg.prefill.backend = saved
