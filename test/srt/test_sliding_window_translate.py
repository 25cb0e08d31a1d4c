"""Step window-translate-without-sync (layers/attention/sliding_window_translate.py): the triton
backend's sliding-window indices are translated to the SWA pool without a
device-to-host sync, and give what stock 0.5.17's sliced translation gave.
0.5.17 only: 0.5.23's index kernel takes the full-to-SWA map and has no such
sync (its series does not need the step).

On CPU a sync shows as the aten op behind ``.item()`` / ``__index__``
(``_local_scalar_dense``); a dispatch mode counts those.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attention_stand_ins import FakeSWAPool, _TorchKernel

from sglang.srt.layers.attention import triton_backend
from sglang.srt.layers.attention.sliding_window_translate import (
    translate_window_in_place,
)

pytestmark = pytest.mark.stack(
    "frozen-kv-mtp-speed", step="window-translate-without-sync", bases=("0.5.17",)
)


class HostReads(TorchDispatchMode):
    """Counts device-to-host scalar reads."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.count += 1
        return func(*args, **(kwargs or {}))


def stock_translate(pool, window_kv_indices, window_kv_indptr):
    """stock 0.5.17's translation (slices by the window's end)."""
    end = window_kv_indptr[-1]
    window_kv_indices[:end] = pool.translate_loc_from_full_to_swa(window_kv_indices[:end])


def problem(bs, window, seed, pool=4096, ctx=300, buf=None):
    g = torch.Generator().manual_seed(seed)
    req_to_token = torch.randint(1, pool, (bs + 3, ctx), generator=g)
    seq_lens = torch.randint(1, ctx, (bs,), generator=g)
    req_pool_indices = torch.randperm(bs + 3, generator=g)[:bs]
    indptr = torch.zeros(bs + 8, dtype=torch.int32)
    # a graph buffer from an earlier, larger step: stale ids past this step's end
    indices = None if buf is None else torch.randint(1, pool, (buf,), generator=g)
    return req_to_token, seq_lens, req_pool_indices, indptr, indices


@pytest.mark.parametrize("bs, window, buf", [(1, 8, None), (5, 16, None), (7, 33, 7 * 33 + 50), (16, 512, 16 * 512)])
@pytest.mark.parametrize("seed", [0, 1])
def test_same_indices_as_stock_and_stale_tail_kept(monkeypatch, bs, window, buf, seed):
    monkeypatch.setattr(triton_backend, "create_flashinfer_kv_indices_triton", _TorchKernel())
    pool = FakeSWAPool(4096)
    req_to_token, seq_lens, rpi, indptr, indices = problem(bs, window, seed, buf=buf)
    out = triton_backend.update_sliding_window_buffer(
        indptr.clone(), req_to_token, window, seq_lens, rpi, bs, device="cpu",
        token_to_kv_pool=pool, window_kv_indices=None if indices is None else indices.clone(),
    )
    # stock: the same fill without translation, then the sliced translation
    ref = triton_backend.update_sliding_window_buffer(
        indptr.clone(), req_to_token, window, seq_lens, rpi, bs, device="cpu",
        token_to_kv_pool=pool, window_kv_indices=None if indices is None else indices.clone(),
        skip_full_to_swa_translation=True,
    )
    stock_translate(pool, ref[1], ref[0])
    assert torch.equal(out[0], ref[0])
    assert torch.equal(out[1], ref[1])  # the whole buffer, stale tail included
    end = int(out[0][-1])
    assert end == int(torch.minimum(seq_lens, torch.tensor(window)).sum())
    if indices is not None:
        assert torch.equal(out[1][end:], indices[end:])  # untouched past the end


@pytest.mark.stack(
    "frozen-kv-mtp-speed",
    step="window-translate-without-sync",
    fails_before=True,
    bases=("0.5.17",),
)
def test_translation_reads_nothing_on_the_host():
    pool = FakeSWAPool(4096)
    bs, window = 6, 32
    g = torch.Generator().manual_seed(3)
    indices = torch.randint(1, 4096, (bs * window + 40,), generator=g)
    lens = torch.randint(1, window + 1, (bs,), generator=g)
    indptr = torch.zeros(bs + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(lens, 0)
    ref = indices.clone()
    stock_translate(pool, ref, indptr)
    with HostReads() as reads:
        translate_window_in_place(pool, indices, indptr, bs, window)
    assert reads.count == 0
    assert torch.equal(indices, ref)
    # the stock slicing does read the end on the host (what this patch removes)
    with HostReads() as reads:
        stock_translate(pool, indices.clone(), indptr)
    assert reads.count >= 1


def test_graph_buffer_update_reads_nothing_on_the_host(monkeypatch):
    """The whole graph-path update (CUDA-graph window buffer given) is sync-free
    once the index kernel is a launch (here: a stand-in that records its call)."""
    launched = []
    monkeypatch.setattr(
        triton_backend,
        "create_flashinfer_kv_indices_triton",
        type("K", (), {"__getitem__": lambda self, grid: lambda *a: launched.append(grid)})(),
    )
    pool = FakeSWAPool(4096)
    bs, window = 4, 64
    req_to_token, seq_lens, rpi, indptr, _ = problem(bs, window, 5)
    buf = torch.zeros(32 * window, dtype=torch.int64)
    with HostReads() as reads:
        triton_backend.update_sliding_window_buffer(
            indptr, req_to_token, window, seq_lens, rpi, bs,
            token_to_kv_pool=pool, window_kv_indices=buf,
        )
    assert launched == [(bs,)]
    assert reads.count == 0
