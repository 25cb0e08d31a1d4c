"""benchmark/yoco_gemma4/floor.py: the floor model's work counts, checked by hand on the
released E4B config (no engine: arithmetic only)."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "yoco_gemma4"))

import floor  # noqa: E402


def test_window_pairs_and_back_half_bytes_by_hand():
    c = floor.load_config("e4b")
    sliding, full = floor.Layer(c, 0), floor.Layer(c, 5)
    assert (sliding.head_dim, full.head_dim, sliding.window, full.window) == (256, 512, 512, None)
    # A window of 512 lets each query see itself and 512 keys before it.
    assert sliding.attention_pairs(3) == 6 and full.attention_pairs(4096) == 4096 * 4097 // 2
    assert sliding.attention_pairs(1000) == 513 * 514 // 2 + (1000 - 513) * 513
    work = floor.passes(c, 4096, 1)
    every, last, logits = work["fast"]
    assert work["ceiling"][1].bytes == 0 and work["ceiling"][0].flops == every.flops
    # The back half on one row: each KV-shared layer's weights but its K/V projection
    # (it reads layer 22's or 23's cache), its keys once, its per-layer input.
    shared = [floor.Layer(c, i) for i in range(24, 42)]
    weights = sum(L.weights - L.kv_proj for L in shared) * 2
    keys = sum((4096 if L.window is None else 513) * L.kv_bytes_per_token for L in shared)
    assert last.bytes == weights + keys + 18 * 256 * 2 + 2 * 2560 * 2
    assert logits.bytes == 262144 * 2560 * 2
    # The floor runs the last front layer's rest (all but its K/V) on the last token only.
    f_every, f_last, _ = work["floor"]
    L = floor.Layer(c, 23)
    saved = 2 * 4096 * L.rest + L.attention_flops(L.attention_pairs(4096))
    assert every.flops - f_every.flops == saved
    assert f_last.flops - last.flops == 2 * L.rest + L.attention_flops(4096)
