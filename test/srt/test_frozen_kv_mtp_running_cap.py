"""Step frozen-kv-mtp-running-cap (speculative/frozen_kv_mtp_running_cap.py): under
FROZEN_KV_MTP the running-request cap is derived from the KV budget, not fixed at 48.
Pure sizing on the released Gemma-4 configs (page sizes 1, 16, 64). Anchor, measured on
H200: 31B, page 64, 48 requests reserve 83.94 GiB of a 52.68 GiB budget; stock fails.
"""

import json
import logging
import os
import types

import pytest

pytestmark = pytest.mark.stack("frozen-kv-mtp-speed", step="frozen-kv-mtp-running-cap")

CONFIGS = os.path.join(
    os.path.dirname(__file__), "..", "..", "benchmark", "yoco_gemma4", "configs"
)
GIB = 1 << 30
H200_BUDGET = int(52.68 * GIB)
CHUNK = 16384  # the measurement's chunked prefill size; 2 chunks in flight (overlap)


@pytest.fixture(scope="module")
def cap_mod():
    from sglang.srt.speculative import frozen_kv_mtp_running_cap

    return frozen_kv_mtp_running_cap


def _shape(cap_mod, model, page, *, swa_from_cap=True, draft=4, chunk=CHUNK):
    with open(os.path.join(CONFIGS, f"gemma-4-{model}-it.text_config.json")) as f:
        cfg = json.load(f).get("text_config")
    full, swa = cap_mod.bytes_per_token_from_text_config(cfg)
    return cap_mod.PoolShape(
        full_bytes_per_token=full,
        swa_bytes_per_token=swa,
        window=cfg["sliding_window"],
        page_size=page,
        draft_tokens=draft,
        decode_alloc=2 * max(draft - 1, draft),  # overlap: 2 x max(steps, draft tokens)
        swa_from_cap=swa_from_cap,
        fixed_swa_tokens=2 * chunk + page if swa_from_cap else 0,
    )


@pytest.mark.stack("frozen-kv-mtp-speed", step="frozen-kv-mtp-running-cap", fails_before=True)
def test_hook_leaves_the_cap_to_start_up():
    from sglang.srt.arg_groups.speculative_hook import _handle_frozen_kv_mtp

    steps = dict(speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)
    unset = types.SimpleNamespace(max_running_requests=None, enable_mixed_chunk=False, **steps)
    _handle_frozen_kv_mtp(unset)
    assert unset.max_running_requests is None  # stock: 48
    user = types.SimpleNamespace(max_running_requests=7, enable_mixed_chunk=True, **steps)
    _handle_frozen_kv_mtp(user)
    assert user.max_running_requests == 7 and user.enable_mixed_chunk is False


def test_31b_page64_stock_cap_is_the_measured_failure(cap_mod):
    shape = _shape(cap_mod, "31B", 64)
    assert shape.swa_bytes_per_token == 819200  # 50 sliding layers, ~0.8 MB a token
    full, swa = cap_mod.pool_tokens(shape, H200_BUDGET, 48)
    assert swa == 110016 and f"{swa * shape.swa_bytes_per_token / GIB:.2f}" == "83.94"
    assert full == 0 and not cap_mod.holds(shape, H200_BUDGET, 48)
    with pytest.raises(ValueError) as e:
        cap_mod.check_user_cap(shape, H200_BUDGET, 48)
    fits = cap_mod.largest_cap(shape, H200_BUDGET)
    msg = str(e.value)
    assert 0 < fits < 48
    for part in (f"The largest cap that fits is {fits}", f"--max-running-requests {fits}",
                 "--mem-fraction-static", "SGLANG_SWA_EVICTION_INTERVAL", "110016 tokens"):
        assert part in msg, (part, msg)
    cap_mod.check_user_cap(shape, H200_BUDGET, fits)  # the suggestion is accepted


@pytest.mark.parametrize("model", ["31B", "E4B", "E2B"])
@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("budget_gib", [16, 52.68, 120])
def test_derived_cap_is_the_largest_that_fits(cap_mod, model, page, budget_gib):
    shape = _shape(cap_mod, model, page, chunk=8192)
    budget = int(budget_gib * GIB)
    d = cap_mod.derive_cap(shape, budget, graph_max_bs=256)
    assert d.cap == min(d.fits, 256) >= 1
    assert cap_mod.holds(shape, budget, d.fits) and not cap_mod.holds(shape, budget, d.fits + 1)
    full, swa = cap_mod.pool_tokens(shape, budget, d.cap)
    assert (full, swa) == (d.full_tokens, d.swa_tokens)
    assert full % page == 0 and swa % page == 0
    assert full >= d.cap * shape.swa_tokens_per_request
    assert full * shape.full_bytes_per_token + swa * shape.swa_bytes_per_token <= budget
    cap_mod.check_user_cap(shape, budget, d.cap)
    if d.fits > 256:
        with_more = cap_mod.holds(shape, budget, 257)
        assert with_more and "CUDA-graph max batch size" in d.reason
    else:
        with pytest.raises(ValueError):
            cap_mod.check_user_cap(shape, budget, d.fits + 1)


def test_31b_page64_h200_starts_and_e4b_reaches_the_graph_limit(cap_mod):
    d = cap_mod.derive_cap(_shape(cap_mod, "31B", 64), H200_BUDGET, graph_max_bs=256)
    assert d.cap == d.fits == 20
    assert "1608 tokens a request (window 1024 + eviction interval 128 x 4 draft tokens" in d.reason
    e4b = cap_mod.derive_cap(_shape(cap_mod, "E4B", 64), H200_BUDGET, graph_max_bs=256)
    assert e4b.cap == 256 < e4b.fits
    # Smaller pages reserve less per request: more fit.
    assert cap_mod.largest_cap(_shape(cap_mod, "31B", 1), H200_BUDGET) >= d.fits


def test_radix_cache_on_splits_by_ratio_and_keeps_user_caps(cap_mod):
    shape = _shape(cap_mod, "31B", 64, swa_from_cap=False)
    full, swa = cap_mod.pool_tokens(shape, H200_BUDGET, 1)
    assert (full, swa) == cap_mod.pool_tokens(shape, H200_BUDGET, 500)  # cap costs no KV
    d = cap_mod.derive_cap(shape, H200_BUDGET, graph_max_bs=256)
    assert d.cap == swa // shape.swa_tokens_per_request
    cap_mod.check_user_cap(shape, H200_BUDGET, 500)  # stock's path: admitted by tokens


def test_no_request_fits_says_why(cap_mod):
    with pytest.raises(RuntimeError, match="holds no request.*--mem-fraction-static") as e:
        cap_mod.derive_cap(_shape(cap_mod, "31B", 64), 20 * GIB, graph_max_bs=256)
    assert "32832 tokens for prefill chunks" in str(e.value)  # 2 x 16384 + a page


def test_start_up_sets_the_cap_and_logs_it(cap_mod, monkeypatch, caplog):
    import sglang.srt.runtime_context as rc

    shape = _shape(cap_mod, "31B", 64)
    overrides = []
    schedule = types.SimpleNamespace(max_running_requests=None)
    context = types.SimpleNamespace(override=lambda src, **kw: overrides.append((src, kw)))
    monkeypatch.setattr(cap_mod, "_shape_from_configurator", lambda kvc: shape)
    monkeypatch.setattr(rc, "get_schedule", lambda: schedule)
    monkeypatch.setattr(rc, "get_context", lambda: context)
    sa = types.SimpleNamespace(
        max_running_requests=None,
        cuda_graph_config=types.SimpleNamespace(decode=types.SimpleNamespace(max_bs=256)),
    )
    sa.override = lambda src, **kw: vars(sa).update(kw)  # server_args is read-only
    kvc = types.SimpleNamespace(
        is_draft_worker=False,
        spec_algorithm=types.SimpleNamespace(is_frozen_kv_mtp=lambda: True),
        ps=types.SimpleNamespace(attn_dp_size=1),
        server_args=sa,
    )
    with caplog.at_level(logging.INFO, logger=cap_mod.__name__):
        cap_mod.resolve_running_cap(kvc, H200_BUDGET)
    assert sa.max_running_requests == 20
    assert overrides == [("frozen_kv_mtp_running_cap", {"max_running_requests": 20})]
    assert "FROZEN_KV_MTP: max_running_requests=20, what the 52.68 GiB KV budget holds" in caplog.text
    schedule.max_running_requests = 48
    with pytest.raises(ValueError, match="largest cap that fits is 20"):
        cap_mod.resolve_running_cap(kvc, H200_BUDGET)
    kvc.is_draft_worker = True  # the draft shares the target's pools
    cap_mod.resolve_running_cap(kvc, H200_BUDGET)


def test_engine_shape_is_stock_configurators(cap_mod, monkeypatch):
    """The glue reads stock's HybridSWAPoolConfigurator and decode allocation; on the
    31B config at page 64 it gives the shape the sizing tests use."""
    import torch

    import sglang.srt.model_executor.pool_configurator as pc

    monkeypatch.setattr(pc, "get_parallel", lambda: types.SimpleNamespace(attn_tp_size=1))
    with open(os.path.join(CONFIGS, "gemma-4-31B-it.text_config.json")) as f:
        cfg = json.load(f)["text_config"]
    types_ = cfg["layer_types"]
    model_config = types.SimpleNamespace(
        full_attention_layer_ids=[i for i, t in enumerate(types_) if t == "full_attention"],
        swa_attention_layer_ids=[i for i, t in enumerate(types_) if t == "sliding_attention"],
        get_num_kv_heads=lambda tp: cfg["num_global_key_value_heads"] // tp,
        get_swa_num_kv_heads=lambda tp: cfg["num_key_value_heads"] // tp,
        head_dim=cfg["global_head_dim"], v_head_dim=cfg["global_head_dim"],
        swa_head_dim=cfg["head_dim"], swa_v_head_dim=cfg["head_dim"],
    )
    sa = types.SimpleNamespace(
        speculative_algorithm="FROZEN_KV_MTP", speculative_num_steps=3,
        speculative_eagle_topk=1, speculative_num_draft_tokens=4,
        max_speculative_num_draft_tokens=4, page_size=64,
        disable_overlap_schedule=False, disable_radix_cache=True,
        chunked_prefill_size=CHUNK, disaggregation_mode="null",
        swa_full_tokens_ratio=0.8, max_total_tokens=None,
    )
    kvc = types.SimpleNamespace(
        is_hybrid_swa=True, sliding_window_size=cfg["sliding_window"], page_size=64,
        model_config=model_config, server_args=sa, kv_cache_dtype=torch.bfloat16,
        kv_cache_dtype_str="auto", is_draft_worker=False,
        spec_algorithm=types.SimpleNamespace(is_eagle=lambda: False, is_standalone=lambda: False),
    )
    assert cap_mod._shape_from_configurator(kvc) == _shape(cap_mod, "31B", 64)
    sa.disable_radix_cache = False
    assert cap_mod._shape_from_configurator(kvc) == _shape(cap_mod, "31B", 64, swa_from_cap=False)


def test_max_total_tokens_bounds_the_cap(cap_mod):
    """--max-total-tokens clips the full pool (and the SWA pool with it), as stock's
    calculate_pool_sizes_from_max_tokens does: fewer requests fit."""
    import dataclasses

    for swa_from_cap in (True, False):
        shape = _shape(cap_mod, "E4B", 64, swa_from_cap=swa_from_cap, chunk=8192)
        free = cap_mod.largest_cap(shape, H200_BUDGET)
        clipped = dataclasses.replace(shape, max_total_tokens=64_000)
        n = cap_mod.largest_cap(clipped, H200_BUDGET)
        assert 0 < n < free
        full, swa = cap_mod.pool_tokens(clipped, H200_BUDGET, n)
        assert full <= 64_000 and swa <= 64_000
        assert min(full, swa) >= n * shape.swa_tokens_per_request
