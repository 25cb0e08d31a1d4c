"""YOCO fast prefill (--kv-sharing-fast-prefill) for Gemma-4, on CPU.

Unit tests: when the fast path may run, which rows it runs on, and the back-half
attention metadata (triton, trtllm_mha and torch_native) with an exact restore.
End to end: the fork's engine with YOCO on matches Hugging Face transformers and
YOCO off.
"""

import dataclasses
import os
import random
import re
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang.kernels.ops.kvcache import trtllm_mha_page_table
from sglang.srt.layers import kv_sharing_fast_prefill as yoco
from sglang.srt.layers.attention import triton_backend, trtllm_mha_backend
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)

pytestmark = pytest.mark.stack("yoco-model", step="gemma4-fast-prefill-branch")

FIRST_SHARED = 4  # tiny model: 8 layers, 4 KV-shared


def make_batch(extend_lens, prefix_lens=None, orig_extra=None, mode=ForwardMode.EXTEND):
    """A real ForwardBatch for a prefill of `extend_lens` new tokens per request.
    orig_extra[i] > 0 marks request i as an unfinished chunk (more prompt left)."""
    bs = len(extend_lens)
    prefix_lens = prefix_lens or [0] * bs
    orig_extra = orig_extra or [0] * bs
    seq = [p + e for p, e in zip(prefix_lens, extend_lens)]
    n = sum(extend_lens)
    fb = ForwardBatch(
        forward_mode=mode,
        batch_size=bs,
        input_ids=torch.arange(100, 100 + n),
        req_pool_indices=torch.arange(bs) + 1,
        seq_lens=torch.tensor(seq),
        out_cache_loc=torch.arange(1000, 1000 + n),
        seq_lens_sum=sum(seq),
    )
    fb.seq_lens_cpu = torch.tensor(seq)
    fb.orig_seq_lens = torch.tensor([s + x for s, x in zip(seq, orig_extra)])
    fb.extend_seq_lens_cpu = list(extend_lens)
    fb.extend_prefix_lens_cpu = list(prefix_lens)
    fb.extend_seq_lens = torch.tensor(extend_lens)
    fb.extend_prefix_lens = torch.tensor(prefix_lens)
    fb.extend_start_loc = torch.cumsum(torch.tensor([0] + extend_lens[:-1]), 0)
    fb.extend_num_tokens = n
    fb.positions = torch.cat([torch.arange(p, s) for p, s in zip(prefix_lens, seq)])
    fb.capture_hidden_mode = CaptureHiddenMode.NULL
    return fb


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


def test_unset_min_tokens_means_the_default():
    assert yoco.DEFAULT_MIN_TOKENS == 4096
    below = make_batch([4000, 95])
    assert "fewer than 4096 new tokens" in yoco.fast_prefill_skip_reason(below, FIRST_SHARED, min_tokens=None)
    assert yoco.fast_prefill_skip_reason(make_batch([4000, 96]), FIRST_SHARED, min_tokens=None) is None


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


def test_plan_builds_a_decode_shaped_back_half_batch(monkeypatch):
    backend = make_torch_native_backend()
    monkeypatch.setattr(yoco, "get_attn_backend", lambda: backend)
    # request 1 is an unfinished chunk; request 2 has a single new token
    fb = make_batch([4, 6, 1, 3], prefix_lens=[0, 2, 9, 5], orig_extra=[0, 5, 0, 0])
    plan = yoco.plan_fast_prefill(fb, FIRST_SHARED)
    assert plan.num_reqs == 3
    assert plan.req_index.tolist() == [0, 2, 3]
    assert plan.token_index.tolist() == [3, 10, 13]
    b = plan.batch
    assert b.forward_mode == ForwardMode.DECODE and b.batch_size == 3
    assert b.seq_lens.tolist() == [4, 10, 8] == plan.seq_lens_cpu
    assert b.seq_lens_sum == 22
    assert b.req_pool_indices.tolist() == [1, 3, 4]
    assert b.positions.tolist() == [3, 9, 7]  # position of each last token
    assert b.out_cache_loc.tolist() == [1003, 1010, 1013]
    assert b.input_ids.tolist() == [103, 110, 113]
    assert b.extend_seq_lens is None and b.spec_info is None
    # the pass's own batch is untouched
    assert fb.forward_mode == ForwardMode.EXTEND and fb.batch_size == 4


def test_plan_with_only_an_unfinished_chunk_runs_no_back_half(monkeypatch):
    backend = make_torch_native_backend()
    monkeypatch.setattr(yoco, "get_attn_backend", lambda: backend)
    plan = yoco.plan_fast_prefill(make_batch([64], orig_extra=[100]), FIRST_SHARED)
    assert plan.num_reqs == 0 and plan.batch is None
    h = torch.randn(64, 8)
    assert yoco.run_back_half([], plan, 8, h) is h


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
def test_per_layer_inputs_of_the_back_half_only_on_its_rows(monkeypatch, with_embeddings):
    """With a plan, the model finishes the per-layer inputs of the back half's
    layers for the plan's rows only, the front layers' for every row: bit for
    bit the full computation's values there (bf16). An unfinished chunk's plan
    gets none."""
    monkeypatch.setattr(yoco, "get_attn_backend", make_torch_native_backend)
    layers, dim, hidden = 8, 16, 24
    _, project = _ple_model(layers, dim, hidden)
    fb = make_batch([5, 1, 9, 3], prefix_lens=[0, 4, 2, 0], orig_extra=[0, 0, 0, 7])
    n_tok = sum(fb.extend_seq_lens_cpu)
    g = torch.Generator().manual_seed(1)
    emb = torch.randn(n_tok, hidden, generator=g).to(torch.bfloat16)
    raw = torch.randn(n_tok, layers, dim, generator=g).to(torch.bfloat16) if with_embeddings else None
    full = project(emb, raw)
    plan = yoco.plan_fast_prefill(fb, FIRST_SHARED)
    front = project(emb, raw, plan)
    rows = plan.token_index
    assert rows.tolist() == [4, 5, 14]  # request 3 is an unfinished chunk
    assert torch.equal(front, full[:, :FIRST_SHARED])
    assert torch.equal(plan.back_per_layer_inputs, full[rows, FIRST_SHARED:])

    chunk = yoco.plan_fast_prefill(make_batch([6], orig_extra=[9]), FIRST_SHARED)
    assert chunk.num_reqs == 0
    front = project(emb[:6], raw[:6] if raw is not None else None, chunk)
    assert torch.equal(front, full[:6, :FIRST_SHARED]) and chunk.back_per_layer_inputs is None


# ---------------------------------------------------------------- metadata


class FakeSWAPool:
    """Full-pool slot -> SWA-pool slot translation, as SWAKVPool does it."""

    def __init__(self, size, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.full_to_swa_index_mapping = torch.randperm(size, generator=g)
        self.layers_mapping = {0: (0, True), 1: (0, False)}

    def translate_loc_from_full_to_swa(self, loc):
        return self.full_to_swa_index_mapping[loc]


class _TorchKernel:
    """create_flashinfer_kv_indices_triton, in torch, for CPU tests."""

    def __getitem__(self, grid):
        def run(req_to_token, req_pool_indices, lens, kv_indptr, kv_start, kv_indices, stride):
            for i in range(grid[0]):
                start = int(kv_start[i]) if kv_start is not None else 0
                n = int(lens[i])
                off = int(kv_indptr[i])
                row = req_to_token[int(req_pool_indices[i])]
                kv_indices[off : off + n] = row[start : start + n]

        return run


def make_triton_backend(window, max_bs=16, ctx=256, pool=4096):
    be = object.__new__(triton_backend.TritonAttnBackend)
    g = torch.Generator().manual_seed(1)
    be.sliding_window_size = window
    be.req_to_token = torch.randint(1, pool, (max_bs + 1, ctx), generator=g)
    be.token_to_kv_pool = FakeSWAPool(pool)
    be.use_sliding_window_kv_pool = True
    be.dcp_size = 1
    be._translate_kv_loc = None
    be.device = "cpu"
    be.chain_verify = None  # __init__ sets it (split-KV verify off)
    be.num_head, be.v_head_dim, be.swa_v_head_dim = 2, 4, None
    be.max_kv_splits, be.static_kv_splits, be.enable_deterministic = 4, True, False
    be.device_core_count = 1
    for name in ("kv_indptr", "qo_indptr", "window_kv_indptr", "mask_indptr"):
        setattr(be, name, torch.zeros(max_bs + 1, dtype=torch.int32))
    be.forward_metadata = None
    return be


def make_torch_native_backend(pool=4096):
    be = object.__new__(TorchNativeAttnBackend)
    be.token_to_kv_pool = FakeSWAPool(pool)
    be.use_sliding_window_kv_pool = True
    be.forward_metadata = None
    be.swa_out_cache_loc = None
    return be


def _snapshot(v):
    """(v, what it holds): tensors cloned, lists/dicts/dataclasses (a pass's
    metadata, CUDA-graph buffer tables) snapshotted item by item."""
    if isinstance(v, torch.Tensor):
        return v, v.clone()
    if isinstance(v, (list, tuple)):
        return v, [_snapshot(x) for x in v]
    if isinstance(v, dict):
        return v, {k: _snapshot(x) for k, x in v.items()}
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return v, {f.name: _snapshot(getattr(v, f.name)) for f in dataclasses.fields(v)}
    return v, None


def backend_state(be):
    return {
        k: _snapshot(v)
        for k, v in vars(be).items()
        if k != "_kv_sharing_fast_prefill_scratch"
    }


def _assert_same(after, before, where):
    (obj, held), (obj_before, held_before) = after, before
    assert obj is obj_before, where  # same object, not an equal copy
    if isinstance(held_before, torch.Tensor):
        assert torch.equal(held, held_before), where  # and not written
    elif held_before is not None:
        assert type(held) is type(held_before) and len(held) == len(held_before), where
        keys = held_before.keys() if isinstance(held_before, dict) else range(len(held_before))
        for k in keys:
            _assert_same(held[k], held_before[k], f"{where}[{k!r}]")


def assert_same_state(be, before):
    after = backend_state(be)
    assert after.keys() == before.keys()
    for k in before:
        _assert_same(after[k], before[k], k)


@settings(max_examples=40, deadline=None)
@given(
    window=st.sampled_from([3, 15, 63, 400]),
    reqs=st.lists(
        st.tuples(st.integers(1, 120), st.integers(0, 100)), min_size=1, max_size=6
    ),
)
def test_triton_back_half_metadata_is_one_query_per_request(window, reqs):
    be = make_triton_backend(window)
    triton_backend.create_flashinfer_kv_indices_triton = _TorchKernel()
    ext = [e for e, _ in reqs]
    pre = [p for _, p in reqs]
    fb = make_batch(ext, pre)
    # The pass's own (front-half) metadata lives in the persistent buffers.
    be.kv_indptr[1 : len(ext) + 1] = torch.cumsum(torch.tensor(pre), 0)
    be.qo_indptr[1 : len(ext) + 1] = torch.cumsum(torch.tensor(ext), 0)
    be.forward_metadata = object()
    before = backend_state(be)

    back = yoco.make_back_half_batch(fb, _plan_all(fb))
    attrs = yoco.build_back_half_metadata(be, back)
    assert_same_state(be, before)  # building touched nothing of the pass's
    meta = attrs["forward_metadata"]

    seq = [p + e for p, e in zip(pre, ext)]
    rows = [be.req_to_token[i + 1] for i in range(len(seq))]
    # full-attention layers: every key of the sequence, as a decode step reads it
    assert meta.kv_indptr.tolist() == [0] + torch.cumsum(torch.tensor(seq), 0).tolist()
    assert torch.equal(meta.kv_indices, torch.cat([r[:s] for r, s in zip(rows, seq)]))
    # sliding layers: the extend pass's window, W + 1 keys ending at the token
    w = [min(s, window + 1) for s in seq]
    assert meta.window_kv_indptr.tolist() == [0] + torch.cumsum(torch.tensor(w), 0).tolist()
    expect = torch.cat([r[s - k : s] for r, s, k in zip(rows, seq, w)])
    assert torch.equal(meta.window_kv_indices, be.token_to_kv_pool.translate_loc_from_full_to_swa(expect))
    # the swapped-in metadata is swapped out again, exactly
    with yoco.back_half_attention(be, attrs):
        assert be.forward_metadata is meta
    assert_same_state(be, before)


@settings(max_examples=40, deadline=None)
@given(
    window=st.sampled_from([3, 15, 63, 400]),
    reqs=st.lists(
        st.tuples(st.integers(1, 120), st.integers(0, 100)), min_size=1, max_size=6
    ),
)
def test_deterministic_triton_back_half_is_an_extend_with_the_full_pass_key_layout(
    window, reqs
):
    be = make_triton_backend(window)
    be.enable_deterministic = True
    triton_backend.create_flashinfer_kv_indices_triton = _TorchKernel()
    ext = [e + 1 for e, _ in reqs]  # > 1 new token, so the plan fires
    pre = [p for _, p in reqs]
    fb = make_batch(ext, pre)
    be.forward_metadata = object()
    before = backend_state(be)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(yoco, "get_attn_backend", lambda: be)
        plan = yoco.plan_fast_prefill(fb, FIRST_SHARED)
    assert_same_state(be, before)
    back, meta = plan.batch, plan.back_attrs["forward_metadata"]
    seq = [p + e for p, e in zip(pre, ext)]
    n = len(seq)
    assert back.forward_mode == ForwardMode.EXTEND and back.batch_size == n
    assert back.extend_seq_lens.tolist() == [1] * n == back.extend_seq_lens_cpu
    assert back.extend_prefix_lens.tolist() == [s - 1 for s in seq] == back.extend_prefix_lens_cpu
    assert back.extend_start_loc.tolist() == list(range(n))
    assert meta.qo_indptr.tolist() == list(range(n + 1)) and meta.max_extend_len == 1
    rows = [be.req_to_token[i + 1] for i in range(n)]
    # full-attention layers: every cached key before the token, from key 0
    assert meta.kv_indptr.tolist() == [0] + torch.cumsum(torch.tensor(seq) - 1, 0).tolist()
    assert torch.equal(meta.kv_indices, torch.cat([r[: s - 1] for r, s in zip(rows, seq)]))
    # sliding layers: the cached keys before the token, from where the full
    # pass's window started (its prefix minus up to W keys), not the last W
    start = [p - min(p, window) for p in pre]
    w = [s - 1 - b for s, b in zip(seq, start)]
    assert meta.window_kv_indptr.tolist() == [0] + torch.cumsum(torch.tensor(w), 0).tolist()
    expect = torch.cat([r[b : s - 1] for r, s, b in zip(rows, seq, start)])
    assert torch.equal(meta.window_kv_indices, be.token_to_kv_pool.translate_loc_from_full_to_swa(expect))
    assert meta.window_kv_offsets.tolist() == start
    with yoco.back_half_attention(be, plan.back_attrs):
        assert be.forward_metadata is meta
    assert_same_state(be, before)


def test_default_triton_back_half_stays_a_decode_step(monkeypatch):
    be = make_triton_backend(15)
    monkeypatch.setattr(yoco, "get_attn_backend", lambda: be)
    triton_backend.create_flashinfer_kv_indices_triton = _TorchKernel()
    plan = yoco.plan_fast_prefill(make_batch([9, 30], [0, 4]), FIRST_SHARED)
    assert plan.batch.forward_mode == ForwardMode.DECODE


def test_triton_metadata_restored_when_the_back_half_raises():
    be = make_triton_backend(15)
    triton_backend.create_flashinfer_kv_indices_triton = _TorchKernel()
    fb = make_batch([9, 30])
    be.forward_metadata = object()
    before = backend_state(be)
    attrs = yoco.build_back_half_metadata(be, yoco.make_back_half_batch(fb, _plan_all(fb)))
    with pytest.raises(RuntimeError):
        with yoco.back_half_attention(be, attrs):
            raise RuntimeError("layer failed")
    assert_same_state(be, before)


def test_torch_native_back_half_metadata_and_restore():
    be = make_torch_native_backend()
    fb = make_batch([9, 30, 2])
    be.swa_out_cache_loc = be.token_to_kv_pool.translate_loc_from_full_to_swa(fb.out_cache_loc)
    before = backend_state(be)
    back = yoco.make_back_half_batch(fb, _plan_all(fb))
    attrs = yoco.build_back_half_metadata(be, back)
    assert_same_state(be, before)
    assert torch.equal(
        attrs["swa_out_cache_loc"],
        be.token_to_kv_pool.translate_loc_from_full_to_swa(back.out_cache_loc),
    )
    with yoco.back_half_attention(be, attrs):
        assert be.swa_out_cache_loc is attrs["swa_out_cache_loc"]
    assert_same_state(be, before)


def _plan_all(fb):
    reqs = list(range(fb.batch_size))
    rows = yoco.last_token_rows(fb.extend_seq_lens_cpu, reqs)
    return yoco.FastPrefillPlan(
        first_shared_layer=FIRST_SHARED,
        token_index=torch.tensor(rows),
        req_index=torch.tensor(reqs),
        num_reqs=len(reqs),
        seq_lens_cpu=fb.seq_lens_cpu.tolist(),
        prefix_lens_cpu=list(fb.extend_prefix_lens_cpu),
    )


@pytest.fixture(autouse=True)
def _restore_kernels():
    kernels = (
        triton_backend.create_flashinfer_kv_indices_triton,
        trtllm_mha_page_table.create_trtllm_mha_kv_indices_triton,
    )
    yield
    (
        triton_backend.create_flashinfer_kv_indices_triton,
        trtllm_mha_page_table.create_trtllm_mha_kv_indices_triton,
    ) = kernels


# ---------------------------------------------------------------- trtllm_mha


class _TorchPageTableKernel:
    """create_trtllm_mha_kv_indices_triton, in torch, for CPU tests: block ids
    of each request's pages (and their SWA-pool ids), the rest left unset."""

    def __getitem__(self, grid):
        def run(req_to_token, req_pool_indices, seq_lens, full_to_swa, page_table,
                swa_page_table, full_to_swa_numel, req_to_token_stride,
                page_table_stride, PAGE_SIZE, HAS_SWA):
            for b in range(grid[0]):
                n = -(-int(seq_lens[b]) // PAGE_SIZE)
                slots = req_to_token[int(req_pool_indices[b]), : n * PAGE_SIZE : PAGE_SIZE]
                page_table[b, :n] = slots // PAGE_SIZE
                if HAS_SWA:
                    swa = full_to_swa[slots.clamp(0, full_to_swa_numel - 1)]
                    swa_page_table[b, :n] = swa // PAGE_SIZE

        return run


def make_trtllm_backend(page_size, max_bs=16, ctx=256, pool=8192):
    """What TRTLLMHAAttnBackend.init_forward_metadata reads, plus the state a
    real one keeps between passes (FlashInfer index buffers it inherits, its
    decode CUDA-graph buffers, here filled with -1), which must stay unwritten.
    Installs the torch page-table kernel (the autouse fixture restores Triton's)."""
    trtllm_mha_page_table.create_trtllm_mha_kv_indices_triton = _TorchPageTableKernel()
    be = object.__new__(trtllm_mha_backend.TRTLLMHAAttnBackend)
    g = torch.Generator().manual_seed(2)
    be.device = "cpu"
    be.page_size = page_size
    be.max_context_len = ctx
    be.max_num_pages = ctx // page_size
    # whole pages per request, as the paged allocator hands them out
    pages = torch.randperm(pool // page_size, generator=g)[: (max_bs + 1) * be.max_num_pages]
    slots = pages.view(max_bs + 1, -1, 1) * page_size + torch.arange(page_size)
    be.req_to_token = slots.view(max_bs + 1, ctx).to(torch.int32)
    swa = FakeSWAPool(pool)  # also page by page, as SWAKVPool allocates
    perm = torch.randperm(pool // page_size, generator=g)
    swa.full_to_swa_index_mapping = (perm.view(-1, 1) * page_size + torch.arange(page_size)).view(-1)
    be._swa_kv_pool = be.token_to_kv_pool = swa
    be._swa_full_to_swa_mapping = swa.full_to_swa_index_mapping
    be.use_sliding_window_kv_pool = True
    be.expand_encoder_only_verify = False
    be.speculative_step_id, be.speculative_num_draft_tokens = 0, None
    be.kv_indptr = [torch.zeros(max_bs + 1, dtype=torch.int32)]
    be.qo_indptr = [torch.zeros(max_bs + 1, dtype=torch.int32)]
    be.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32)
    be.init_cuda_graph_state(max_bs, max_bs)
    for buf in [*be.decode_cuda_graph_metadata.values(), be.cuda_graph_swa_out_cache_loc]:
        buf.fill_(-1)
    be.forward_metadata = None
    return be


def make_decode_batch(req_pool_indices, seq_lens, out_cache_loc):
    """A genuine decode step: one new token per request, already in seq_lens."""
    return ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=len(seq_lens),
        input_ids=torch.arange(len(seq_lens)),
        req_pool_indices=req_pool_indices,
        seq_lens=seq_lens,
        out_cache_loc=out_cache_loc,
        seq_lens_sum=int(seq_lens.sum()),
    )


def trtllm_keys(be, meta, b, window_left, swa):
    """KV slots the trtllm-gen kernels read for the last query of request b.
    Their mask (flashinfer's launcher sets mAttentionWindowSize = window_left + 1
    for context and decode kernels alike): query i of a request with q_len
    queries sits at p = cache_seqlens - q_len + i and sees the keys k with
    p - window_left <= k <= p (every k <= p when window_left is -1)."""
    q_len = int(meta.cu_seqlens_q[b + 1] - meta.cu_seqlens_q[b])
    i = q_len - 1
    p = int(meta.cache_seqlens_int32[b]) - q_len + i
    k = torch.arange(max(0, p - window_left) if window_left >= 0 else 0, p + 1)
    table = meta.swa_page_table if swa else meta.page_table
    return table[b, k // be.page_size].long() * be.page_size + k % be.page_size


def assert_same_trtllm_metadata(got, want, seq_lens, page_size):
    """Field by field; page-table rows only as far as the request's pages (the
    rest of those torch.empty rows is never read)."""
    pages = [-(-s // page_size) for s in seq_lens]
    for f in dataclasses.fields(got):
        a, b = getattr(got, f.name), getattr(want, f.name)
        if f.name in ("page_table", "swa_page_table"):
            assert a.shape == b.shape, f.name
            for i, n in enumerate(pages):
                assert torch.equal(a[i, :n], b[i, :n]), f.name
        elif isinstance(b, torch.Tensor):
            assert a.dtype == b.dtype and torch.equal(a, b), f.name
        else:
            assert a == b, f.name


@settings(max_examples=40, deadline=None)
@given(
    page_size=st.sampled_from([1, 16, 64]),
    window=st.sampled_from([-1, 0, 3, 15, 63, 400]),
    reqs=st.lists(
        st.tuples(st.integers(1, 120), st.integers(0, 100)), min_size=1, max_size=6
    ),
)
def test_trtllm_back_half_metadata_is_a_decode_step(page_size, window, reqs):
    be = make_trtllm_backend(page_size)
    ext = [e for e, _ in reqs]
    pre = [p for _, p in reqs]
    fb = make_batch(ext, pre)
    be.init_forward_metadata(fb)  # the pass's own (front-half) metadata
    pass_meta = be.forward_metadata
    before = backend_state(be)

    back = yoco.make_back_half_batch(fb, _plan_all(fb))
    attrs = yoco.build_back_half_metadata(be, back)
    assert_same_state(be, before)  # building touched nothing of the pass's
    assert be._kv_sharing_fast_prefill_scratch == {}  # so no twins are needed
    meta = attrs["forward_metadata"]

    # what trtllm_mha builds for a genuine decode step of these requests
    seq = [p + e for p, e in zip(pre, ext)]
    last = torch.tensor(yoco.last_token_rows(ext, range(len(ext))))
    ref = make_trtllm_backend(page_size)
    ref.init_forward_metadata(
        make_decode_batch(fb.req_pool_indices, fb.seq_lens, fb.out_cache_loc[last])
    )
    assert_same_trtllm_metadata(meta, ref.forward_metadata, seq, page_size)
    # ... which is: one query per request over its whole sequence
    assert meta.max_seq_len_q == 1
    assert meta.cache_seqlens_int32.tolist() == seq
    assert meta.cu_seqlens_q.tolist() == list(range(len(seq) + 1))
    assert meta.cu_seqlens_k.tolist() == [0] + torch.cumsum(torch.tensor(seq), 0).tolist()
    swa = be.token_to_kv_pool.translate_loc_from_full_to_swa
    assert torch.equal(meta.swa_out_cache_loc, swa(fb.out_cache_loc[last]))
    # Each request's last token reads, in full and sliding layers, the keys it
    # reads in the extend pass: the last window + 1 of its sequence (no W + 1
    # fix-up as for triton: the window is the kernels', not the metadata's).
    for b, s in enumerate(seq):
        row = be.req_to_token[b + 1, max(0, s - 1 - window) if window >= 0 else 0 : s]
        for is_swa, slots in ((False, row.long()), (True, swa(row.long()))):
            keys = trtllm_keys(be, meta, b, window, is_swa)
            assert torch.equal(keys, slots)
            assert torch.equal(keys, trtllm_keys(be, pass_meta, b, window, is_swa))
    # the swapped-in metadata is swapped out again, exactly
    with yoco.back_half_attention(be, attrs):
        assert be.forward_metadata is meta
    assert_same_state(be, before)


def test_trtllm_decode_metadata_is_allocated_per_call():
    """Called directly (no scratch twins), trtllm_mha's decode
    init_forward_metadata writes nothing the backend holds and returns
    tensors that share no storage with it."""
    be = make_trtllm_backend(16)
    fb = make_batch([9, 30, 2], [5, 0, 40])
    be.init_forward_metadata(fb)
    before = backend_state(be)
    pass_meta = be.forward_metadata
    be.init_forward_metadata(
        make_decode_batch(fb.req_pool_indices, fb.seq_lens, torch.tensor([1013, 1038, 1040]))
    )
    new, be.forward_metadata = be.forward_metadata, pass_meta
    assert_same_state(be, before)

    def storages(snap):
        obj, held = snap
        if isinstance(obj, torch.Tensor):
            yield obj.untyped_storage().data_ptr()
        elif held is not None and not isinstance(held, torch.Tensor):
            for x in held.values() if isinstance(held, dict) else held:
                yield from storages(x)

    held = {p for snap in before.values() for p in storages(snap)}
    assert held.isdisjoint(storages(_snapshot(new)))


def test_trtllm_metadata_restored_when_the_back_half_raises():
    be = make_trtllm_backend(16)
    fb = make_batch([9, 30])
    be.init_forward_metadata(fb)
    before = backend_state(be)
    attrs = yoco.build_back_half_metadata(be, yoco.make_back_half_batch(fb, _plan_all(fb)))
    with pytest.raises(RuntimeError):
        with yoco.back_half_attention(be, attrs):
            assert be.forward_metadata is attrs["forward_metadata"]
            raise RuntimeError("layer failed")
    assert_same_state(be, before)


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
    fired = [tuple(map(int, m)) for m in re.findall(r"back half on (\d+) of (\d+) tokens", log)]
    assert any(n > 1 and total > n for n, total in fired), "YOCO never fired"
    assert any(n == 0 for n, _ in fired), "an unfinished chunk was not dropped"
    assert "full pass (input-token logprobs requested)" in log
    reads = lengths_log.read_text().split()
    assert reads and set(reads) == {"host"}, reads


@pytest.mark.stack("yoco-model")
def test_yoco_on_equals_off(model_dir):
    """Same engine settings, YOCO on vs off, three batch mixes (one batch of 160
    requests, groups, one by one): same tokens and logprobs (fp32, CPU)."""
    from cpu_engine import YOCO, engine_greedy, start_engine

    prompts = _prompts(11, 12)
    rng = random.Random(5)
    many = [[rng.randrange(3, 512) for _ in range(rng.randrange(1, 40))] for _ in range(160)]
    results = {}
    for on in (False, True):
        eng = start_engine(model_dir, **(YOCO if on else {}), max_running_requests=256)
        try:
            results[on, "batch"] = engine_greedy(eng, prompts, MAX_NEW)
            eng.flush_cache()
            results[on, "single"] = [engine_greedy(eng, [p], MAX_NEW)[0] for p in prompts]
            eng.flush_cache()
            results[on, "many"] = engine_greedy(eng, many, 2)
        finally:
            eng.shutdown()
    for mix in ("batch", "single", "many"):
        for (t_on, lp_on), (t_off, lp_off) in zip(results[True, mix], results[False, mix]):
            assert t_on == t_off, mix
            assert max(abs(a - b) for a, b in zip(lp_on, lp_off)) <= 1e-4, mix


@pytest.mark.stack("yoco-model")
def test_unset_min_tokens_serves_with_the_default(model_dir, capfd):
    """--kv-sharing-fast-prefill-min-tokens unset (step back-half-cuda-graphs) through the engine:
    on CPU the back half is not captured in CUDA graphs, so the default 4096
    applies; a 60-token pass keeps the full computation, a 4200-token one fires."""
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
