"""Under --enable-deterministic-inference, the YOCO back half's attention is the
full pass's, bit for bit, on triton's real unified extend kernel.

The kernel runs under Triton's interpreter (a fresh process: this file runs itself as a
script), fp32 so that a different rounding order shows. On both bases triton pads every
window list to absolute 128-key tiles (0.5.17: step
deterministic-sliding-window-tile-align), so the back half rounds as the pass. The
control: the window a one-token extend builds by itself, without that padding, rounds
differently.
"""

import pytest

from release import RELEASE
from triton_interpret import print_result, row_invariant_dot, run_as_script

pytestmark = pytest.mark.stack("yoco-model", step="gemma4-fast-prefill-branch")

SEQ = [(0, 150), (0, 37), (45, 90), (170, 3)]  # (cached prefix, new tokens)
WINDOW = 40  # backend.sliding_window_size (config sliding_window - 1)
HEADS, KV_HEADS, HEAD_DIM, POOL = 2, 1, 32, 2048


def _check():
    import torch

    from attention_stand_ins import (
        back_half_backend_of,
        decoder_layer,
        deterministic_triton_backend,
        extend_batch_of,
    )

    from sglang.srt.model_executor import kv_sharing_fast_prefill_plan as yoco

    row_invariant_dot()

    g = torch.Generator().manual_seed(0)
    k_buf = torch.randn(POOL, KV_HEADS, HEAD_DIM, generator=g)
    v_buf = torch.randn(POOL, KV_HEADS, HEAD_DIM, generator=g)
    bs = len(SEQ)
    seq = [p + e for p, e in SEQ]
    be = deterministic_triton_backend(g, seq, WINDOW, k_buf, v_buf, POOL)
    fb = extend_batch_of(be, list(range(bs)), SEQ, seq)
    n = sum(e for _, e in SEQ)
    q = torch.randn(n, HEADS * HEAD_DIM, generator=g)

    def attend(be, batch, rows, window):
        layer = decoder_layer(window, HEADS, HEAD_DIM)
        o = torch.empty(len(rows), HEADS * HEAD_DIM)
        return be._forward_extend_unified(q[rows], o, layer, batch, True, 0.0, None)

    out = {}
    be.init_forward_metadata(fb)  # the full pass
    full = {w: attend(be, fb, torch.arange(n), w) for w in (WINDOW, -1)}
    back_be = back_half_backend_of(be)
    # what the planner's eager plan holds: the rows and their batch, prepared
    planned = yoco.back_half_rows(fb, first_shared_layer=1)
    batch = yoco.BackHalfAttention(back_be).prepare(fb, planned)
    rows = planned.token_index
    for w, name in ((WINDOW, "sliding"), (-1, "full")):
        back = attend(back_be, batch, rows, w)
        out[name] = [torch.equal(back[i], full[w][r]) for i, r in enumerate(rows)]
    out["back_half_mode"] = batch.forward_mode.name
    # Control: the window triton builds for a one-token extend on its own, with
    # its window lists not padded to tiles.
    if RELEASE >= (0, 5, 23):
        back_be.align_window_kv_to_tiles = lambda *args: (None, None)
    else:
        from sglang.srt.layers.attention import deterministic_window_tiles

        deterministic_window_tiles.WINDOW_TILE = 1  # no padding
    back_be.init_forward_metadata(batch)
    stock = attend(back_be, batch, rows, WINDOW)
    out["stock_window"] = [torch.equal(stock[i], full[WINDOW][r]) for i, r in enumerate(rows)]
    return out


def test_deterministic_back_half_attention_is_the_full_pass_bit_for_bit():
    out = run_as_script(__file__)
    assert out["back_half_mode"] == "EXTEND"
    assert out["full"] == [True] * len(SEQ)
    assert out["sliding"] == [True] * len(SEQ)
    # Requests longer than the window: the control's list starts at seq - 1 - W,
    # not on the pass's tile, and rounds differently.
    long_ones = [i for i, (p, e) in enumerate(SEQ) if p + e - 1 > WINDOW]
    assert not all(out["stock_window"][i] for i in long_ones)


if __name__ == "__main__":
    print_result(_check)
