"""YOCO fast prefill (--kv-sharing-fast-prefill) on CPU: when a pass takes the fast path
(and the skip reasons), which rows, the planner's plans and running them on one stream
(Gemma-4) or several (Gemma-3n's AltUp); end to end, YOCO on == off == HF transformers
for both tiny models (backends' back-half metadata: test_attention_back_half_metadata.py).
"""

import dataclasses
import os
import random
import threading
import time
import types

import pytest
import torch
from attention_stand_ins import (  # noqa: F401 (_restore_kernels: autouse fixture)
    _restore_kernels, assert_same_batch, assert_same_state, back_half_backend_of, backend_state,
    batch_state, make_batch, make_torch_native_backend, make_triton_backend, set_deterministic,
)
from hypothesis import given, settings
from hypothesis import strategies as st
from release import RELEASE

from sglang.srt.layers import kv_sharing_fast_prefill as yoco_model
from sglang.srt.model_executor import kv_sharing_fast_prefill_plan as yoco
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
from sglang.srt.model_executor.forward_context import ForwardContext, forward_context, get_attn_backend

pytestmark = pytest.mark.stack("yoco-model", step="gemma4-fast-prefill-branch")

FIRST_SHARED, END = 4, 8  # tiny models: 8 layers, 4 KV-shared
HIDDEN, PLE = 6, 2


def planner(attention=None, min_tokens=0, layers_to_capture=(), back_half=None, pp_size=1):
    from sglang.srt.model_executor.kv_sharing_fast_prefill_planner import (
        FastPrefillSettings, KVSharingFastPrefillPlanner)

    model = types.SimpleNamespace(layers_to_capture=list(layers_to_capture))
    back_half = back_half or yoco_model.KVSharedBackHalf([], FIRST_SHARED, END, HIDDEN, 0)
    attention = attention or yoco.BackHalfAttention(make_torch_native_backend())
    return KVSharingFastPrefillPlanner(model, back_half, attention, FastPrefillSettings(min_tokens),
                                       pp_size)


def reason(fb, layers_to_capture=(), pp_size=1, first=FIRST_SHARED, min_tokens=0):
    return yoco.fast_prefill_skip_reason(fb, first, layers_to_capture, pp_size, min_tokens)


@pytest.mark.stack("yoco-model", step="gemma4-fast-prefill-branch", fails_before=True)
def test_fires_for_a_plain_prefill():
    assert reason(make_batch([5, 9, 1])) is None


def _batch_with(**fields):
    fb = make_batch([5, 9])
    for k, v in fields.items():
        setattr(fb, k, v)
    return fb


@pytest.mark.parametrize(
    "case, want",
    [
        *[((mode,), "forward_mode") for mode in (
            ForwardMode.DECODE, ForwardMode.MIXED, ForwardMode.IDLE, ForwardMode.TARGET_VERIFY,
            ForwardMode.DRAFT_EXTEND_V2, ForwardMode.PREBUILT, ForwardMode.SPLIT_PREFILL,
            ForwardMode.DLLM_EXTEND)],
        (("lens", [1, 1, 1]), "one_token_per_request"),
        (("fields", dict(return_logprob=True, extend_logprob_start_lens_cpu=[5, 9])), None),
        (("fields", dict(return_logprob=True, extend_logprob_start_lens_cpu=[5, 3])), "input_logprobs"),
        (("fields", dict(capture_hidden_mode=CaptureHiddenMode.LAST)), None),
        (("fields", dict(capture_hidden_mode=CaptureHiddenMode.FULL)), "full_hidden_capture"),
        (("capture", [2, FIRST_SHARED]), None),
        (("capture", [2, FIRST_SHARED + 1]), "capture_in_back_half"),
        (("fields", dict(return_pooled_hidden_states=True)), "pooled_output"),
        (("fields", dict(multi_item_delimiter_indices=[torch.tensor([2])])), "multi_item_scoring"),
        (("pp", 2), "pipeline_parallel"),
        (("first", None), "no_kv_shared_layers"),
        (("min_tokens", 15), "below_min_tokens"),
        (("min_tokens", 14), None),
    ],
)
def test_why_a_pass_keeps_the_full_computation(case, want):
    kind, arg = case[0], case[1] if len(case) > 1 else None
    kwargs = {}
    if isinstance(kind, ForwardMode):
        fb = make_batch([5, 9], mode=kind)
    elif kind == "lens":
        fb = make_batch(arg)
    elif kind == "fields":
        fb = _batch_with(**arg)
    else:
        fb = make_batch([5, 9])  # 14 new tokens
        kwargs = {"capture": dict(layers_to_capture=arg), "pp": dict(pp_size=arg),
                  "first": dict(first=arg), "min_tokens": dict(min_tokens=arg)}[kind]
    got = reason(fb, **kwargs)
    assert got == want and (got is None or got in yoco.SKIP_REASONS)


def test_first_kv_shared_layer():
    assert yoco_model.first_kv_shared_layer(types.SimpleNamespace(num_hidden_layers=60, num_kv_shared_layers=0)) is None
    assert yoco_model.first_kv_shared_layer(types.SimpleNamespace(num_hidden_layers=42, num_kv_shared_layers=18)) == 24


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(0, 30), st.booleans()), min_size=1, max_size=12))
def test_rows_are_last_tokens_of_finishing_requests(reqs):
    ext = [e for e, _, _ in reqs]
    fb = make_batch(ext, [p for _, p, _ in reqs], [7 if c else 0 for _, _, c in reqs])
    keep = [i for i, (_, _, c) in enumerate(reqs) if not c]
    assert yoco._finishing_requests(fb, fb.seq_lens_cpu.tolist()) == keep
    # extend_start_loc + extend_seq_lens - 1, computed independently on tensors
    last = (fb.extend_start_loc + fb.extend_seq_lens - 1).tolist()
    assert yoco.last_token_rows(ext, keep) == [last[i] for i in keep]


def test_finishing_requests_read_the_host_lengths_without_a_device_copy():
    # step prefill-lengths-on-host: the plan reads the host copy of orig_seq_lens, never the device's
    fb = make_batch([5, 9, 3], [0, 4, 0], [0, 7, 0])
    fb.orig_seq_lens_cpu = fb.orig_seq_lens.tolist()
    fb.orig_seq_lens = torch.empty(3, device="meta")  # reading it raises
    assert yoco._finishing_requests(fb, fb.seq_lens_cpu.tolist()) == [0, 2]
    # a host copy of another length is not this batch's: the device tensor is read
    fb.orig_seq_lens_cpu = [5, 20]
    with pytest.raises(NotImplementedError, match="meta"):
        yoco._finishing_requests(fb, fb.seq_lens_cpu.tolist())


def test_plan_builds_a_decode_shaped_back_half_batch():
    # request 1 is an unfinished chunk; request 2 has a single new token
    fb = make_batch([4, 6, 1, 3], prefix_lens=[0, 2, 9, 5], orig_extra=[0, 5, 0, 0])
    before = batch_state(fb)
    plan = planner().plan(fb)
    assert isinstance(plan, yoco.EagerBackHalfPlan) and plan.num_reqs == 3
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
    assert_same_batch(fb, before)  # the pass's own batch is untouched
    for obj, field in ((plan, "batch"), (plan.rows, "token_index")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, field, None)


def test_the_back_half_attends_in_its_own_context_and_leaves_the_pass_untouched():
    # the back half's backend inside active(), the pass's after it (also on a raise); the
    # pass's backend and batch neither written nor replaced
    be = make_triton_backend(15)
    fb = make_batch([9, 30, 4], [0, 4, 2], backend=be)
    be.init_forward_metadata(fb)  # the pass's own metadata
    before, batch_before = backend_state(be), batch_state(fb)
    attn = yoco.BackHalfAttention(back_half_backend_of(be))
    plan = planner(attn).plan(fb)
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


def test_a_pass_of_an_unfinished_chunk_only_runs_no_back_half():
    fb = make_batch([64], orig_extra=[100])
    plan = planner().plan(fb)
    assert isinstance(plan, yoco.FrontOnlyPlan) and plan.num_reqs == 0
    h = torch.randn(64, 8)
    assert plan.run(fb, h, None) is h


def test_the_planner_counts_prefill_passes_by_path(monkeypatch):
    # once per prefill pass, by path (decode passes are none); to Prometheus too with a metrics name
    from sglang.srt.model_executor import kv_sharing_fast_prefill_planner as kp

    p = planner(min_tokens=3)
    p._metrics_model_name = "tiny"
    p.plan(make_batch([5, 9]))
    p.plan(make_batch([5, 9]))
    p.plan(make_batch([64], orig_extra=[100]))
    p.plan(make_batch([1, 1]))  # 2 new tokens
    p.plan(_batch_with(return_logprob=True, extend_logprob_start_lens_cpu=[0, 9]))
    p.plan(make_batch([5, 9], mode=ForwardMode.MIXED))
    p.plan(make_batch([1, 1], mode=ForwardMode.DECODE))
    assert p.pass_counts() == {"fast": 2, "fast:chunk_only": 1, "full:one_token_per_request": 1,
                               "full:input_logprobs": 1, "full:forward_mode": 1}
    counter = kp._prometheus_counter()
    assert counter.labels(model_name="tiny", path="fast", reason="")._value.get() == 2
    assert counter.labels(model_name="tiny", path="full", reason="input_logprobs")._value.get() == 1


def test_a_draft_worker_or_a_model_without_a_back_half_plans_nothing(monkeypatch):
    # YOCO is for the target's prefill of a model that declares KV-shared layers, with the flag on
    from sglang.srt.model_executor import kv_sharing_fast_prefill_planner as kp

    features = types.SimpleNamespace(kv_sharing_fast_prefill=True, kv_sharing_fast_prefill_min_tokens=0)
    monkeypatch.setattr(kp, "get_exec", lambda: types.SimpleNamespace(features=features))

    class Text(torch.nn.Module, yoco_model.SupportsKVSharingFastPrefill):
        def __init__(self, shared):
            super().__init__()
            self.cfg = types.SimpleNamespace(num_hidden_layers=END, num_kv_shared_layers=shared, hidden_size=HIDDEN)

        def kv_shared_back_half(self):
            return yoco_model.KVSharedBackHalf.of(self.cfg, [], END, 0)

    def runner(shared, draft=False):
        outer = torch.nn.Module()
        outer.language_model = Text(shared)
        return types.SimpleNamespace(model=outer, is_draft_worker=draft)

    assert yoco_model.find_kv_shared_back_half(runner(4).model)[1].first_layer == FIRST_SHARED
    assert kp.KVSharingFastPrefillPlanner.for_model_runner(runner(0)) is None
    assert kp.KVSharingFastPrefillPlanner.for_model_runner(runner(4, draft=True)) is None
    features.kv_sharing_fast_prefill = False
    assert kp.KVSharingFastPrefillPlanner.for_model_runner(runner(4)) is None


class StreamLayer(torch.nn.Module):
    """A decoder layer reading each row's hidden states, per-layer input and geometry.
    ``streams`` 0: [tokens, hidden] rows, returns (hidden, None); else [streams, tokens,
    hidden] rows, returns the next streams (Gemma-3n's)."""

    def __init__(self, i, streams):
        super().__init__()
        self.i, self.streams = i, streams

    def forward(self, positions, hidden_states, per_layer_input, forward_batch):
        assert per_layer_input.dim() == 2
        geo = (positions.double() + 0.5 * forward_batch.seq_lens.double())[:, None]
        extra = geo + per_layer_input.sum(-1)[:, None]
        if self.streams:
            return hidden_states.roll(1, dims=0) * (1.0 + 0.1 * self.i) + extra[None]
        return hidden_states * (1.0 + 0.1 * self.i) + extra, None


def stream_back_half(streams):
    layers = torch.nn.ModuleList(StreamLayer(i, streams) for i in range(END))
    call = yoco_model.PLAIN_LAYER_CALL if streams else yoco_model.DECODER_LAYER_CALL
    if not streams:
        call = yoco_model.BackHalfLayerCall(lambda layer, **kw: layer(**kw)[0], call.entering)
    return yoco_model.KVSharedBackHalf(layers, FIRST_SHARED, END, HIDDEN, PLE, streams=streams, layer_call=call)


def stream_rows(streams, n_tok, seed):
    g = torch.Generator().manual_seed(seed)
    shape = (streams, n_tok, HIDDEN) if streams else (n_tok, HIDDEN)
    return torch.randn(*shape, generator=g, dtype=torch.float64), torch.randn(
        n_tok, END, PLE, generator=g, dtype=torch.float64)


@pytest.mark.parametrize("streams", [0, 3])
def test_the_back_half_runs_each_finishing_requests_last_token_with_its_per_layer_inputs(streams):
    # finishing requests' last tokens: the back half's layers with the pass's per-layer
    # inputs; other rows keep the front half's; the pass's backend and batch unchanged
    be = make_triton_backend(15)
    # request 1 is an unfinished chunk, request 2 has a single new token
    fb = make_batch([9, 30, 1, 4], [0, 4, 7, 2], [0, 5, 0, 0], backend=be)
    be.init_forward_metadata(fb)
    before, batch_before = backend_state(be), batch_state(fb)
    back_half = stream_back_half(streams)
    plan = planner(yoco.BackHalfAttention(back_half_backend_of(be)), back_half=back_half).plan(fb)
    n_tok = sum(fb.extend_seq_lens_cpu)
    hidden, ple = stream_rows(streams, n_tok, 0)
    with forward_context(ForwardContext(attn_backend=be)):
        got = plan.run(fb, hidden, ple)
    rows, dim = plan.rows.token_index, back_half.token_dim
    assert rows.tolist() == [8, 39, 43]
    want = hidden.index_select(dim, rows)
    for i in range(FIRST_SHARED, END):
        want = back_half.layer_call.call(
            back_half.layers[i], positions=plan.batch.positions, hidden_states=want,
            per_layer_input=ple[rows, i], forward_batch=plan.batch)
    assert torch.equal(got.index_select(dim, rows), want)
    keep = torch.tensor([t for t in range(n_tok) if t not in rows.tolist()])
    assert torch.equal(got.index_select(dim, keep), hidden.index_select(dim, keep))
    assert got is not hidden  # out of place: the input may be a captured aux state
    assert_same_state(be, before)
    if RELEASE >= (0, 5, 23):
        # the pass's residual stream holds the output as written (as its last layer
        # leaves it, back_half_output); nothing else of the pass is written
        fb.residual_stream = batch_before["residual_stream"][0]
    assert_same_batch(fb, batch_before)


def test_default_triton_back_half_stays_a_decode_step():
    attn = yoco.BackHalfAttention(make_triton_backend(15))
    assert planner(attn).plan(make_batch([9, 30], [0, 4])).batch.forward_mode == ForwardMode.DECODE


def _deterministic_triton_plan():
    attn = yoco.BackHalfAttention(set_deterministic(make_triton_backend(15)))
    return planner(attn).plan(make_batch([9, 30, 4], [0, 4, 20]))


def test_deterministic_triton_back_half_is_planned_as_an_extend():
    plan = _deterministic_triton_plan()
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
def test_deterministic_triton_back_half_window_starts_where_the_pass_did():
    # the backend built it with the pass's prefixes (its window starts there)
    assert _deterministic_triton_plan().attention.backend.forward_metadata.window_kv_offsets.tolist() == [0, 0, 5]


@pytest.mark.stack("yoco-model", step="gemma4-fast-prefill-branch", bases=("0.5.23",))
def test_deterministic_triton_back_half_window_starts_on_the_pass_tile():
    meta = _deterministic_triton_plan().attention.backend.forward_metadata
    # its last W = 15 keys before the token, padded back to the 128-key tile
    # they start in, key 0 here, as the pass's lists are (the general case:
    # test_attention_back_half_metadata)
    assert meta.window_kv_offsets.tolist() == [0, 18, 8]
    aligned = meta.aligned_window_kv_indptr
    assert (aligned[1:] - aligned[:-1]).tolist() == [8, 33, 23]


@pytest.mark.stack("yoco-model", step="gemma4-fast-prefill-branch", bases=("0.5.23",))
def test_back_half_batch_reads_through_a_plan_of_its_own_rows():
    # 0.5.23's KVLocPlan is indexed by a batch's rows: the back half's batch binds its own
    be = make_triton_backend(15)
    # request 1 is an unfinished chunk: the back half has requests 0 and 2
    fb = make_batch([4, 6, 3], prefix_lens=[0, 2, 5], orig_extra=[0, 5, 0], backend=be)
    pass_plan = fb.kv_loc_plan
    back = planner(yoco.BackHalfAttention(be)).plan(fb).batch
    assert fb.kv_loc_plan is pass_plan
    assert fb.kv_loc_plan.req_pool_indices.tolist() == [1, 2, 3]
    assert back.kv_loc_plan is not fb.kv_loc_plan
    assert back.kv_loc_plan.req_pool_indices.tolist() == back.req_pool_indices.tolist() == [1, 3]
    assert back.kv_loc_plan.seq_lens.tolist() == [4, 8]


def _tiny_config(name):
    from tiny_gemma import GEMMA3N_TEXT_CONFIG as G3N, GEMMA4_TEXT_CONFIG as G4

    return types.SimpleNamespace(**{"gemma4": G4, "gemma3n": G3N}[name])


@pytest.mark.stack("yoco-model", step="gemma3n-fast-prefill-branch")
@pytest.mark.parametrize("name", ["gemma4", "gemma3n"])
def test_each_text_model_declares_its_back_half(name):
    # its KV-shared layers (Gemma-3n's: every AltUp stream); None without KV-shared layers
    if name == "gemma4":
        from sglang.srt.models.gemma4_causal import Gemma4TextModel as Text
    else:
        from sglang.srt.models.gemma3n_causal import Gemma3nTextModel as Text
    cfg = _tiny_config(name)
    layers = torch.nn.ModuleList(torch.nn.Identity() for _ in range(END))
    text = types.SimpleNamespace(layers=layers, config=cfg, end_layer=END,
                                 hidden_size_per_layer_input=cfg.hidden_size_per_layer_input)
    assert issubclass(Text, yoco_model.SupportsKVSharingFastPrefill)
    layout = dict(streams=cfg.altup_num_inputs, layer_call=yoco_model.PLAIN_LAYER_CALL) if name == "gemma3n" else {}
    assert Text.kv_shared_back_half(text) == yoco_model.KVSharedBackHalf(
        layers, FIRST_SHARED, END, cfg.hidden_size, cfg.hidden_size_per_layer_input, **layout)
    cfg.num_kv_shared_layers = 0
    assert Text.kv_shared_back_half(text) is None


def _gemma3n_args(tmp_path, **text_overrides):
    import json

    from cpu_engine import YOCO
    from resolved_server_args import build
    from tiny_gemma import GEMMA3N_TEXT_CONFIG as TINY_TEXT_CONFIG

    path = tmp_path / "gemma3n"
    path.mkdir()
    (path / "config.json").write_text(json.dumps(dict(TINY_TEXT_CONFIG, **text_overrides)))
    return lambda: build(model_path=str(path), device="cpu", attention_backend="torch_native",
                         skip_tokenizer_init=True, **YOCO)


@pytest.mark.stack("yoco-model", step="gemma3n-fast-prefill-branch", fails_before=True)
def test_gemma3n_with_kv_shared_layers_accepted(tmp_path):
    import copy

    from resolved_server_args import model_config, with_model_config

    from sglang.srt.arg_groups import kv_sharing_fast_prefill_hook as hook

    args = _gemma3n_args(tmp_path)()
    assert hook._check_model(args) == (FIRST_SHARED, END)
    # the released E2B/E4B checkpoints are Gemma3nForConditionalGeneration
    config = copy.copy(model_config(args))
    config.hf_config = copy.copy(config.hf_config)
    config.hf_config.architectures = ["Gemma3nForConditionalGeneration"]
    assert hook._check_model(with_model_config(args, config)) == (FIRST_SHARED, END)


@pytest.mark.stack("yoco-model", step="gemma3n-fast-prefill-branch")
def test_gemma3n_without_kv_shared_layers_rejected(tmp_path):
    with pytest.raises(ValueError) as info:
        _gemma3n_args(tmp_path, num_kv_shared_layers=0)()
    for part in ("--kv-sharing-fast-prefill", "Gemma-3n", "Gemma3nForCausalLM", "num_kv_shared_layers=0"):
        assert part in str(info.value)

MAX_NEW = 5
CHUNK = 37  # odd, below several prompts: unfinished chunks and chunk tails


def _prompts(seed, n, vocab=512):
    rng = random.Random(seed)
    shared = [rng.randrange(3, vocab) for _ in range(40)]
    out = []
    for i in range(n):
        tail = [rng.randrange(3, vocab) for _ in range(rng.choice([1, 2, 9, 20, 45, 80]))]
        out.append(shared + tail if i % 3 == 0 else tail)
    return out


class Served:
    """One tiny model served with YOCO off and on (chunked at an odd chunk), its HF reference."""

    def __init__(self, name, model_dir, tmp_path_factory):
        from cpu_engine import YOCO, HFReference, decisive_prompts, start_engine

        self.name, self.model_dir = name, model_dir
        self.ref = decisive_prompts(
            HFReference(model_dir, causal_lm="Gemma3nForCausalLM" if name == "gemma3n" else "Gemma4ForCausalLM"),
            _prompts(3, 14), MAX_NEW)
        assert len(self.ref) >= 10
        # engine_probe/ logs, in the scheduler process, whether each plan read
        # the requests' lengths from the host (step prefill-lengths-on-host)
        self.lengths_log = tmp_path_factory.mktemp(f"{name}_lengths") / "reads.log"
        probe = os.path.join(os.path.dirname(os.path.abspath(__file__)), "engine_probe")
        saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "SGLANG_TEST_YOCO_LENGTHS_LOG")}
        os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [probe, saved["PYTHONPATH"]]))
        os.environ["SGLANG_TEST_YOCO_LENGTHS_LOG"] = str(self.lengths_log)
        self.engines = {}
        try:
            for on in (False, True):
                self.engines[on] = start_engine(
                    model_dir, **(YOCO if on else {}), chunked_prefill_size=CHUNK, max_running_requests=256)
        except BaseException:
            self.shutdown()
            raise
        finally:
            for k, v in saved.items():
                os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)

    def counts(self, on=True):
        """The scheduler's pass counters (None where YOCO is off)."""
        return self.engines[on].get_server_info()["internal_states"][0].get("kv_sharing_fast_prefill_passes")

    def run(self, on, groups, **extra):
        """Outputs of each group sent as one batch after a cache flush; the counters' increase."""
        import time

        from cpu_engine import engine_greedy

        eng = self.engines[on]
        for _ in range(200):
            if eng.flush_cache().success:
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the prefix cache was never flushed")
        before = dict(self.counts(on) or {})
        outs = [o for g in groups for o in engine_greedy(eng, g, MAX_NEW, **extra)]
        after = self.counts(on) or {}
        return outs, {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}

    def shutdown(self):
        # An engine's shutdown SIGKILLs every child of this process, the other engine's
        # too, whose watchdog would then report its child "crashed" (SIGQUIT): stop both
        # watchdogs first.
        for e in self.engines.values():
            if e.tokenizer_manager._subprocess_watchdog is not None:
                e.tokenizer_manager._subprocess_watchdog.stop()
        for e in self.engines.values():
            e.shutdown()


@pytest.fixture(scope="module", params=["gemma4", "gemma3n"])
def served(request, tmp_path_factory):
    import tiny_gemma

    make = getattr(tiny_gemma, f"make_tiny_{request.param}")
    model_dir = make(str(tmp_path_factory.mktemp(f"tiny_{request.param}_yoco")), seed=0)
    s = Served(request.param, model_dir, tmp_path_factory)
    yield s
    s.shutdown()


@pytest.mark.stack("yoco-model")
def test_yoco_on_equals_off_equals_hf(served):
    """Batch mixes with prefix hits, 1-token prompts and odd chunks, then 160 requests at
    once: YOCO on == off == HF; the fast path ran in each mix (chunk-only passes too), the
    lengths were read from the host."""
    from cpu_engine import assert_same_greedy

    prompts = [list(p) for p in served.ref]
    rng = random.Random(5)
    many = [[rng.randrange(3, 512) for _ in range(rng.randrange(1, 40))] for _ in range(160)]
    mixes = {"batch": [prompts], "groups": [prompts[:4], prompts[4:5], prompts[5:]],
             "single": [[p] for p in prompts], "many": [many]}
    for mix, groups in mixes.items():
        (on, fired), (off, none) = served.run(True, groups), served.run(False, groups)
        for i, (a, b) in enumerate(zip(on, off)):
            assert a[0] == b[0], mix
            assert max(abs(x - y) for x, y in zip(a[1], b[1])) <= 1e-4, mix
            if mix != "many":
                assert_same_greedy(a, served.ref[tuple(prompts[i])], prompts[i])
        assert fired.get("fast", 0) > 0, (mix, fired)
        assert none == {} and served.counts(False) is None
        if mix == "batch":
            assert fired.get("fast:chunk_only", 0) > 0, fired
    reads = served.lengths_log.read_text().split()
    assert reads and set(reads) == {"host"}, reads


@pytest.mark.stack("yoco-model")
def test_input_logprobs_turn_it_off_for_their_batch_only(served):
    # a batch asking for input logprobs runs in full (YOCO off's outputs); the next is fast again
    rng = random.Random(8)
    prompts = [[rng.randrange(3, 512) for _ in range(n)] for n in (10, 12, 9)]  # one pass
    outs, counts = {}, {}
    for on in (True, False):
        outs[on], counts[on] = served.run(on, [prompts], logprob_start_len=[0, -1, -1])
    assert counts[True] == {"full:input_logprobs": 1}, counts[True]
    for a, b in zip(outs[True], outs[False]):
        assert a[0] == b[0] and max(abs(x - y) for x, y in zip(a[1], b[1])) <= 1e-4
    _, again = served.run(True, [prompts])
    assert again == {"fast": 1}, again


# One model a release (a pair costs a minute of CI): Gemma-4 on the pinned 0.5.17, Gemma-3n
# on 0.5.23. Which buffers are left out is unit-tested on a pool: test_pd_kv_shared_buffers.py.
PD_PAIR_MODEL = "gemma3n" if RELEASE >= (0, 5, 23) else "gemma4"


@pytest.mark.stack("yoco-model")
@pytest.mark.parametrize("served", [PD_PAIR_MODEL], indirect=True)
def test_a_pd_pair_with_yoco_on_the_prefill_server_decodes_as_hf(served, tmp_path):
    """A PD pair, the prefill server with the fast path on every pass, the KV moved by
    mooncake's engine stood in (pd_stand_in/: real copies between the two processes, the
    KV-shared layers' never-written buffers left out by the prefill server): each request's
    first token on the prefill server and its whole greedy output on the decode server as
    HF's, and the prefill passes counted fast; through SGLang's router in PD mode (which
    draws the rooms) the same; a request without bootstrap fields gets a 400."""
    import requests
    from cpu_engine import LOGPROB_ATOL, assert_same_greedy
    from pd_pair import PDPair, PDRouter

    pair = PDPair(served.model_dir, tmp_path, prefill_args=[
        "--kv-sharing-fast-prefill", "--kv-sharing-fast-prefill-min-tokens", "0"])
    try:
        prefill, decode = pair.wait_ready().prefill, pair.decode
        for room, (prompt, (toks, lps)) in enumerate(served.ref.items(), start=1):
            p, d = pair.generate(pair.body(room, prompt, MAX_NEW, return_logprob=True))
            assert p.status_code == 200 and d.status_code == 200, p.text + d.text + decode.log_tail()
            (lp, tok, _), = p.json()["meta_info"]["output_token_logprobs"]
            assert tok == toks[0] and abs(lp - lps[0]) <= LOGPROB_ATOL, (len(prompt), tok, toks[0], lp, lps[0])
            got = d.json()["meta_info"]["output_token_logprobs"]
            assert_same_greedy(([t for _, t, _ in got], [v for v, _, _ in got]), (toks, lps), prompt)
            if room == 1:
                served_ids = (list(prompt), d.json()["output_ids"])
        info = requests.get(prefill.url + "/get_server_info", timeout=30).json()
        passes = info["internal_states"][0]["kv_sharing_fast_prefill_passes"]
        assert passes.get("fast", 0) >= len(served.ref) - 1, passes  # the warm-up's is one more
        router = PDRouter(pair, tmp_path / "router.log").wait_ready()
        try:
            for prompt, (toks, lps) in served.ref.items():
                r = router.post("/generate", {"input_ids": list(prompt), "return_logprob": True,
                                              "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0.0}})
                assert r.status_code == 200, r.text + router.log_tail()
                got = r.json()["meta_info"]["output_token_logprobs"]
                assert_same_greedy(([t for _, t, _ in got], [v for v, _, _ in got]), (toks, lps), prompt)
        finally:
            router.stop()
        # sent to the decode server alone (no bootstrap): a 400, and it keeps serving
        r = decode.post("/generate", {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 1}})
        assert r.status_code == 400 and "bootstrap_host is missing" in r.text and decode.alive(), r.text
        # a request under the room of one in flight, on either server (it waits there for its
        # peer): a 400 naming the room (it stopped the prefill server: step
        # pd-one-request-per-bootstrap-room); the first then completes as HF's
        prompt, toks = served_ids
        for room, (first, second) in ((1000, (prefill, decode)), (1001, (decode, prefill))):
            body = pair.body(room, prompt, MAX_NEW)
            out = {}
            th = threading.Thread(target=lambda: out.update(r=first.post("/generate", body)))
            th.start()
            time.sleep(1.0)  # in flight on `first`, waiting for its peer
            r = first.post("/generate", {**body, "input_ids": [5, 6, 7]})
            assert r.status_code == 400 and f"bootstrap_room {room} is held by request" in r.text, r.text
            r = second.post("/generate", body)
            th.join()
            d = r if second is decode else out["r"]
            assert r.status_code == 200 and out["r"].status_code == 200, r.text + out["r"].text
            assert d.json()["output_ids"] == toks, (room, d.json()["output_ids"], toks)
        assert prefill.alive() and decode.alive()
    finally:
        pair.stop()


@pytest.mark.stack("yoco-model", step="min-tokens-within-a-pass")
def test_unset_min_tokens_serves_with_the_default(model_dir):
    # unset on CPU: 0, so a short pass takes the fast path (it was 4096, above CPU's
    # chunked prefill of 2048: no pass could)
    from cpu_engine import engine_greedy, start_engine

    rng = random.Random(9)
    small = [[rng.randrange(3, 512) for _ in range(20)] for _ in range(3)]
    eng = start_engine(model_dir, kv_sharing_fast_prefill=True)
    try:
        engine_greedy(eng, small, 2)
        counts = eng.get_server_info()["internal_states"][0]["kv_sharing_fast_prefill_passes"]
    finally:
        eng.shutdown()
    assert counts == {"fast": 1}, counts
