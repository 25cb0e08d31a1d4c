"""The back half of YOCO fast prefill replayed from CUDA graphs, on CPU.

CUDA graphs themselves need a GPU (benchmark/yoco_gemma4 checks them there). Here
the graph is stood in for by a replay that runs the same captured function over
the same static buffers, so what is tested is everything around the capture:
which graph a pass picks, how its rows, per-layer inputs and request geometry are
staged and padded, that the result equals the eager back half row for row, that
the graph's own triton backend builds the key lists the eager back half attends
(W + 1 sliding-window keys), how the model hands its layers to the runner, and
when start-up captures nothing.
"""

import importlib.util
import types

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from attention_stand_ins import (  # noqa: F401 (_restore_kernels: autouse fixture)
    _restore_kernels,
    make_batch,
    make_torch_native_backend,
    make_triton_backend,
)
from test_gemma4_yoco import FIRST_SHARED, _plan_all

from sglang.srt.layers import kv_sharing_fast_prefill as yoco
from sglang.srt.layers.attention import triton_backend
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.runner import kv_shared_back_half_graph_runner as kr

pytestmark = pytest.mark.stack("yoco-model", step="back-half-cuda-graphs")

END = 8
HIDDEN, PLE = 6, 3
# A decoder layer returns (hidden_states, residual) on 0.5.17; on 0.5.23 its
# output alone (the residual lives in the batch's ResidualStream).
LAYER_RETURNS_PAIR = importlib.util.find_spec("sglang.srt.layers.layer_boundary") is None


class FakeLayer(torch.nn.Module):
    """A layer whose output depends on everything a back-half layer reads: its
    row, its per-layer input and its request's geometry."""

    def __init__(self, i):
        super().__init__()
        self.i = i

    def forward(self, positions, hidden_states, per_layer_input, forward_batch):
        geo = (
            positions.double()
            + 0.5 * forward_batch.seq_lens.double()
            + 0.25 * forward_batch.req_pool_indices.double()
        )
        out = hidden_states * (1.0 + 0.1 * self.i) + geo[:, None]
        out = out + per_layer_input.sum(-1, keepdim=True) * (self.i + 1)
        return (out, None) if LAYER_RETURNS_PAIR else out


class FakeBackend:
    kv_index_translator = None  # 0.5.23's AttentionBackend default: reads no plan

    def __init__(self):
        self.calls = []

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    def init_forward_metadata_out_graph(self, fb, in_capture=False):
        self.calls.append((fb.batch_size, fb.seq_lens.tolist(), fb.seq_lens_sum, in_capture))


class EagerReplay:
    """Stands in for a CUDA graph: replay reruns the captured function."""

    def __init__(self, graphs, bs):
        self.graphs, self.bs = graphs, bs

    def replay(self):
        g = self.graphs
        g.outputs[self.bs].copy_(g._forward(self.bs, g.batches[self.bs]))


def back_half(layers=None):
    layers = layers or torch.nn.ModuleList(FakeLayer(i) for i in range(END))
    return yoco.KVSharedBackHalf(layers, FIRST_SHARED, END, HIDDEN, PLE)


def make_graphs(backend=None, capture_bs=(1, 2, 4, 8), layers=None):
    g = kr.KVSharedBackHalfGraphRunner(
        back_half(layers), backend or FakeBackend(), list(capture_bs), torch.float64, "cpu"
    )
    for bs in g.capture_bs:  # what capture() records, without a GPU
        g.batches[bs] = g._batch(bs)
        g.outputs[bs] = torch.zeros(bs, HIDDEN, dtype=torch.float64)
        g.graphs[bs] = EagerReplay(g, bs)
    return g


def with_ple(plan, ple):
    """The plan as the model hands it to the back half: the per-layer inputs of
    the back half's layers for its rows (per_layer_inputs_for_plan, with the
    model's scale and norm left out)."""
    yoco.per_layer_inputs_for_plan(plan, ple, None, lambda projection, _: projection)
    return plan


@pytest.mark.stack("yoco-model", step="back-half-cuda-graphs", fails_before=True)
def test_a_pass_replays_the_smallest_graph_that_holds_its_rows():
    g = make_graphs(capture_bs=(8, 1, 4, 2))
    assert g.capture_bs == [1, 2, 4, 8] and g.max_bs == 8
    assert g.can_run(8) and not g.can_run(9)
    for n, bs in ((1, 1), (3, 4), (5, 8), (8, 8)):
        fb = make_batch([3] * n)
        plan = with_ple(_plan_all(fb), torch.zeros(3 * n, END, PLE, dtype=torch.float64))
        plan.source, plan.graphs = fb, g
        g.backend.calls.clear()
        g.replay(plan, torch.zeros(3 * n, HIDDEN, dtype=torch.float64))
        assert g.backend.calls[-1][0] == bs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.tuples(st.integers(1, 30), st.integers(0, 40), st.booleans()),
        min_size=1,
        max_size=10,
    )
)
def test_graph_replay_equals_the_eager_back_half(monkeypatch, reqs):
    monkeypatch.setattr(yoco, "get_attn_backend", make_torch_native_backend)
    ext = [e for e, _, _ in reqs]
    pre = [p for _, p, _ in reqs]
    fb = make_batch(ext, pre, [9 if c else 0 for c in (c for _, _, c in reqs)])
    n_tok = sum(ext)
    gen = torch.Generator().manual_seed(n_tok)
    hidden = torch.randn(n_tok, HIDDEN, generator=gen, dtype=torch.float64)
    ple = torch.randn(n_tok, END, PLE, generator=gen, dtype=torch.float64)
    layers = torch.nn.ModuleList(FakeLayer(i) for i in range(END))

    eager = yoco.plan_fast_prefill(fb, FIRST_SHARED)
    if eager is None:  # no request with more than one new token: full pass
        assert yoco.plan_fast_prefill(fb, FIRST_SHARED, graphs=make_graphs()) is None
        return
    want = yoco.run_back_half(layers, with_ple(eager, ple), END, hidden)

    graphs = make_graphs(layers=layers)
    # stale values from an earlier, larger pass must not leak into this one
    graphs.hidden.fill_(7.0)
    graphs.seq_lens.fill_(99)
    plan = yoco.plan_fast_prefill(fb, FIRST_SHARED, graphs=graphs)
    if eager.num_reqs == 0:
        assert plan.graphs is None and yoco.run_back_half(layers, plan, END, hidden) is hidden
        return
    if eager.num_reqs > graphs.max_bs:  # more rows than the largest graph: eager
        assert plan.graphs is None and plan.back_metadata is not None
        return
    # nothing built before the front half: the graph stages its rows at back-half time
    assert plan.graphs is graphs and plan.back_metadata is None and plan.batch is None
    got = yoco.run_back_half(layers, with_ple(plan, ple), END, hidden)
    assert torch.equal(got, want)

    # the replay ran the bucket's graph over padded geometry: one-token rows of slot 0
    n = plan.num_reqs
    bs = next(b for b in graphs.capture_bs if b >= n)
    seq = plan.seq_lens_cpu
    assert graphs.backend.calls[-1] == (bs, seq + [1] * (bs - n), sum(seq) + bs - n, False)
    assert graphs.req_pool_indices[n:bs].tolist() == [0] * (bs - n)


def test_layer_arguments_the_graph_lacks_run_eager(monkeypatch):
    monkeypatch.setattr(yoco, "get_attn_backend", make_torch_native_backend)
    fb = make_batch([5, 3])
    graphs = make_graphs()
    plan = yoco.plan_fast_prefill(fb, FIRST_SHARED, graphs=graphs)
    seen = []

    class KwargLayer(FakeLayer):
        def forward(self, positions, hidden_states, per_layer_input, forward_batch, extra=None):
            seen.append(extra)
            return super().forward(positions, hidden_states, per_layer_input, forward_batch)

    layers = torch.nn.ModuleList(KwargLayer(i) for i in range(END))
    hidden = torch.randn(8, HIDDEN, dtype=torch.float64)
    ple = torch.randn(8, END, PLE, dtype=torch.float64)
    got = yoco.run_back_half(layers, with_ple(plan, ple), END, hidden, extra="x")
    assert seen == ["x"] * (END - FIRST_SHARED)  # the eager layers got it
    assert graphs.backend.calls == []  # no replay
    # built from the pass's batch at back-half time, as the eager plan builds it
    want = yoco.run_back_half(layers, with_ple(yoco.plan_fast_prefill(fb, FIRST_SHARED), ple), END, hidden)
    assert plan.batch.batch_size == 2 and torch.equal(got, want)


@settings(max_examples=30, deadline=None)
@given(
    window=st.sampled_from([3, 15, 63]),
    reqs=st.lists(st.tuples(st.integers(1, 90), st.integers(0, 90)), min_size=1, max_size=6),
)
def test_graph_backend_keys_are_the_eager_back_half_keys(window, reqs):
    """The graph's triton backend (decode metadata, CUDA-graph buffers) hands the
    decode kernel the same key lists as the eager back half's metadata, which
    builds its W + 1 window itself: the decode window is W + 1 keys (step triton-decode-sliding-window-width)."""
    ext = [e for e, _ in reqs]
    pre = [p for _, p in reqs]
    fb = make_batch(ext, pre)
    eager_be = make_triton_backend(window)
    back = yoco.make_back_half_batch(fb, _plan_all(fb), eager_be)
    want = eager_be.init_back_half_metadata(back, fb.extend_prefix_lens_cpu)["forward_metadata"]

    graph_be = make_triton_backend(window)
    graph_be.req_to_token = eager_be.req_to_token  # the same cache
    graph_be.token_to_kv_pool = eager_be.token_to_kv_pool
    graph_be.max_context_len, graph_be.is_draft_runner = 256, False
    graph_be.skip_prefill, graph_be.num_draft_tokens = False, None
    graph_be.init_cuda_graph_state(8, 8)  # what capture_for does
    assert graph_be.sliding_window_size == window  # the model's radius, unchanged
    graphs = make_graphs(backend=graph_be)
    n = back.batch_size
    bs = next(b for b in graphs.capture_bs if b >= n)
    graph_be.init_forward_metadata_out_graph(graphs.batches[bs], in_capture=True)
    plan = _plan_all(fb)
    plan.source, plan.graphs = fb, graphs
    hidden = torch.zeros(sum(ext), HIDDEN, dtype=torch.float64)
    ple = torch.zeros(sum(ext), END, PLE, dtype=torch.float64)
    yoco.run_back_half(graphs.back_half.layers, with_ple(plan, ple), END, hidden)  # stages, replays
    got = graph_be.forward_metadata

    for indptr, indices in (("kv_indptr", "kv_indices"), ("window_kv_indptr", "window_kv_indices")):
        w_ptr, g_ptr = getattr(want, indptr), getattr(got, indptr)
        assert g_ptr[: n + 1].tolist() == w_ptr.tolist(), indptr
        k = int(w_ptr[n])
        assert torch.equal(getattr(got, indices)[:k], getattr(want, indices)[:k]), indices


def test_the_model_hands_its_kv_shared_layers_to_the_runner():
    from sglang.srt.models.gemma4_causal import Gemma4TextModel

    layers = torch.nn.ModuleList(FakeLayer(i) for i in range(END))
    text = types.SimpleNamespace(
        layers=layers,
        end_layer=END,
        config=types.SimpleNamespace(hidden_size=HIDDEN),
        hidden_size_per_layer_input=PLE,
        fast_prefill_first_shared_layer=FIRST_SHARED,
        fast_prefill_graphs=None,
    )
    handed = []
    Gemma4TextModel.capture_kv_shared_back_half(text, lambda bh: handed.append(bh) or "graphs")
    assert handed == [yoco.KVSharedBackHalf(layers, FIRST_SHARED, END, HIDDEN, PLE)]
    assert text.fast_prefill_graphs == "graphs"
    # flag off: nothing is captured
    text.fast_prefill_first_shared_layer, text.fast_prefill_graphs = None, None
    Gemma4TextModel.capture_kv_shared_back_half(text, lambda bh: pytest.fail("captured"))
    assert text.fast_prefill_graphs is None


def test_captured_batch_is_a_decode_step():
    g = make_graphs()
    fb = g.batches[4]
    assert fb.forward_mode == ForwardMode.DECODE and fb.batch_size == 4
    assert fb.positions.data_ptr() == g.positions.data_ptr()  # static buffers
    assert fb.seq_lens.data_ptr() == g.seq_lens.data_ptr()


# ---------------------------------------------------------------- capture, with stand-ins for CUDA


def _fake_cuda_capture(monkeypatch):
    """Stand-ins for what capture() takes from CUDA and torch.distributed; returns
    the (pool, stream) each graph was captured with."""
    import contextlib

    from sglang.srt.distributed import parallel_state

    @contextlib.contextmanager
    def graph_capture(stream=None):
        yield types.SimpleNamespace(stream="capture-stream")

    recorded = []

    @contextlib.contextmanager
    def graph(g, pool=None, stream=None):
        recorded.append((pool, stream))
        yield

    monkeypatch.setattr(parallel_state, "graph_capture", graph_capture)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: "pool")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    monkeypatch.setattr(torch.cuda, "CUDAGraph", object)
    monkeypatch.setattr(torch.cuda, "graph", graph)
    return recorded


def test_capture_records_every_batch_size_under_its_own_backend(monkeypatch):
    from sglang.srt.model_executor import forward_context

    recorded = _fake_cuda_capture(monkeypatch)
    backend = FakeBackend()
    seen = []

    class BackendCheck(FakeLayer):
        def forward(self, positions, hidden_states, per_layer_input, forward_batch):
            seen.append(forward_context.get_attn_backend() is backend)
            assert not torch.is_grad_enabled()
            return super().forward(positions, hidden_states, per_layer_input, forward_batch)

    layers = torch.nn.ModuleList(BackendCheck(i) for i in range(END))
    g = kr.KVSharedBackHalfGraphRunner(
        back_half(layers), backend, [1, 2, 4, 8], torch.float64, "cpu"
    )
    g.capture()
    assert sorted(g.graphs) == sorted(g.batches) == g.capture_bs == [1, 2, 4, 8]
    # metadata from the graph buffers, largest first, before each capture
    assert [(c[0], c[3]) for c in backend.calls] == [(8, True), (4, True), (2, True), (1, True)]
    # two warm-ups and the capture, each through every KV-shared layer, all with
    # the runner's backend as the forward's attention backend
    assert len(seen) == 4 * 3 * (END - FIRST_SHARED) and all(seen)
    assert recorded == [("pool", "capture-stream")] * 4
    assert all(g.outputs[bs].shape == (bs, HIDDEN) for bs in g.capture_bs)


def _model_runner(decode_bs, draft=False):
    return types.SimpleNamespace(
        server_args=types.SimpleNamespace(enable_cudagraph_gc=False),
        is_draft_worker=draft,
        dtype=torch.float64,
        device="cpu",
        decode_bs=decode_bs,
    )


def _start_up(monkeypatch, window=15, skip=None):
    """capture_for's collaborators: the hook's decision, the decode graphs'
    batch sizes and a new triton backend (a CPU stand-in)."""
    from sglang.srt.arg_groups import kv_sharing_fast_prefill_hook as hook

    _fake_cuda_capture(monkeypatch)
    monkeypatch.setattr(hook, "back_half_graph_skip_reason", lambda server_args: skip)
    monkeypatch.setattr(kr, "get_batch_sizes_to_capture", lambda mr: (mr.decode_bs, []))
    made, be = [], make_triton_backend(window, max_bs=64)
    be.max_context_len, be.is_draft_runner = 256, False
    be.skip_prefill, be.num_draft_tokens = False, None

    def new_backend(model_runner):
        made.append(be)
        return be

    monkeypatch.setattr(triton_backend, "TritonAttnBackend", new_backend)
    return made


def test_start_up_captures_at_the_decode_batch_sizes_up_to_the_cap(monkeypatch, caplog):
    made = _start_up(monkeypatch)
    with caplog.at_level("INFO", logger=kr.__name__):
        g = kr.KVSharedBackHalfGraphRunner.capture_for(
            _model_runner([1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 128]), back_half()
        )
    assert g.capture_bs == [1, 2, 4, 8, 16, 24, 32, 48, 64] and kr.MAX_BS == 64
    assert g.backend is made[0] and made[0].sliding_window_size == 15  # the radius W
    assert g.ple.shape == (64, END - FIRST_SHARED, PLE)
    assert "captured for batch sizes [1, 2, 4, 8, 16, 24, 32, 48, 64]" in caplog.text


@pytest.mark.parametrize(
    "skip, decode_bs, draft, why",
    [
        ("--enable-deterministic-inference", [1, 2], False, "--enable-deterministic-inference"),
        (None, [1, 2], True, "draft worker"),
        (None, [80, 96], False, "no decode graph batch size up to 64"),
    ],
)
def test_start_up_captures_nothing(monkeypatch, caplog, skip, decode_bs, draft, why):
    made = _start_up(monkeypatch, skip=skip)
    with caplog.at_level("INFO", logger=kr.__name__):
        g = kr.KVSharedBackHalfGraphRunner.capture_for(_model_runner(decode_bs, draft), back_half())
    assert g is None and made == []
    assert f"back half runs eager ({why})" in caplog.text
