"""YOCO fast prefill (--kv-sharing-fast-prefill) for Gemma-3n, on CPU.

Gemma-3n reuses the shared fast-prefill module (test_gemma4_yoco.py tests its
predicate and plan); what it declares differently is tested here: rows of
several AltUp streams per token, layers that return their next streams, the
per-layer inputs, the architectures the flag accepts. End to end: the tiny
Gemma-3n (tiny_gemma3n.py, the last 4 of 8 layers KV-shared) served with YOCO
on equals YOCO off equals Hugging Face transformers, and the engine's log shows
that the fast path ran (or was turned off) where it should.
"""

import contextlib
import copy
import os
import random
import re
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
)
from tiny_gemma3n import TINY_TEXT_CONFIG, make_tiny_gemma3n

from sglang.srt.layers import kv_sharing_fast_prefill as yoco
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

pytestmark = pytest.mark.stack("yoco-model", step="gemma3n-fast-prefill-branch")

FIRST_SHARED = 4  # tiny model: 8 layers, 4 KV-shared
END = 8
STREAMS, HIDDEN, PLE = 3, 6, 2


class StreamLayer(torch.nn.Module):
    """A stand-in for a Gemma-3n decoder layer: takes [streams, tokens, hidden],
    returns the next streams (no residual), each row from its own streams, its
    per-layer input and its request's geometry."""

    def __init__(self, i):
        super().__init__()
        self.i = i

    def forward(self, positions, hidden_states, per_layer_input, forward_batch):
        assert hidden_states.dim() == 3 and per_layer_input.dim() == 2
        # a back-half batch: one row per request
        geo = positions.double() + 0.5 * forward_batch.seq_lens.double()
        mixed = hidden_states.roll(1, dims=0) * (1.0 + 0.1 * self.i)
        return mixed + geo[None, :, None] + per_layer_input.sum(-1)[None, :, None]


def stream_layers():
    return torch.nn.ModuleList(StreamLayer(i) for i in range(END))


def back_ple(plan, ple):
    return yoco.per_layer_inputs_for_plan(plan, ple, None, lambda projection, _: projection)[1]


# ---------------------------------------------------------------- the back half on streams


@pytest.mark.stack("yoco-model", step="back-half-layer-call-and-streams", fails_before=True)
def test_back_half_runs_every_stream_of_its_rows_and_leaves_the_pass_untouched():
    """The back half on [streams, tokens, hidden] rows with layers that return
    their next streams (PLAIN_LAYER_CALL): each finishing request's last token,
    every stream, equals the layers run on the whole pass there; the other rows
    keep the front half's values; the pass's backend and batch are unchanged."""
    be = make_triton_backend(15)
    # request 1 is an unfinished chunk, request 2 has a single new token
    fb = make_batch([9, 30, 1, 4], [0, 4, 7, 2], [0, 5, 0, 0], backend=be)
    be.init_forward_metadata(fb)
    before, batch_before = backend_state(be), batch_state(fb)
    plan = yoco.plan_fast_prefill(
        fb, FIRST_SHARED, attention=yoco.BackHalfAttention(back_half_backend_of(be))
    )
    n_tok = sum(fb.extend_seq_lens_cpu)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(STREAMS, n_tok, HIDDEN, generator=g, dtype=torch.float64)
    ple = torch.randn(n_tok, END, PLE, generator=g, dtype=torch.float64)
    layers = stream_layers()
    with forward_context(ForwardContext(attn_backend=be)):
        got = yoco.run_back_half(
            layers, plan, END, hidden, back_ple(plan, ple), token_dim=1,
            layer_call=yoco.PLAIN_LAYER_CALL,
        )
    rows = plan.rows.token_index
    assert rows.tolist() == [8, 39, 43]
    # the layers on the back half's own batch: its rows' positions and lengths
    want = hidden.index_select(1, rows)
    for i in range(FIRST_SHARED, END):
        want = layers[i](plan.batch.positions, want, ple[rows, i], plan.batch)
    assert torch.equal(got[:, rows], want)
    keep = [t for t in range(n_tok) if t not in rows.tolist()]
    assert torch.equal(got[:, keep], hidden[:, keep])
    assert_same_state(be, before)
    assert_same_batch(fb, batch_before)


class EagerReplay:
    """Stands in for a CUDA graph: replay reruns the captured function."""

    def __init__(self, graphs, bs):
        self.graphs, self.bs = graphs, bs

    def replay(self):
        g = self.graphs
        g.outputs[self.bs].copy_(g._forward(self.bs, g.batches[self.bs]))


class FakeGraphBackend:
    kv_index_translator = None

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    def back_half_is_extend(self):
        return False

    def init_forward_metadata_out_graph(self, fb, in_capture=False):
        pass


@pytest.mark.stack("yoco-model", step="back-half-layer-call-and-streams", fails_before=True)
@pytest.mark.parametrize("reqs", [[(5, 0)], [(3, 2), (9, 0), (4, 7)], [(2, 0)] * 5])
def test_graph_replay_of_stream_rows_equals_the_eager_back_half(reqs):
    """The back half's graphs size their buffer by the declared streams and
    stage and return the rows along the token dimension."""
    from sglang.srt.model_executor.runner import kv_shared_back_half_graph_runner as kr

    layers = stream_layers()
    back_half = yoco.KVSharedBackHalf(
        layers, FIRST_SHARED, END, HIDDEN, PLE, streams=STREAMS, layer_call=yoco.PLAIN_LAYER_CALL
    )
    assert back_half.token_dim == 1
    graphs = kr.KVSharedBackHalfGraphRunner(
        back_half, yoco.BackHalfAttention(FakeGraphBackend()), [1, 2, 4, 8], torch.float64, "cpu"
    )
    assert graphs.hidden.shape == (STREAMS, 8, HIDDEN)
    for bs in graphs.capture_bs:  # what capture() records, without a GPU
        graphs.batches[bs] = graphs._batch(bs)
        graphs.outputs[bs] = torch.zeros(STREAMS, bs, HIDDEN, dtype=torch.float64)
        graphs.graphs[bs] = EagerReplay(graphs, bs)
    graphs.hidden.fill_(7.0)  # stale rows of an earlier pass must not leak

    fb = make_batch([e for e, _ in reqs], [p for _, p in reqs])
    n_tok = sum(fb.extend_seq_lens_cpu)
    g = torch.Generator().manual_seed(n_tok)
    hidden = torch.randn(STREAMS, n_tok, HIDDEN, generator=g, dtype=torch.float64)
    ple = torch.randn(n_tok, END, PLE, generator=g, dtype=torch.float64)
    eager = yoco.plan_fast_prefill(
        fb, FIRST_SHARED, attention=yoco.BackHalfAttention(make_torch_native_backend())
    )
    want = yoco.run_back_half(
        layers, eager, END, hidden, back_ple(eager, ple), token_dim=1,
        layer_call=yoco.PLAIN_LAYER_CALL,
    )
    plan = yoco.plan_fast_prefill(fb, FIRST_SHARED, graphs=graphs)
    assert plan.graphs is graphs
    got = yoco.run_back_half(layers, plan, END, hidden, back_ple(plan, ple), token_dim=1)
    assert torch.equal(got, want)


# ---------------------------------------------------------------- the model


def test_gemma3n_declares_its_back_half():
    """What the model runner reads through SupportsKVSharingFastPrefill: the
    KV-shared layers, with every AltUp stream and layers that return their
    next streams, while the flag is on; None otherwise."""
    from sglang.srt.models.gemma3n_causal import Gemma3nForCausalLM, Gemma3nTextModel
    from sglang.srt.models.gemma3n_mm import Gemma3nForConditionalGeneration

    assert issubclass(Gemma3nForCausalLM, yoco.SupportsKVSharingFastPrefill)
    assert issubclass(Gemma3nForConditionalGeneration, yoco.SupportsKVSharingFastPrefill)
    layers = stream_layers()
    cfg = types.SimpleNamespace(**{k: v for k, v in TINY_TEXT_CONFIG.items()})
    text = types.SimpleNamespace(
        layers=layers,
        config=cfg,
        hidden_size_per_layer_input=cfg.hidden_size_per_layer_input,
        fast_prefill_first_shared_layer=yoco.first_kv_shared_layer(cfg),
    )
    for name in ("kv_shared_back_half", "set_back_half_attention", "set_back_half_graphs"):
        setattr(text, name, types.MethodType(getattr(Gemma3nTextModel, name), text))
    assert text.kv_shared_back_half() == yoco.KVSharedBackHalf(
        layers, FIRST_SHARED, END, 64, 8, streams=4, layer_call=yoco.PLAIN_LAYER_CALL
    )
    attn = yoco.BackHalfAttention(make_torch_native_backend())
    for model_cls, inner in (
        (Gemma3nForCausalLM, "model"),
        (Gemma3nForConditionalGeneration, "language_model"),
    ):
        outer = types.SimpleNamespace(**{inner: text})
        model_cls.set_back_half_attention(outer, attn)
        model_cls.set_back_half_graphs(outer, "graphs")
        assert text.fast_prefill_attention is attn and text.fast_prefill_graphs == "graphs"
        assert model_cls.kv_shared_back_half(outer).streams == 4
    text.fast_prefill_first_shared_layer = None  # flag off
    assert Gemma3nTextModel.kv_shared_back_half(text) is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_embeddings", [True, False])
def test_per_layer_inputs_of_the_back_half_only_on_its_rows(dtype, with_embeddings):
    """Gemma-3n's per-layer inputs with a plan: the front layers' for every row,
    the back half's layers' for the plan's rows only, bit for bit the full
    computation's values there (its real norm)."""
    from sglang.srt.models.gemma3n_causal import Gemma3nRMSNorm, Gemma3nTextModel

    layers, dim, hidden = 8, 16, 24
    g = torch.Generator().manual_seed(2)
    norm = Gemma3nRMSNorm(dim, 1e-6).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(dim, generator=g))
    w = torch.randn(layers * dim, hidden, generator=g).to(dtype)
    m = types.SimpleNamespace(
        per_layer_model_projection=lambda x: (x @ w.t(), None),
        per_layer_projection_scale=torch.tensor(hidden**-0.5),
        per_layer_projection_norm=norm,
        per_layer_input_scale=torch.rsqrt(torch.tensor(2.0)),
        hidden_size_per_layer_input=dim,
        config=types.SimpleNamespace(num_hidden_layers=layers),
    )
    m._combine_per_layer_inputs = types.MethodType(Gemma3nTextModel._combine_per_layer_inputs, m)
    project = lambda *a: Gemma3nTextModel.project_per_layer_inputs(m, *a)

    fb = make_batch([5, 1, 9, 3], prefix_lens=[0, 4, 2, 0], orig_extra=[0, 0, 0, 7])
    n_tok = sum(fb.extend_seq_lens_cpu)
    emb = torch.randn(n_tok, hidden, generator=g).to(dtype)
    raw = torch.randn(n_tok, layers, dim, generator=g).to(dtype) if with_embeddings else None
    full = project(emb, raw)
    attn = yoco.BackHalfAttention(make_torch_native_backend())
    plan = yoco.plan_fast_prefill(fb, FIRST_SHARED, attention=attn)
    front, back = project(emb, raw, plan)
    rows = plan.rows.token_index
    assert rows.tolist() == [4, 5, 14]
    assert torch.equal(front, full[:, :FIRST_SHARED])
    assert torch.equal(back, full[rows, FIRST_SHARED:])


# ---------------------------------------------------------------- the flag accepts Gemma-3n


def _gemma3n_args(tmp_path, **text_overrides):
    import json

    from cpu_engine import YOCO

    from resolved_server_args import build

    cfg = dict(TINY_TEXT_CONFIG, **text_overrides)
    path = tmp_path / "gemma3n"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(cfg))
    return lambda: build(
        model_path=str(path), device="cpu", attention_backend="torch_native",
        skip_tokenizer_init=True, **YOCO,
    )


@pytest.mark.stack("yoco-model", step="gemma3n-fast-prefill-branch", fails_before=True)
def test_gemma3n_with_kv_shared_layers_accepted(tmp_path):
    from resolved_server_args import model_config, with_model_config

    from sglang.srt.arg_groups import kv_sharing_fast_prefill_hook as hook

    args = _gemma3n_args(tmp_path)()
    assert hook._check_model(args) == (FIRST_SHARED, END)
    # the released E2B/E4B checkpoints are Gemma3nForConditionalGeneration
    config = copy.copy(model_config(args))
    config.hf_config = copy.copy(config.hf_config)
    config.hf_config.architectures = ["Gemma3nForConditionalGeneration"]
    assert hook._check_model(with_model_config(args, config)) == (FIRST_SHARED, END)


def test_gemma3n_without_kv_shared_layers_rejected(tmp_path):
    with pytest.raises(ValueError) as info:
        _gemma3n_args(tmp_path, num_kv_shared_layers=0)()
    msg = str(info.value)
    assert "--kv-sharing-fast-prefill" in msg and "Gemma-3n" in msg
    assert "Gemma3nForCausalLM" in msg and "num_kv_shared_layers=0" in msg


# ---------------------------------------------------------------- end to end

MAX_NEW = 5
CHUNK = 37  # odd, below several prompts: unfinished chunks and chunk tails


@contextlib.contextmanager
def _stderr_to(path):
    """The processes started inside the block write their stderr (the engine's
    debug log) to ``path``; this process's is restored afterwards."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


class LoggedEngine:
    """An engine whose scheduler's debug log goes to a file; ``new_log()`` is
    what it logged since the last call."""

    def __init__(self, model_dir, log_path, **overrides):
        from cpu_engine import start_engine

        self.log_path, self.offset = log_path, 0
        with _stderr_to(log_path):
            self.engine = start_engine(model_dir, log_level="debug", **overrides)
        self.new_log()

    def new_log(self):
        with open(self.log_path) as f:
            f.seek(self.offset)
            text = f.read()
            self.offset = f.tell()
        return text

    def flush(self):
        """Empty the prefix cache, so the next prompts are prefilled whole."""
        import time

        for _ in range(200):
            if self.engine.flush_cache().success:
                return
            time.sleep(0.05)
        raise AssertionError("the prefix cache was never flushed")


def _prompts(seed, n):
    rng = random.Random(seed)
    vocab = TINY_TEXT_CONFIG["vocab_size"]
    shared = [rng.randrange(3, vocab) for _ in range(40)]
    out = []
    for i in range(n):
        tail = [rng.randrange(3, vocab) for _ in range(rng.choice([1, 2, 9, 20, 45, 80]))]
        out.append(shared + tail if i % 3 == 0 else tail)
    return out


@pytest.fixture(scope="module")
def g3n_dir(tmp_path_factory):
    return make_tiny_gemma3n(str(tmp_path_factory.mktemp("tiny_gemma3n_yoco")), seed=0)


@pytest.fixture(scope="module")
def g3n_ref(g3n_dir):
    from cpu_engine import HFReference, decisive_prompts

    hf = HFReference(g3n_dir, causal_lm="Gemma3nForCausalLM")
    ref = decisive_prompts(hf, _prompts(3, 14), MAX_NEW)
    assert len(ref) >= 11
    return ref


@pytest.fixture(scope="module")
def g3n_engines(g3n_dir, tmp_path_factory):
    """YOCO off and on, otherwise the same engine: chunked prefill at an odd
    chunk, room for a batch of every prompt."""
    from cpu_engine import YOCO

    logs = tmp_path_factory.mktemp("gemma3n_yoco_logs")
    engines = {}
    try:
        for on in (False, True):
            engines[on] = LoggedEngine(
                g3n_dir, str(logs / f"yoco_{on}.log"), **(YOCO if on else {}),
                chunked_prefill_size=CHUNK, max_running_requests=128,
            )
        yield engines
    finally:
        for e in engines.values():
            e.engine.shutdown()


def fast_passes(log):
    """(rows, tokens) of each prefill pass that ran the back half on last tokens."""
    return [tuple(map(int, m)) for m in re.findall(r"back half on (\d+) of (\d+) tokens", log)]


@pytest.mark.stack("yoco-model")
def test_yoco_on_equals_off_equals_hf(g3n_engines, g3n_ref):
    """Three batch mixes (every prompt at once, groups, one by one), with
    prefix hits, 1-token prompts next to long ones and chunks of an odd size:
    YOCO on gives YOCO off's tokens and logprobs, and both give HF's. With YOCO
    on the log shows the fast path ran in each mix, on fewer rows than the
    pass's tokens, and dropped unfinished chunks; with it off it never ran."""
    from cpu_engine import assert_same_greedy, engine_greedy

    prompts = [list(p) for p in g3n_ref]
    mixes = {
        "batch": [prompts],
        "groups": [prompts[:4], prompts[4:5], prompts[5:]],
        "single": [[p] for p in prompts],
    }
    results, logs = {}, {}
    for on, eng in g3n_engines.items():
        for mix, groups in mixes.items():
            eng.flush()
            eng.new_log()
            results[on, mix] = [
                out for group in groups for out in engine_greedy(eng.engine, group, MAX_NEW)
            ]
            logs[on, mix] = eng.new_log()
    for mix in mixes:
        for p, on, off in zip(prompts, results[True, mix], results[False, mix]):
            assert on[0] == off[0], mix
            assert max(abs(a - b) for a, b in zip(on[1], off[1])) <= 1e-4, mix
            assert_same_greedy(on, g3n_ref[tuple(p)], p)
        assert "KV-sharing fast prefill" not in logs[False, mix], mix
        fired = fast_passes(logs[True, mix])
        assert any(0 < n < total for n, total in fired), f"YOCO never fired ({mix})"
    assert any(n == 0 for n, _ in fast_passes(logs[True, "batch"])), (
        "an unfinished chunk was not dropped"
    )


@pytest.mark.stack("yoco-model")
def test_input_logprobs_turn_it_off_for_their_batch_only(g3n_engines):
    """A batch with a request for input logprobs runs every layer on every
    token (the log says why, and no pass of it takes the fast path), with YOCO
    off's outputs; the next batch without takes the fast path again."""
    from cpu_engine import engine_greedy, greedy_of

    rng = random.Random(8)
    # one pass: fewer tokens in all than a chunk
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (10, 12, 9)]
    outs, logs = {}, {}
    for on, eng in g3n_engines.items():
        eng.flush()
        eng.new_log()
        outs[on] = eng.engine.generate(
            input_ids=prompts,
            sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0.0},
            return_logprob=True,
            logprob_start_len=[0, -1, -1],
        )
        logs[on] = eng.new_log()
    log = logs[True]
    assert "full pass (input-token logprobs requested)" in log
    assert fast_passes(log) == []
    for on, off in zip(outs[True], outs[False]):
        assert greedy_of(on)[0] == greedy_of(off)[0]
        got = [v for v, _, _ in on["meta_info"]["input_token_logprobs"]][1:]
        want = [v for v, _, _ in off["meta_info"]["input_token_logprobs"]][1:]
        assert len(got) == len(want)
        assert max((abs(a - b) for a, b in zip(got, want)), default=0.0) <= 1e-4
    assert len(outs[True][0]["meta_info"]["input_token_logprobs"]) == len(prompts[0])

    eng = g3n_engines[True]
    eng.flush()
    eng.new_log()
    engine_greedy(eng.engine, prompts, MAX_NEW)
    assert any(0 < n < total for n, total in fast_passes(eng.new_log()))
