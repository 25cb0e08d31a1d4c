"""The back half of YOCO fast prefill replayed from CUDA graphs, on CPU: a replay reruns
the captured function over the same static buffers (real graphs: benchmark/yoco_gemma4),
so what is tested is around the capture: which graph a pass picks, how rows, per-layer
inputs and geometry are staged and padded, equality with the eager back half, the graph
backend's key lists, and when start-up captures.
"""

import types

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from release import RELEASE
from attention_stand_ins import (  # noqa: F401 (_restore_kernels: autouse fixture)
    _restore_kernels, make_batch, make_torch_native_backend, make_triton_backend)
from test_gemma4_yoco import FIRST_SHARED, planner, stream_back_half, stream_rows

from sglang.srt.layers import kv_sharing_fast_prefill as yoco_model
from sglang.srt.model_executor import kv_sharing_fast_prefill_plan as yoco
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.runner import kv_shared_back_half_graph_runner as kr

pytestmark = pytest.mark.stack("yoco-model", step="back-half-cuda-graphs")

END = 8
HIDDEN, PLE = 6, 3


class FakeLayer(torch.nn.Module):
    """A layer whose output depends on everything a back-half layer reads: its
    row, its per-layer input and its request's geometry."""

    def __init__(self, i):
        super().__init__()
        self.i = i

    def forward(self, positions, hidden_states, per_layer_input, forward_batch):
        fb = forward_batch
        geo = positions.double() + 0.5 * fb.seq_lens.double() + 0.25 * fb.req_pool_indices.double()
        out = hidden_states * (1.0 + 0.1 * self.i) + geo[:, None]
        out = out + per_layer_input.sum(-1, keepdim=True) * (self.i + 1)
        if RELEASE >= (0, 5, 23):
            # a decoder layer returns its output alone (the residual lives in the
            # batch's ResidualStream)
            return out
        return out, None  # a decoder layer returns (hidden_states, residual)


class FakeBackend:
    if RELEASE >= (0, 5, 23):
        kv_index_translator = None  # its AttentionBackend default: reads no plan

    def __init__(self):
        self.calls = []

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    def back_half_is_extend(self):
        return False

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
    return yoco_model.KVSharedBackHalf(layers, FIRST_SHARED, END, HIDDEN, PLE)


def make_graphs(backend=None, capture_bs=(1, 2, 4, 8), layers=None, declared=None):
    """Graphs of ``declared`` (default: back_half(layers)), as capture() records them,
    without a GPU."""
    g = kr.KVSharedBackHalfGraphRunner(declared or back_half(layers), yoco.BackHalfAttention(
        backend or FakeBackend()), list(capture_bs), torch.float64, "cpu")
    for bs in g.capture_bs:
        g.batches[bs] = g._batch(bs)
        g.outputs[bs] = torch.zeros_like(g._rows(g.hidden, bs))
        g.graphs[bs] = EagerReplay(g, bs)
    return g


def eager_attention():
    return yoco.BackHalfAttention(make_torch_native_backend())


@pytest.mark.stack("yoco-model", step="back-half-cuda-graphs", fails_before=True)
def test_a_pass_replays_the_smallest_graph_that_holds_its_rows():
    g = make_graphs(capture_bs=(8, 1, 4, 2))
    assert g.capture_bs == [1, 2, 4, 8] and g.max_bs == 8
    assert g.can_run(8) and not g.can_run(9)
    for n, bs in ((1, 1), (3, 4), (5, 8), (8, 8)):
        fb = make_batch([3] * n)
        rows = yoco.back_half_rows(fb, FIRST_SHARED)
        g.backend.calls.clear()
        plan = g.plan(rows, fb)
        assert plan.bs == bs and g.backend.calls[-1][0] == bs
        ple = torch.zeros(3 * n, END, PLE, dtype=torch.float64)
        assert plan.run(fb, torch.zeros(3 * n, HIDDEN, dtype=torch.float64), ple).shape == (3 * n, HIDDEN)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(0, 40), st.booleans()), min_size=1, max_size=10))
def test_graph_replay_equals_the_eager_back_half(reqs):
    attn = eager_attention()
    ext = [e for e, _, _ in reqs]
    fb = make_batch(ext, [p for _, p, _ in reqs], [9 if c else 0 for _, _, c in reqs])
    n_tok = sum(ext)
    gen = torch.Generator().manual_seed(n_tok)
    hidden = torch.randn(n_tok, HIDDEN, generator=gen, dtype=torch.float64)
    ple = torch.randn(n_tok, END, PLE, generator=gen, dtype=torch.float64)
    layers = torch.nn.ModuleList(FakeLayer(i) for i in range(END))

    eager = planner(attn, back_half=back_half(layers)).plan(fb)
    graphed = planner(attn, back_half=back_half(layers))
    graphs = graphed.graphs = make_graphs(layers=layers)
    # stale values from an earlier, larger pass must not leak into this one
    graphs.hidden.fill_(7.0)
    graphs.seq_lens.fill_(99)
    plan = graphed.plan(fb)
    if eager is None:  # no request with more than one new token: full pass
        assert plan is None
        return
    want = eager.run(fb, hidden, ple)
    if eager.num_reqs == 0:
        assert isinstance(plan, yoco.FrontOnlyPlan) and plan.run(fb, hidden, ple) is hidden
        return
    if eager.num_reqs > graphs.max_bs:  # more rows than the largest graph: eager
        assert isinstance(plan, yoco.EagerBackHalfPlan)
        return
    # planning staged the bucket's geometry before the front half: padded with
    # one-token rows of slot 0; the split then only gathers the hidden rows
    assert isinstance(plan, kr.GraphBackHalfPlan) and plan.graphs is graphs
    n = plan.num_reqs
    bs = next(b for b in graphs.capture_bs if b >= n)
    seq = list(plan.rows.seq_lens_cpu)
    staged = (bs, seq + [1] * (bs - n), sum(seq) + bs - n, False)
    assert plan.bs == bs and graphs.backend.calls[-1] == staged
    assert graphs.req_pool_indices[n:bs].tolist() == [0] * (bs - n)
    assert torch.equal(plan.run(fb, hidden, ple), want)
    assert graphs.backend.calls[-1] == staged  # not staged again at the split


@settings(max_examples=30, deadline=None)
@given(
    window=st.sampled_from([3, 15, 63]),
    reqs=st.lists(st.tuples(st.integers(1, 90), st.integers(0, 90)), min_size=1, max_size=6),
)
def test_graph_backend_keys_are_the_eager_back_half_keys(window, reqs):
    """The graph's triton backend (decode metadata in CUDA-graph buffers) hands the kernel
    the eager back half's key lists: W + 1 window keys (step triton-decode-sliding-window-width)."""
    ext = [e for e, _ in reqs]
    fb = make_batch(ext, [p for _, p in reqs])
    rows = yoco.back_half_rows(fb, FIRST_SHARED)
    eager_be = make_triton_backend(window)
    back = yoco.make_back_half_batch(fb, rows)
    eager_be.init_back_half_metadata(back, rows.prefix_lens_cpu)
    want = eager_be.forward_metadata

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
    graphs.plan(rows, fb)  # stages the rows' metadata
    got = graph_be.forward_metadata

    for indptr, indices in (("kv_indptr", "kv_indices"), ("window_kv_indptr", "window_kv_indices")):
        w_ptr, g_ptr = getattr(want, indptr), getattr(got, indptr)
        assert g_ptr[: n + 1].tolist() == w_ptr.tolist(), indptr
        k = int(w_ptr[n])
        assert torch.equal(getattr(got, indices)[:k], getattr(want, indices)[:k]), indices


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
        back_half(layers), yoco.BackHalfAttention(backend), [1, 2, 4, 8], torch.float64, "cpu"
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


def _model_runner(decode_bs):
    return types.SimpleNamespace(server_args=types.SimpleNamespace(enable_cudagraph_gc=False),
                                 dtype=torch.float64, device="cpu", decode_bs=decode_bs)


def _start_up(monkeypatch, window=15):
    """capture_for's collaborators: the decode graphs' batch sizes and the back
    half's attention (a CPU stand-in of its triton backend), recording whether
    its CUDA-graph buffers were made."""
    _fake_cuda_capture(monkeypatch)
    monkeypatch.setattr(kr, "get_batch_sizes_to_capture", lambda mr: (mr.decode_bs, []))
    made, be = [], make_triton_backend(window, max_bs=64)
    be.max_context_len, be.is_draft_runner = 256, False
    be.skip_prefill, be.num_draft_tokens = False, None
    init_cuda_graph_state = be.init_cuda_graph_state

    def recorded(*args):
        made.append(args)
        init_cuda_graph_state(*args)

    be.init_cuda_graph_state = recorded
    return yoco.BackHalfAttention(be), made


def test_start_up_captures_at_the_decode_batch_sizes_up_to_the_cap(monkeypatch, caplog):
    attn, made = _start_up(monkeypatch)
    with caplog.at_level("INFO", logger=kr.__name__):
        g = kr.KVSharedBackHalfGraphRunner.capture_for(
            _model_runner([1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 128]), back_half(), attn
        )
    assert g.capture_bs == [1, 2, 4, 8, 16, 24, 32, 48, 64] and kr.MAX_BS == 64
    # the eager back half's attention, with CUDA-graph buffers for the largest size
    assert g.attention is attn and g.backend is attn.backend and made == [(64, 64)]
    assert attn.backend.sliding_window_size == 15  # the radius W
    assert g.ple.shape == (64, END - FIRST_SHARED, PLE)
    assert "captured for batch sizes [1, 2, 4, 8, 16, 24, 32, 48, 64]" in caplog.text


def test_start_up_never_falls_back_at_capture(monkeypatch):
    # whether the back half is captured is decided once, at start-up (the hook's
    # back_half_graph_skip_reason, on the same sizes): the graph runner does not decide
    # again, and says why it cannot capture where a size the hook saw was dropped
    attn, made = _start_up(monkeypatch)
    with pytest.raises(RuntimeError, match="no decode CUDA graph batch size up to 64"):
        kr.KVSharedBackHalfGraphRunner.capture_for(_model_runner([80, 96]), back_half(), attn)
    assert made == []
    assert kr.capture_batch_sizes([128, 64, 1, 96, 8]) == [1, 8, 64]


@pytest.mark.parametrize("decided", [True, False])
def test_the_planner_captures_where_start_up_decided(monkeypatch, decided):
    # the hook's kv_sharing_fast_prefill_back_half_graphs: captured there only, and planned on
    from sglang.srt.model_executor import kv_sharing_fast_prefill_planner as kp

    features = types.SimpleNamespace(kv_sharing_fast_prefill_min_tokens=0,
                                     kv_sharing_fast_prefill_back_half_graphs=decided)
    monkeypatch.setattr(kp, "get_exec", lambda: types.SimpleNamespace(features=features))
    attn, made = _start_up(monkeypatch)
    p = planner(attn, back_half=back_half())
    p.settings = kp.FastPrefillSettings.resolved()  # as for_model_runner reads them, once
    p.capture_graphs(_model_runner([1, 2, 4]))
    assert (p.graphs is not None) == decided and made == ([(4, 4)] if decided else [])
    plan = p.plan(make_batch([5, 3]))
    assert isinstance(plan, kr.GraphBackHalfPlan if decided else yoco.EagerBackHalfPlan)


@pytest.mark.stack("yoco-model", step="back-half-cuda-graphs", fails_before=True)
@pytest.mark.parametrize("streams", [0, 3])
@pytest.mark.parametrize("reqs", [[(5, 0)], [(3, 2), (9, 0), (4, 7)], [(2, 0)] * 5])
def test_a_graph_plan_replays_what_the_eager_plan_runs(streams, reqs):
    # rows staged along the token dimension into buffers sized by the declared streams
    declared = stream_back_half(streams)
    graphs = make_graphs(declared=declared)
    assert graphs.hidden.shape == ((streams,) if streams else ()) + (8, declared.hidden_size)
    graphs.hidden.fill_(7.0)  # stale rows of an earlier pass must not leak

    fb = make_batch([e for e, _ in reqs], [p for _, p in reqs])
    hidden, ple = stream_rows(streams, sum(fb.extend_seq_lens_cpu), len(reqs))
    eager = planner(back_half=declared).plan(fb)
    graphed = planner(back_half=declared)
    graphed.graphs = graphs
    plan = graphed.plan(fb)
    assert isinstance(plan, kr.GraphBackHalfPlan) and plan.graphs is graphs
    assert torch.equal(plan.run(fb, hidden, ple), eager.run(fb, hidden, ple))
