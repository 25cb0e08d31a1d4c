"""Stand-ins for CPU tests of attention metadata: a real ForwardBatch of a prefill,
triton / trtllm_mha / torch_native backends with just the state init_forward_metadata
reads (Triton index kernels replaced by torch), and deep snapshots to assert nothing
was written. From 0.5.23 backends carry a real, non-translating KVIndexTranslator and
batches get a KVLocPlan bound from it (bind_plan).
"""

import copy
import dataclasses
import types

import pytest
import torch
from release import RELEASE

from sglang.srt.layers.attention import triton_backend, trtllm_mha_backend
from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode

if RELEASE >= (0, 5, 23):
    from sglang.kernels.ops.attention import extend_attention, trtllm_mha_page_table
    from sglang.srt.mem_cache import kv_index_translator
    from sglang.srt.mem_cache.base_swa_memory_pool import BaseSWAKVPool
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator
else:
    from sglang.kernels.ops.kvcache import trtllm_mha_page_table


def bind_plan(be, fb, runner_slots=False):
    """Give ``fb`` a KVLocPlan of its own from ``be``'s translator (where the release
    has one): as ForwardBatch.init_new binds a pass, or (``runner_slots``) as a runner
    binds a batch it builds itself, such as the back half. Returns ``fb``."""
    if RELEASE >= (0, 5, 23):
        if be is not None:
            t = be.kv_index_translator
            (t.bind_runner_slots if runner_slots else t.bind_own_plan)(fb)
    return fb


def make_batch(extend_lens, prefix_lens=None, orig_extra=None, mode=ForwardMode.EXTEND,
               backend=None):
    """A real ForwardBatch for a prefill of `extend_lens` new tokens per request
    (orig_extra[i] > 0: request i is an unfinished chunk), bound to ``backend``."""
    bs = len(extend_lens)
    prefix_lens = prefix_lens or [0] * bs
    orig_extra = orig_extra or [0] * bs
    seq = [p + e for p, e in zip(prefix_lens, extend_lens)]
    n = sum(extend_lens)
    fb = ForwardBatch(forward_mode=mode, batch_size=bs, input_ids=torch.arange(100, 100 + n),
                      req_pool_indices=torch.arange(bs) + 1, seq_lens=torch.tensor(seq),
                      out_cache_loc=torch.arange(1000, 1000 + n), seq_lens_sum=sum(seq))
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
    return bind_plan(backend, fb)


class FakeSWAPool:
    """Full-pool slot -> SWA-pool slot translation, as SWAKVPool does it."""

    def __init__(self, size, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.full_to_swa_index_mapping = torch.randperm(size, generator=g)
        self.layers_mapping = {0: (0, True), 1: (0, False)}

    def translate_loc_from_full_to_swa(self, loc):
        return self.full_to_swa_index_mapping[loc]


if RELEASE >= (0, 5, 23):
    # A virtual subclass: the translator gives a BaseSWAKVPool a sliding-window id space.
    BaseSWAKVPool.register(FakeSWAPool)


def attach_translator(be, page_size=1):
    """0.5.23: what a ModelRunner hands a real backend, a KVIndexTranslator over its
    req_to_token and pool (non-translating: a static pool)."""
    if RELEASE >= (0, 5, 23):
        be.kv_index_translator = KVIndexTranslator(
            req_to_token=be.req_to_token, token_to_kv_pool_allocator=None,
            token_to_kv_pool=be.token_to_kv_pool, page_size=page_size, device="cpu")
        assert not be.kv_index_translator.is_translating
    return be


class _TorchKernel:
    """create_flashinfer_kv_indices_triton in torch: request i's ids
    ``ids[row_ids[i], start : start + lens[i]]`` at ``indptr[i]`` (0.5.23: through
    an optional full->swa mapping)."""

    def __getitem__(self, grid):
        def run(ids, row_ids, lens, indptr, kv_start, out, stride,
                ENTRY_PAGE_SIZE=1, TOKEN_BLOCK_PARALLEL=False, token_mapping=None):
            assert ENTRY_PAGE_SIZE == 1, "the stand-ins read token tables only"
            for i in range(grid[0]):
                start = int(kv_start[i]) if kv_start is not None else 0
                n, off = int(lens[i]), int(indptr[i])
                data = ids[int(row_ids[i])][start : start + n]
                if token_mapping is not None:
                    data = token_mapping[data.long()]
                out[off : off + n] = data

        return run


class _TorchAlignKernel:
    """0.5.23's _align_window_kv_kernel in torch: request i's window list at its
    aligned offset, led by ``pad[i]`` copies of its first key."""

    def __getitem__(self, grid):
        def run(window_kv_indptr, window_kv_indices, aligned_kv_indptr, pad,
                aligned_kv_indices, BLOCK):
            for i in range(grid[0]):
                src, end = int(window_kv_indptr[i]), int(window_kv_indptr[i + 1])
                dst, p = int(aligned_kv_indptr[i]), int(pad[i])
                j = torch.arange(end - src + p)
                aligned_kv_indices[dst : dst + len(j)] = window_kv_indices[src + (j - p).clamp(min=0)]

        return run


class _TorchPageTableKernel:
    """create_trtllm_mha_kv_indices_triton in torch: block ids of each request's
    pages (and their SWA-pool ids), the rest left unset."""

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


# (module, name, torch stand-in) of every Triton kernel the stand-ins' metadata reaches.
if RELEASE >= (0, 5, 23):
    _KERNELS = (
        (kv_index_translator, "create_flashinfer_kv_indices_triton", _TorchKernel),
        (extend_attention, "_align_window_kv_kernel", _TorchAlignKernel),
        (trtllm_mha_page_table, "create_trtllm_mha_kv_indices_triton", _TorchPageTableKernel),
    )
else:
    _KERNELS = (
        (triton_backend, "create_flashinfer_kv_indices_triton", _TorchKernel),
        (trtllm_mha_page_table, "create_trtllm_mha_kv_indices_triton", _TorchPageTableKernel),
    )


def use_torch_kernels():
    """Install the torch stand-ins (the autouse fixture _restore_kernels undoes it)."""
    for module, name, torch_kernel in _KERNELS:
        setattr(module, name, torch_kernel())


@pytest.fixture(autouse=True)
def _restore_kernels():
    kernels = [(module, name, getattr(module, name)) for module, name, _ in _KERNELS]
    yield
    for module, name, kernel in kernels:
        setattr(module, name, kernel)


def make_triton_backend(window, max_bs=16, ctx=256, pool=4096):
    """What TritonAttnBackend.init_forward_metadata reads, as __init__ sets it
    (with the torch index kernels)."""
    use_torch_kernels()
    be = object.__new__(triton_backend.TritonAttnBackend)
    g = torch.Generator().manual_seed(1)
    be.req_to_token = torch.randint(1, pool, (max_bs + 1, ctx), generator=g)
    be.__dict__.update(  # chain_verify None: split-KV verify off
        sliding_window_size=window, token_to_kv_pool=FakeSWAPool(pool), use_sliding_window_kv_pool=True,
        dcp_size=1, _translate_kv_loc=None, device="cpu", chain_verify=None, num_head=2, v_head_dim=4,
        swa_v_head_dim=None, max_kv_splits=4, static_kv_splits=True, enable_deterministic=False,
        device_core_count=1, forward_metadata=None)
    for name in ("kv_indptr", "qo_indptr", "window_kv_indptr", "mask_indptr"):
        setattr(be, name, torch.zeros(max_bs + 1, dtype=torch.int32))
    if RELEASE >= (0, 5, 23):
        be.page_size, be.max_context_len, be.num_kv_head = 1, ctx, 1
        be._dense_one_shot_kv_indptr = None  # as __init__ leaves it
        be.lean_total_programs, be.lean_block_m = 2, 16  # decode: Lean decode buffers
        be.split_tile_size = None  # static split count (set_deterministic: a tile)
        be.align_window_kv_to_tiles = extend_attention.align_window_kv_to_tiles
        attach_translator(be)
    return be


def set_deterministic(be):
    """As __init__ under --enable-deterministic-inference (0.5.23: a split tile too)."""
    be.enable_deterministic = True
    if RELEASE >= (0, 5, 23):
        be.static_kv_splits, be.split_tile_size = False, 256
        be.max_kv_splits = -(-be.max_context_len // be.split_tile_size)
    return be


def deterministic_triton_backend(g, lens, window, k_buf, v_buf, pool_size):
    """A deterministic triton backend for the real unified extend kernel: requests of
    ``lens`` tokens at random slots of a pool of K/V buffers ``k_buf``, ``v_buf``."""
    from sglang.kernels.ops.attention.extend_attention import (
        build_unified_kv_indices,
        extend_attention_fwd_unified,
    )

    pool = types.SimpleNamespace(get_key_buffer=lambda i: k_buf, get_value_buffer=lambda i: v_buf)
    bs = len(lens)
    be = object.__new__(triton_backend.TritonAttnBackend)
    be.sliding_window_size = window
    be.req_to_token = torch.zeros(bs + 1, max(lens), dtype=torch.int32)
    slots = torch.randperm(pool_size, generator=g)[: sum(lens)].to(torch.int32)
    for i, s in enumerate(lens):
        be.req_to_token[i + 1, :s] = slots[sum(lens[:i]) : sum(lens[: i + 1])]
    be.__dict__.update(  # chain_verify None: split-KV verify off
        token_to_kv_pool=pool, use_sliding_window_kv_pool=False, dcp_size=1, page_size=1, device="cpu",
        chain_verify=None, _translate_kv_loc=None, enable_deterministic=True,
        extend_attention_fwd_unified=extend_attention_fwd_unified,
        build_unified_kv_indices=build_unified_kv_indices)
    for name in ("kv_indptr", "qo_indptr", "window_kv_indptr", "mask_indptr"):
        setattr(be, name, torch.zeros(bs + 1, dtype=torch.int32))
    if RELEASE >= (0, 5, 23):  # what 0.5.23's __init__ adds for the extend path
        be.max_context_len, be._dense_one_shot_kv_indptr = max(lens), None
        be.align_window_kv_to_tiles = extend_attention.align_window_kv_to_tiles
        attach_translator(be)
    return be


def extend_batch_of(be, reqs, chunk, orig_lens):
    """make_batch for requests ``reqs`` (rows of ``be.req_to_token`` less one), each with
    ``chunk[i] = (prefix, new tokens)`` of a prompt of ``orig_lens[i]``: its new tokens
    at their req_to_token slots, int32 lengths as the unified extend kernel takes them."""
    pre, ext = [p for p, _ in chunk], [e for _, e in chunk]
    fb = make_batch(ext, pre, [o - p - e for o, (p, e) in zip(orig_lens, chunk)])
    fb.req_pool_indices = torch.tensor(reqs) + 1
    fb.out_cache_loc = torch.cat([be.req_to_token[r + 1, p : p + e].long() for r, (p, e) in zip(reqs, chunk)])
    for name in ("extend_seq_lens", "extend_prefix_lens", "extend_start_loc"):
        setattr(fb, name, getattr(fb, name).to(torch.int32))
    return bind_plan(be, fb)


def decoder_layer(window, heads, head_dim):
    """What the unified extend path reads of a RadixAttention decoder layer (layer 0)."""
    from sglang.srt.layers.radix_attention import AttentionType

    return types.SimpleNamespace(
        sliding_window_size=window, layer_id=0, tp_q_head_num=heads, qk_head_dim=head_dim,
        v_head_dim=head_dim, k_scale=None, v_scale=None, scaling=head_dim**-0.5,
        xai_temperature_len=-1, attn_type=AttentionType.DECODER, logit_cap=0.0,
    )


def make_torch_native_backend(pool=4096):
    be = object.__new__(TorchNativeAttnBackend)
    be.__dict__.update(token_to_kv_pool=FakeSWAPool(pool), use_sliding_window_kv_pool=True,
                       forward_metadata=None, swa_out_cache_loc=None)
    if RELEASE >= (0, 5, 23):
        # a translator for bind_plan, as every runner has one
        be.req_to_token = torch.zeros(17, 256, dtype=torch.int32)
        attach_translator(be)
    return be


def _snapshot(v):
    """(v, what it holds): tensors cloned, lists/dicts/dataclasses item by item."""
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
    return {k: _snapshot(v) for k, v in vars(be).items()}


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


def back_half_backend_of(be):
    """What ``be.make_back_half_backend(model_runner)`` builds, for a stand-in: the
    same pools and caches, its own index buffers and metadata."""
    back = copy.copy(be)
    for name in ("kv_indptr", "qo_indptr", "window_kv_indptr", "mask_indptr"):
        buf = vars(be).get(name)
        if isinstance(buf, torch.Tensor):
            setattr(back, name, torch.zeros_like(buf))
        elif isinstance(buf, list):
            setattr(back, name, [torch.zeros_like(b) for b in buf])
    back.forward_metadata = None
    if "swa_out_cache_loc" in vars(be):
        back.swa_out_cache_loc = None
    return back


def batch_state(fb):
    """A deep snapshot of a ForwardBatch (assert_same_batch checks it)."""
    return {k: _snapshot(v) for k, v in vars(fb).items()}


def assert_same_batch(fb, before):
    after = batch_state(fb)
    assert after.keys() == before.keys()
    for k in before:
        _assert_same(after[k], before[k], f"forward_batch.{k}")


def back_half_batch(fb, extend=False, backend=None):
    """The back half of pass ``fb`` for every request: a decode step of each last
    token over its whole sequence, or (``extend``) an extend of it over a cached
    prefix of seq_len - 1; bound to ``backend`` as the fast prefill binds it."""
    n, seq = fb.batch_size, fb.seq_lens
    last = torch.cumsum(fb.extend_seq_lens, 0) - 1
    b = ForwardBatch(forward_mode=ForwardMode.EXTEND if extend else ForwardMode.DECODE, batch_size=n,
                     input_ids=fb.input_ids[last], req_pool_indices=fb.req_pool_indices, seq_lens=seq,
                     out_cache_loc=fb.out_cache_loc[last], seq_lens_sum=int(seq.sum()),
                     positions=fb.positions[last])
    b.seq_lens_cpu = seq.clone()
    if extend:
        b.__dict__.update(extend_num_tokens=n, extend_seq_lens=torch.ones(n, dtype=seq.dtype),
                          extend_prefix_lens=seq - 1, extend_start_loc=torch.arange(n),
                          extend_seq_lens_cpu=[1] * n, extend_prefix_lens_cpu=(seq - 1).tolist())
    return bind_plan(backend, b, runner_slots=True)


def make_trtllm_backend(page_size, max_bs=16, ctx=256, pool=8192):
    """What TRTLLMHAAttnBackend.init_forward_metadata reads, plus the state a real
    one keeps between passes (index buffers, decode CUDA-graph buffers filled with
    -1), which must stay unwritten; with the torch index kernels."""
    use_torch_kernels()
    be = object.__new__(trtllm_mha_backend.TRTLLMHAAttnBackend)
    g = torch.Generator().manual_seed(2)
    be.device, be.page_size, be.max_context_len, be.max_num_pages = "cpu", page_size, ctx, ctx // page_size
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
    if RELEASE >= (0, 5, 23):
        be.use_fmha_v2 = False  # the fmha_v2 prefill's page copy: another kernel
        attach_translator(be, page_size)
    be.init_cuda_graph_state(max_bs, max_bs)
    for buf in [*be.decode_cuda_graph_metadata.values(), be.cuda_graph_swa_out_cache_loc]:
        buf.fill_(-1)
    be.forward_metadata = None
    return be


def make_decode_batch(req_pool_indices, seq_lens, out_cache_loc, backend=None):
    """A genuine decode step (one new token per request, in seq_lens), bound to ``backend``."""
    fb = ForwardBatch(forward_mode=ForwardMode.DECODE, batch_size=len(seq_lens),
                      input_ids=torch.arange(len(seq_lens)), req_pool_indices=req_pool_indices,
                      seq_lens=seq_lens, out_cache_loc=out_cache_loc, seq_lens_sum=int(seq_lens.sum()))
    return bind_plan(backend, fb)


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
