"""YOCO fast prefill (--kv-sharing-fast-prefill) for Gemma-4, on CPU.

Unit tests: when the fast path may run, which rows it runs on, and how the
back half is shaped for the backend (whose metadata tests are
test_attention_back_half_metadata.py).
End to end: the fork's engine with YOCO on matches Hugging Face transformers and
YOCO off.
"""

import dataclasses
import os
import random
import re
import time
import types

import pytest
import torch
from attention_stand_ins import (  # noqa: F401 (_restore_kernels: autouse fixture)
    _restore_kernels,
    assert_same_batch,
    assert_same_state,
    back_half_backend_of,
    backend_state,
    batch_state,
    make_batch,
    make_torch_native_backend,
    make_triton_backend,
    set_deterministic,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.srt.layers import kv_sharing_fast_prefill as yoco
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
from sglang.srt.model_executor.forward_context import (
    ForwardContext,
    forward_context,
    get_attn_backend,
)

pytestmark = pytest.mark.stack("yoco-model", step="gemma4-fast-prefill-branch")

FIRST_SHARED = 4  # tiny model: 8 layers, 4 KV-shared


def reason(fb, layers_to_capture=(), pp_size=1, first=FIRST_SHARED):
    return yoco.fast_prefill_skip_reason(fb, first, layers_to_capture, pp_size)


# ---------------------------------------------------------------- predicate


@pytest.mark.stack("yoco-model", step="gemma4-fast-prefill-branch", fails_before=True)
def test_fires_for_a_plain_prefill():
    assert reason(make_batch([5, 9, 1])) is None


@pytest.mark.parametrize(
    "mode",
    [
        ForwardMode.DECODE,
        ForwardMode.MIXED,
        ForwardMode.IDLE,
        ForwardMode.TARGET_VERIFY,
        ForwardMode.DRAFT_EXTEND_V2,
        ForwardMode.PREBUILT,
        ForwardMode.SPLIT_PREFILL,
        ForwardMode.DLLM_EXTEND,
    ],
)
def test_only_plain_extend_fires(mode):
    assert reason(make_batch([5, 9], mode=mode)) == f"forward mode {mode.name}"


def test_no_saving_when_every_request_has_one_new_token():
    assert reason(make_batch([1, 1, 1])) == "no request has more than one new token"


def test_input_logprobs_need_every_token():
    fb = make_batch([5, 9])
    fb.return_logprob = True
    fb.extend_logprob_start_lens_cpu = [5, 9]  # output logprobs only
    assert reason(fb) is None
    fb.extend_logprob_start_lens_cpu = [5, 3]  # request 2 wants input logprobs
    assert reason(fb) == "input-token logprobs requested"


def test_full_hidden_capture_needs_every_token():
    fb = make_batch([5, 9])
    fb.capture_hidden_mode = CaptureHiddenMode.LAST
    assert reason(fb) is None
    fb.capture_hidden_mode = CaptureHiddenMode.FULL
    assert reason(fb) == "full hidden-state capture"


def test_layer_capture_inside_the_back_half_needs_every_token():
    fb = make_batch([5, 9])
    assert reason(fb, layers_to_capture=[2, FIRST_SHARED]) is None
    assert reason(fb, layers_to_capture=[2, FIRST_SHARED + 1]) == (
        "hidden-state capture inside the KV-shared layers"
    )


def test_pooled_multi_item_and_pp_need_every_token():
    fb = make_batch([5, 9])
    fb.return_pooled_hidden_states = True
    assert reason(fb) == "pooled/embedding output"
    fb = make_batch([5, 9])
    fb.multi_item_delimiter_indices = [torch.tensor([2])]
    assert reason(fb) == "multi-item scoring"
    assert reason(make_batch([5, 9]), pp_size=2) == "pipeline parallelism"


def test_small_pass_keeps_the_full_computation():
    fb = make_batch([6, 3, 1])  # 10 new tokens
    assert "fewer than 11 new tokens" in yoco.fast_prefill_skip_reason(fb, FIRST_SHARED, min_tokens=11)
    assert yoco.fast_prefill_skip_reason(fb, FIRST_SHARED, min_tokens=10) is None
    assert yoco.plan_fast_prefill(fb, FIRST_SHARED, min_tokens=11) is None


def test_model_without_kv_shared_layers_never_fires():
    cfg = types.SimpleNamespace(num_hidden_layers=60, num_kv_shared_layers=0)
    assert yoco.first_kv_shared_layer(cfg) is None
    assert reason(make_batch([5, 9]), first=None) == "model has no KV-shared layers"
    cfg = types.SimpleNamespace(num_hidden_layers=42, num_kv_shared_layers=18)
    assert yoco.first_kv_shared_layer(cfg) == 24


# ---------------------------------------------------------------- gather


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(1, 40), st.integers(0, 30), st.booleans()),
        min_size=1,
        max_size=12,
    )
)
def test_gather_rows_are_last_tokens_of_finishing_requests(reqs):
    ext = [e for e, _, _ in reqs]
    pre = [p for _, p, _ in reqs]
    chunked = [c for _, _, c in reqs]
    fb = make_batch(ext, pre, [7 if c else 0 for c in chunked])
    keep = [i for i, c in enumerate(chunked) if not c]
    assert yoco._finishing_requests(fb, fb.seq_lens_cpu.tolist()) == keep
    # extend_start_loc + extend_seq_lens - 1, computed independently on tensors
    last = (fb.extend_start_loc + fb.extend_seq_lens - 1).tolist()
    assert yoco.last_token_rows(ext, keep) == [last[i] for i in keep]


def test_finishing_requests_read_the_host_lengths_without_a_device_copy():
    """Step prefill-lengths-on-host: a scheduler prefill carries orig_seq_lens on the host too; the
    plan reads that, never the device tensor (a .tolist() there syncs)."""
    fb = make_batch([5, 9, 3], [0, 4, 0], [0, 7, 0])
    fb.orig_seq_lens_cpu = fb.orig_seq_lens.tolist()
    fb.orig_seq_lens = torch.empty(3, device="meta")  # reading it raises
    assert yoco._finishing_requests(fb, fb.seq_lens_cpu.tolist()) == [0, 2]
    # a host copy of another length is not this batch's: the device tensor is read
    fb.orig_seq_lens_cpu = [5, 20]
    with pytest.raises(NotImplementedError, match="meta"):
        yoco._finishing_requests(fb, fb.seq_lens_cpu.tolist())


def attention(backend):
    """The back half's attention context over ``backend`` (a stand-in of the
    instance make_back_half_backend builds)."""
    return yoco.BackHalfAttention(backend)


def test_plan_builds_a_decode_shaped_back_half_batch():
    # request 1 is an unfinished chunk; request 2 has a single new token
    fb = make_batch([4, 6, 1, 3], prefix_lens=[0, 2, 9, 5], orig_extra=[0, 5, 0, 0])
    before = batch_state(fb)
    plan = yoco.plan_fast_prefill(fb, FIRST_SHARED, attention=attention(make_torch_native_backend()))
    assert plan.num_reqs == 3
    assert plan.rows.req_index.tolist() == [0, 2, 3]
    assert plan.rows.token_index.tolist() == [3, 10, 13]
    b = plan.batch
    assert b is not fb and b.forward_mode == ForwardMode.DECODE and b.batch_size == 3
    assert b.seq_lens.tolist() == [4, 10, 8] == list(plan.rows.seq_lens_cpu)
    assert b.seq_lens_sum == 22
    assert b.req_pool_indices.tolist() == [1, 3, 4]
    assert b.positions.tolist() == [3, 9, 7]  # position of each last token
    assert b.out_cache_loc.tolist() == [1003, 1010, 1013]
    assert b.input_ids.tolist() == [103, 110, 113]
    assert b.extend_seq_lens is None and b.spec_info is None
    # the pass's own batch is untouched
    assert_same_batch(fb, before)
    # the plan is immutable
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.batch = None
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.rows.token_index = None


def test_the_back_half_attends_in_its_own_context_and_leaves_the_pass_untouched():
    """The KV-shared layers find the back half's backend inside active(), the
    pass's again after it, also when they raise; the pass's backend and batch
    are neither written nor replaced by planning or running the back half."""
    be = make_triton_backend(15)
    fb = make_batch([9, 30, 4], [0, 4, 2], backend=be)
    be.init_forward_metadata(fb)  # the pass's own metadata
    before, batch_before = backend_state(be), batch_state(fb)
    attn = attention(back_half_backend_of(be))
    plan = yoco.plan_fast_prefill(fb, FIRST_SHARED, attention=attn)
    assert plan.attention is attn and plan.batch is not fb
    assert attn.backend.forward_metadata is not be.forward_metadata
    with forward_context(ForwardContext(attn_backend=be)):
        with attn.active():
            assert get_attn_backend() is attn.backend
        assert get_attn_backend() is be
        with pytest.raises(RuntimeError):
            with attn.active():
                raise RuntimeError("layer failed")
        assert get_attn_backend() is be
    assert_same_state(be, before)
    assert_same_batch(fb, batch_before)


def test_plan_with_only_an_unfinished_chunk_runs_no_back_half():
    plan = yoco.plan_fast_prefill(
        make_batch([64], orig_extra=[100]), FIRST_SHARED, attention=attention(make_torch_native_backend())
    )
    assert plan.num_reqs == 0 and plan.batch is None
    h = torch.randn(64, 8)
    assert yoco.run_back_half([], plan, 8, h, None) is h


def test_rows_of_any_leading_shape_pass_through():
    """Hidden states with several streams per token ([streams, tokens, hidden],
    as Gemma-3n's AltUp carries them): the back half's rows are gathered and
    scattered along the token dimension, every stream with its rows."""
    x = torch.randn(4, 10, 6)
    index = torch.tensor([2, 5, 9])
    rows = yoco.gather_rows(x, index, token_dim=1)
    assert rows.shape == (4, 3, 6) and torch.equal(rows, x[:, [2, 5, 9]])
    new = torch.randn(4, 3, 6)
    out = yoco.scatter_rows(x, index, new, token_dim=1)
    assert torch.equal(out[:, [2, 5, 9]], new)
    keep = [i for i in range(10) if i not in (2, 5, 9)]
    assert torch.equal(out[:, keep], x[:, keep])
    assert out is not x and torch.equal(x[:, [2, 5, 9]], rows)  # out of place


# ---------------------------------------------------------------- per-layer inputs


def _ple_model(layers, dim, hidden, seed=0):
    """The patched Gemma4TextModel's per-layer-input methods on a stand-in model:
    bf16, a real RMSNorm, the projection GEMM as a matmul."""
    from sglang.srt.layers.layernorm import RMSNorm
    from sglang.srt.models.gemma4_causal import Gemma4TextModel

    g = torch.Generator().manual_seed(seed)
    norm = RMSNorm(dim, 1e-6).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim, generator=g))
    w = torch.randn(layers * dim, hidden, generator=g).to(torch.bfloat16)
    m = types.SimpleNamespace(
        per_layer_model_projection=lambda x: (x @ w.t(), None),
        per_layer_projection_scale=torch.tensor(hidden**-0.5),
        per_layer_projection_norm=norm,
        per_layer_input_scale=torch.rsqrt(torch.tensor(2.0)),
        hidden_size_per_layer_input=dim,
        config=types.SimpleNamespace(num_hidden_layers=layers),
    )
    m._combine_per_layer_inputs = types.MethodType(Gemma4TextModel._combine_per_layer_inputs, m)
    return m, lambda *a: Gemma4TextModel.project_per_layer_inputs(m, *a)


@pytest.mark.parametrize("with_embeddings", [True, False])
def test_per_layer_inputs_of_the_back_half_only_on_its_rows(with_embeddings):
    """With a plan, the model finishes the per-layer inputs of the back half's
    layers for the plan's rows only, the front layers' for every row: bit for
    bit the full computation's values there (bf16). An unfinished chunk's plan
    gets none."""
    attn = attention(make_torch_native_backend())
    layers, dim, hidden = 8, 16, 24
    _, project = _ple_model(layers, dim, hidden)
    fb = make_batch([5, 1, 9, 3], prefix_lens=[0, 4, 2, 0], orig_extra=[0, 0, 0, 7])
    n_tok = sum(fb.extend_seq_lens_cpu)
    g = torch.Generator().manual_seed(1)
    emb = torch.randn(n_tok, hidden, generator=g).to(torch.bfloat16)
    raw = torch.randn(n_tok, layers, dim, generator=g).to(torch.bfloat16) if with_embeddings else None
    full = project(emb, raw)
    plan = yoco.plan_fast_prefill(fb, FIRST_SHARED, attention=attn)
    front, back = project(emb, raw, plan)
    rows = plan.rows.token_index
    assert rows.tolist() == [4, 5, 14]  # request 3 is an unfinished chunk
    assert torch.equal(front, full[:, :FIRST_SHARED])
    assert torch.equal(back, full[rows, FIRST_SHARED:])

    chunk = yoco.plan_fast_prefill(make_batch([6], orig_extra=[9]), FIRST_SHARED, attention=attn)
    assert chunk.num_reqs == 0
    front, back = project(emb[:6], raw[:6] if raw is not None else None, chunk)
    assert torch.equal(front, full[:6, :FIRST_SHARED]) and back is None


# ---------------------------------------------------------------- metadata


def test_default_triton_back_half_stays_a_decode_step():
    plan = yoco.plan_fast_prefill(
        make_batch([9, 30], [0, 4]), FIRST_SHARED, attention=attention(make_triton_backend(15))
    )
    assert plan.batch.forward_mode == ForwardMode.DECODE


def _deterministic_triton_plan(monkeypatch):
    be = set_deterministic(make_triton_backend(15))
    return yoco.plan_fast_prefill(make_batch([9, 30, 4], [0, 4, 20]), FIRST_SHARED, attention=attention(be))


def test_deterministic_triton_back_half_is_planned_as_an_extend(monkeypatch):
    plan = _deterministic_triton_plan(monkeypatch)
    back = plan.batch
    seq = [9, 34, 24]
    assert back.forward_mode == ForwardMode.EXTEND and back.batch_size == 3
    assert back.extend_seq_lens.tolist() == [1] * 3 == back.extend_seq_lens_cpu
    assert back.extend_prefix_lens.tolist() == [s - 1 for s in seq] == back.extend_prefix_lens_cpu
    assert back.extend_start_loc.tolist() == [0, 1, 2]
    # the backend built extend metadata for it: one query per request
    meta = plan.attention.backend.forward_metadata
    assert meta.qo_indptr.tolist() == [0, 1, 2, 3] and meta.max_extend_len == 1


@pytest.mark.stack("yoco-model", step="gemma4-fast-prefill-branch", bases=("0.5.17",))
def test_deterministic_triton_back_half_window_starts_where_the_pass_did(monkeypatch):
    plan = _deterministic_triton_plan(monkeypatch)
    # the backend built it with the pass's prefixes (its window starts there)
    assert plan.attention.backend.forward_metadata.window_kv_offsets.tolist() == [0, 0, 5]


@pytest.mark.stack("yoco-model", step="gemma4-fast-prefill-branch", bases=("0.5.23",))
def test_deterministic_triton_back_half_window_starts_on_the_pass_tile(monkeypatch):
    plan = _deterministic_triton_plan(monkeypatch)
    meta = plan.attention.backend.forward_metadata
    # its last W = 15 keys before the token, padded back to the 128-key tile
    # they start in, key 0 here, as the pass's lists are (the general case:
    # test_attention_back_half_metadata)
    assert meta.window_kv_offsets.tolist() == [0, 18, 8]
    aligned = meta.aligned_window_kv_indptr
    assert (aligned[1:] - aligned[:-1]).tolist() == [8, 33, 23]


@pytest.mark.stack("yoco-model", step="gemma4-fast-prefill-branch", bases=("0.5.23",))
def test_back_half_batch_reads_through_a_plan_of_its_own_rows():
    """0.5.23 reads the KV cache through the KVLocPlan bound to a batch, whose
    tables are indexed by the batch's rows: the back half's batch (fewer rows)
    reads through a plan of its own, and the pass's keeps the pass's."""
    be = make_triton_backend(15)
    # request 1 is an unfinished chunk: the back half has requests 0 and 2
    fb = make_batch([4, 6, 3], prefix_lens=[0, 2, 5], orig_extra=[0, 5, 0], backend=be)
    pass_plan = fb.kv_loc_plan
    plan = yoco.plan_fast_prefill(fb, FIRST_SHARED, attention=attention(be))
    assert fb.kv_loc_plan is pass_plan
    back = plan.batch
    assert fb.kv_loc_plan.req_pool_indices.tolist() == [1, 2, 3]
    assert back.kv_loc_plan is not fb.kv_loc_plan
    assert back.kv_loc_plan.req_pool_indices.tolist() == back.req_pool_indices.tolist() == [1, 3]
    assert back.kv_loc_plan.seq_lens.tolist() == [4, 8]


# ---------------------------------------------------------------- end to end

MAX_NEW = 5


def _prompts(seed, n):
    rng = random.Random(seed)
    shared = [rng.randrange(3, 512) for _ in range(48)]
    out = []
    for i in range(n):
        tail = [rng.randrange(3, 512) for _ in range(rng.choice([1, 2, 7, 20, 45, 90]))]
        out.append(shared + tail if i % 3 == 0 else tail)
    return out


@pytest.mark.stack("yoco-model")
def test_yoco_engine_matches_hf_and_fires(model_dir, hf, capfd, monkeypatch, tmp_path):
    """Batch mixes, prefix hits, 1-token prompts next to long ones, chunked
    prefill (chunk 64 < several prompts) and an input-logprob request mixed in:
    YOCO on gives Hugging Face's tokens and logprobs; the log shows the back half
    ran on last tokens only, dropped unfinished chunks, and fell back for the
    input-logprob batch. Every plan read the requests' lengths from the host
    (engine_probe/ logs it in the scheduler process)."""
    from cpu_engine import (
        YOCO,
        assert_same_greedy,
        decisive_prompts,
        engine_greedy,
        greedy_of,
        start_engine,
    )

    ref = decisive_prompts(hf, _prompts(7, 18), MAX_NEW)
    prompts = [list(p) for p in ref]
    assert len(prompts) >= 14
    lengths_log = tmp_path / "yoco_lengths.log"
    probe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "engine_probe")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [probe, os.environ.get("PYTHONPATH")])))
    monkeypatch.setenv("SGLANG_TEST_YOCO_LENGTHS_LOG", str(lengths_log))
    eng = start_engine(
        model_dir, **YOCO, chunked_prefill_size=64, log_level="debug"
    )
    try:
        for p, got in zip(prompts, engine_greedy(eng, prompts, MAX_NEW)):
            assert_same_greedy(got, ref[tuple(p)], p)
        for group in (prompts[:5], prompts[5:6], prompts[6:]):
            for p, got in zip(group, engine_greedy(eng, group, MAX_NEW)):
                assert_same_greedy(got, ref[tuple(p)], p)
        # input logprobs for one request: its batch takes the full computation
        outs = eng.generate(
            input_ids=prompts[1:3],
            sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0.0},
            return_logprob=True,
            logprob_start_len=[0, -1],
        )
        for p, o in zip(prompts[1:3], outs):
            assert_same_greedy(greedy_of(o), ref[tuple(p)], p)
        assert len(outs[0]["meta_info"]["input_token_logprobs"]) == len(prompts[1])
    finally:
        eng.shutdown()
    log = capfd.readouterr().err
    fired = fast_passes(log)
    assert any(n > 1 and total > n for n, total in fired), "YOCO never fired"
    assert any(n == 0 for n, _ in fired), "an unfinished chunk was not dropped"
    assert "full pass (input-token logprobs requested)" in log
    reads = lengths_log.read_text().split()
    assert reads and set(reads) == {"host"}, reads


def flush(eng):
    """Empty the prefix cache (so the next prompts are prefilled whole); the
    scheduler refuses a flush while requests are still finishing."""
    for _ in range(200):
        if eng.flush_cache().success:
            return
        time.sleep(0.05)
    raise AssertionError("the prefix cache was never flushed")


def fast_passes(log):
    """(rows, tokens) of each prefill pass that the engine's debug log says ran
    the back half on its last tokens only."""
    return [tuple(map(int, m)) for m in re.findall(r"back half on (\d+) of (\d+) tokens", log)]


@pytest.mark.stack("yoco-model")
def test_yoco_on_equals_off(model_dir, capfd):
    """Same engine settings, YOCO on vs off, three batch mixes (one batch of 160
    requests, groups, one by one) and a batch that asks for input logprobs: same
    tokens and logprobs (fp32, CPU). The engine's log shows that with YOCO on the
    fast path ran in each mix (the back half on fewer rows than the pass's
    tokens), that the input-logprob batch turned it off, and that with YOCO off
    it never ran: were it silently off, this test fails."""
    from cpu_engine import YOCO, engine_greedy, start_engine

    prompts = _prompts(11, 12)
    rng = random.Random(5)
    many = [[rng.randrange(3, 512) for _ in range(rng.randrange(1, 40))] for _ in range(160)]
    results, logs = {}, {}
    for on in (False, True):
        eng = start_engine(
            model_dir, **(YOCO if on else {}), max_running_requests=256, log_level="debug"
        )
        capfd.readouterr()  # start-up
        try:
            results[on, "batch"] = engine_greedy(eng, prompts, MAX_NEW)
            logs[on, "batch"] = capfd.readouterr().err
            flush(eng)
            results[on, "single"] = [engine_greedy(eng, [p], MAX_NEW)[0] for p in prompts]
            logs[on, "single"] = capfd.readouterr().err
            flush(eng)
            results[on, "many"] = engine_greedy(eng, many, 2)
            logs[on, "many"] = capfd.readouterr().err
            flush(eng)
            results[on, "input logprobs"] = engine_greedy(
                eng, prompts[:4], MAX_NEW, logprob_start_len=0
            )
            logs[on, "input logprobs"] = capfd.readouterr().err
        finally:
            eng.shutdown()
    for mix in ("batch", "single", "many", "input logprobs"):
        for (t_on, lp_on), (t_off, lp_off) in zip(results[True, mix], results[False, mix]):
            assert t_on == t_off, mix
            assert max(abs(a - b) for a, b in zip(lp_on, lp_off)) <= 1e-4, mix
        assert "KV-sharing fast prefill" not in logs[False, mix], mix
    for mix in ("batch", "single", "many"):
        fired = fast_passes(logs[True, mix])
        assert any(0 < n < total for n, total in fired), f"YOCO never fired ({mix})"
    assert fast_passes(logs[True, "input logprobs"]) == []
    assert "full pass (input-token logprobs requested)" in logs[True, "input logprobs"]


@pytest.mark.stack("yoco-model")
def test_unset_min_tokens_serves_with_the_default(model_dir, capfd):
    """--kv-sharing-fast-prefill-min-tokens unset through the engine: on CPU the
    back half is not captured in CUDA graphs, so start-up resolves it to 4096;
    a 60-token pass keeps the full computation, a 4200-token one fires."""
    from cpu_engine import YOCO, engine_greedy, start_engine

    rng = random.Random(9)
    small = [[rng.randrange(3, 512) for _ in range(20)] for _ in range(3)]
    large = [[rng.randrange(3, 512) for _ in range(1400)] for _ in range(3)]
    eng = start_engine(
        model_dir,
        kv_sharing_fast_prefill=True,
        kv_sharing_fast_prefill_min_tokens=None,
        chunked_prefill_size=8192,
        log_level="debug",
    )
    try:
        engine_greedy(eng, small, 2)
        engine_greedy(eng, large, 2)
    finally:
        eng.shutdown()
    log = capfd.readouterr().err
    assert "full pass (fewer than 4096 new tokens" in log
    assert "back half on 3 of 4200 tokens" in log
