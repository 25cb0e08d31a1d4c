"""Step triton-decode-sliding-window-width with the unified memory pool: a
decode CUDA graph's sliding window holds sliding_window_size + 1 keys a
request, and the replay's out-of-graph translation (virtual ids to SWA-pool
slots) must cover all of them. It counted sliding_window_size a request, so
the last key of each request past the window stayed a virtual id.
"""

import pytest
import torch

from attention_stand_ins import (  # noqa: F401 (_restore_kernels: autouse fixture)
    _restore_kernels,
    _TorchKernel,
    make_triton_backend,
)

from sglang.srt.layers.attention import triton_backend
from sglang.srt.model_executor.forward_batch_info import ForwardBatch, ForwardMode

# 0.5.23 translates the window inside its index kernel, with the window's own width.
pytestmark = pytest.mark.stack(
    "generic-fixes", step="triton-decode-sliding-window-width", bases=("0.5.17",)
)

MAX_BS, CTX = 8, 96


def unified_pool_backend(window):
    be = make_triton_backend(window, max_bs=MAX_BS, ctx=CTX)
    g = torch.Generator().manual_seed(2)
    virtual_to_physical = torch.randperm(4096, generator=g)
    be._translate_kv_loc = lambda loc: virtual_to_physical[loc]
    be.cuda_graph_kv_indices = torch.zeros(MAX_BS * CTX, dtype=torch.int64)
    be.cuda_graph_window_kv_indices = torch.zeros(MAX_BS * (window + 1), dtype=torch.int64)
    be.cuda_graph_num_kv_splits = torch.zeros(MAX_BS, dtype=torch.int32)
    be.cuda_graph_window_num_kv_splits = torch.zeros(MAX_BS, dtype=torch.int32)
    be.cuda_graph_swa_out_cache_loc = torch.zeros(MAX_BS, dtype=torch.int64)
    be.cuda_graph_out_cache_loc_full_physical = torch.zeros(MAX_BS, dtype=torch.int64)
    return be


def decode_batch(seq_lens):
    bs = len(seq_lens)
    fb = ForwardBatch(
        forward_mode=ForwardMode.DECODE,
        batch_size=bs,
        input_ids=torch.arange(bs),
        req_pool_indices=torch.arange(bs) + 1,
        seq_lens=torch.tensor(seq_lens),
        out_cache_loc=torch.arange(3000, 3000 + bs),
        seq_lens_sum=sum(seq_lens),
    )
    fb.seq_lens_cpu = torch.tensor(seq_lens)
    return fb


@pytest.mark.parametrize(
    "window, seq_lens",
    [
        (16, [40]),  # one request past the window
        (16, [3, 17, 16, 90]),  # shorter, one past, at the radius, far past
        (7, [8, 8, 8, 8, 8, 8, 8, 8]),  # every request exactly window + 1
    ],
)
def test_decode_graph_replay_translates_the_whole_window(monkeypatch, window, seq_lens):
    monkeypatch.setattr(triton_backend, "create_flashinfer_kv_indices_triton", _TorchKernel())
    be = unified_pool_backend(window)
    fb = decode_batch(seq_lens)

    be.init_forward_metadata_out_graph(fb, in_capture=False)  # what a replay runs

    indptr = be.window_kv_indptr
    for i, s in enumerate(seq_lens):
        keys = min(s, window + 1)  # the query's own key and sliding_window_size before it
        assert int(indptr[i + 1] - indptr[i]) == keys
        virtual = be.req_to_token[i + 1, s - keys : s]
        got = be.cuda_graph_window_kv_indices[int(indptr[i]) : int(indptr[i + 1])]
        want = be.token_to_kv_pool.translate_loc_from_full_to_swa(virtual)
        assert torch.equal(got, want), f"request {i} (seq_len {s}): window not all in SWA-pool slots"
