"""Stand-ins for CPU tests of attention metadata: a real ForwardBatch of a
prefill, triton / trtllm_mha / torch_native backends with just the state their
init_forward_metadata reads (their Triton index kernels replaced by torch), and
a deep snapshot of a backend to assert that nothing it holds was written.
"""

import dataclasses

import pytest
import torch

from sglang.kernels.ops.kvcache import trtllm_mha_page_table
from sglang.srt.layers.attention import triton_backend, trtllm_mha_backend
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    ForwardBatch,
    ForwardMode,
)


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
    be._back_half_index_buffers = None  # as __init__ leaves it
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
        if k != "_back_half_index_buffers"  # made on first use
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


def back_half_batch(fb, extend=False):
    """The back half of pass ``fb`` for every request, as the fast prefill shapes
    it: a decode step of each request's last token over its whole sequence, or
    (``extend``) an extend of that token over a cached prefix of seq_len - 1."""
    n, seq = fb.batch_size, fb.seq_lens
    last = torch.cumsum(fb.extend_seq_lens, 0) - 1
    b = ForwardBatch(
        forward_mode=ForwardMode.EXTEND if extend else ForwardMode.DECODE,
        batch_size=n,
        input_ids=fb.input_ids[last],
        req_pool_indices=fb.req_pool_indices,
        seq_lens=seq,
        out_cache_loc=fb.out_cache_loc[last],
        seq_lens_sum=int(seq.sum()),
        positions=fb.positions[last],
    )
    b.seq_lens_cpu = seq.clone()
    if extend:
        b.extend_num_tokens = n
        b.extend_seq_lens = torch.ones(n, dtype=seq.dtype)
        b.extend_prefix_lens = seq - 1
        b.extend_start_loc = torch.arange(n)
        b.extend_seq_lens_cpu = [1] * n
        b.extend_prefix_lens_cpu = (seq - 1).tolist()
    return b


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
