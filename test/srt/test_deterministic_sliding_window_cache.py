"""Under --enable-deterministic-inference, a sliding-window layer's prefill output is the
same, bit for bit, whether the prompt runs cold, in chunks or as a prefix-cache hit.

Triton's deterministic unified extend kernel sums a query's keys in tiles from the start
of the request's key list. For a sliding-window layer stock 0.5.17 starts that list at
the pass's window: a cold pass, a later chunk and a cache hit cut the same keys into
different tiles and round differently. The step pads the list to start on an absolute
multiple of 128 keys (0.5.23: upstream's padding, checked here).

The real metadata and kernel run under Triton's interpreter (a fresh process: this file
runs itself as a script), fp32 so that a different rounding order shows; a
full-attention layer, whose list always starts at 0, is the control.
"""

import types

import pytest
import torch

from triton_interpret import print_result, row_invariant_dot, run_as_script

pytestmark = pytest.mark.stack("generic-fixes", step="deterministic-sliding-window-tile-align")

PROMPTS = [300, 230, 90]  # tokens per request
WINDOW = 40  # backend.sliding_window_size (config sliding_window - 1)
# Passes over the prompts: cold; prefix-cache hits (request 2 cold beside them);
# chunks of 128 tokens.
PASSES = {  # {request: (cached prefix, new tokens)} a batch
    "cold": [{0: (0, 300), 1: (0, 230), 2: (0, 90)}],
    "cache_hit": [{0: (170, 130), 1: (101, 129), 2: (0, 90)}],
    "chunked": [
        {0: (0, 128), 1: (0, 128), 2: (0, 90)},
        {0: (128, 128), 1: (128, 102)},
        {0: (256, 44)},
    ],
}
HEADS, KV_HEADS, HEAD_DIM, POOL = 2, 1, 32, 2048


def _check():
    from attention_stand_ins import decoder_layer, deterministic_triton_backend, extend_batch_of

    row_invariant_dot()
    g = torch.Generator().manual_seed(0)
    k_buf = torch.randn(POOL, KV_HEADS, HEAD_DIM, generator=g)
    v_buf = torch.randn(POOL, KV_HEADS, HEAD_DIM, generator=g)
    # One query per request and position, whichever pass computes it.
    q = [torch.randn(s, HEADS * HEAD_DIM, generator=g) for s in PROMPTS]
    be = deterministic_triton_backend(g, PROMPTS, WINDOW, k_buf, v_buf, POOL)

    def run(passes, window):
        """Each request's output rows, by position, over the passes."""
        layer = decoder_layer(window, HEADS, HEAD_DIM)
        rows = {r: [None] * s for r, s in enumerate(PROMPTS)}
        for batch in passes:
            reqs, chunk = list(batch), list(batch.values())
            fb = extend_batch_of(be, reqs, chunk, [PROMPTS[r] for r in reqs])
            be.init_forward_metadata(fb)
            qs = torch.cat([q[r][p : p + e] for r, (p, e) in batch.items()])
            o = torch.empty(len(qs), HEADS * HEAD_DIM)
            out = be._forward_extend_unified(qs, o, layer, fb, True, 0.0, None)
            at = 0
            for r, (p, e) in batch.items():
                rows[r][p : p + e] = list(out[at : at + e])
                at += e
        return rows

    result = {}
    for window, name in ((WINDOW, "sliding"), (-1, "full")):
        runs = {k: run(v, window) for k, v in PASSES.items()}
        cold = runs.pop("cold")
        for kind, rows in runs.items():
            # Per request: how many of its rows differ from the cold pass's.
            result[f"{name}_{kind}"] = [
                sum(a is not None and not torch.equal(a, b) for a, b in zip(rows[r], cold[r]))
                for r in range(len(PROMPTS))
            ]
    return result


@pytest.mark.stack("generic-fixes", step="deterministic-sliding-window-tile-align",
                   fails_before=True)
def test_cached_and_chunked_prompt_attends_as_cold_bit_for_bit():
    out = run_as_script(__file__)
    none = [0] * len(PROMPTS)
    # The control: full attention's key list starts at position 0 in every pass.
    assert out["full_cache_hit"] == none and out["full_chunked"] == none
    # Stock 0.5.17: rows of requests 0 and 1 differ (passes that start their window
    # past position 0, off a tile boundary: 130 and 61 of the hits, 88 of the
    # chunks); request 2 always runs in one cold pass.
    assert out["sliding_cache_hit"] == none, out["sliding_cache_hit"]
    assert out["sliding_chunked"] == none, out["sliding_chunked"]


@pytest.mark.stack("generic-fixes", step="deterministic-sliding-window-tile-align",
                   bases=("0.5.17",))
def test_window_lists_padded_to_absolute_tiles():
    """The padded lists: each starts on a multiple of 128, led by copies of its
    first key, then the window's keys unchanged; computed once per pass."""
    from sglang.srt.layers.attention import deterministic_window_tiles as tiles

    lens, starts = [0, 5, 40, 40], [0, 0, 130, 300]
    indptr = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    indices = torch.arange(1000, 1000 + sum(lens))
    start = torch.tensor(starts, dtype=torch.int32)
    meta = types.SimpleNamespace()
    new_indptr, new_indices, new_start = tiles.align_window_to_tiles(
        meta, indptr, indices, start, len(lens)
    )
    assert new_start.tolist() == [0, 0, 128, 256]
    assert new_start.dtype == start.dtype and new_indptr.dtype == indptr.dtype
    pads = [0, 0, 2, 44]
    assert new_indptr.tolist() == [0] + torch.tensor(
        [n + p for n, p in zip(lens, pads)]).cumsum(0).tolist()
    for i, (n, p) in enumerate(zip(lens, pads)):
        got = new_indices[new_indptr[i] : new_indptr[i + 1]].tolist()
        keys = indices[indptr[i] : indptr[i + 1]].tolist()
        assert got == keys[:1] * p + keys
    # The other sliding layers of the pass reuse the lists.
    again = tiles.align_window_to_tiles(meta, indptr, indices, start, len(lens))
    assert again[1] is new_indices
    # No window key before any extend: nothing to pad.
    empty = torch.zeros(0, dtype=torch.int64)
    zero = torch.zeros(3, dtype=torch.int32)
    out = tiles.align_window_to_tiles(None, torch.zeros(4, dtype=torch.int32), empty, zero, 3)
    assert out[1] is empty


if __name__ == "__main__":
    print_result(_check)
