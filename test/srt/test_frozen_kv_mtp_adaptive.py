"""--speculative-adaptive under FROZEN_KV_MTP (step frozen-kv-mtp-adaptive) and its
per-state capture sizes (step spec-adaptive-per-state-capture-sizes), on CPU, no engine:
the worker's real adaptive states over stand-in model runners, and real decode rounds
through forward_batch_generation (at 0 draft steps the target verifies the bonus alone).
"""
import types

import pytest
import torch
from release import RELEASE
from resolved_server_args import published
from transformers import PretrainedConfig

from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.model_executor.cuda_graph_config import Backend as GraphBackend
from sglang.srt.model_executor.cuda_graph_config import (
    CudaGraphConfig, PhaseConfig, cuda_graph_fully_disabled)
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.runtime_context import get_context, get_exec, get_spec
from sglang.srt.server_args import ServerArgs
from sglang.srt.speculative import eagle_worker_v2
from sglang.srt.speculative import frozen_kv_mtp_cuda_graph_runner as fkv_graph
from sglang.srt.speculative import frozen_kv_mtp_worker_v2 as fkv
from sglang.srt.speculative.adaptive_runtime_state import AdaptiveController
from sglang.srt.speculative.adaptive_spec_params import DEFAULT_ADAPTIVE_CONFIG, adaptive_unsupported_reason
from sglang.srt.speculative.frozen_kv_mtp_info import FrozenKVMTPDraftInput, FrozenKVMTPVerifyInput

pytestmark = pytest.mark.stack("frozen-kv-mtp-speed", step="frozen-kv-mtp-adaptive")

HIDDEN = 4
# union of stock DEFAULT_ADAPTIVE_CONFIG ([0, 1, 3, 7]; 0.5.23 adds 5 from batch 1)
DEFAULT_CANDIDATES = sorted({s for slot in DEFAULT_ADAPTIVE_CONFIG.values() for s in slot["candidate_steps"]})


def frozen_args(**kw):
    args = ServerArgs(model_path="dummy", device="cpu", disable_cuda_graph=True)
    defaults = dict(speculative_algorithm="FROZEN_KV_MTP", speculative_eagle_topk=1,
                    speculative_num_steps=3, speculative_num_draft_tokens=4,
                    speculative_adaptive=True, max_running_requests=80)
    for k, v in {**defaults, **kw}.items():
        setattr(args, k, v)
    return args


# ------------------------------------------------ server-arg check


@pytest.mark.stack("frozen-kv-mtp-speed", step="frozen-kv-mtp-adaptive", fails_before=True)
def test_adaptive_is_supported_for_frozen_kv_mtp():
    assert adaptive_unsupported_reason(frozen_args()) is None


def test_adaptive_still_refused_for_frozen_kv_mtp_topk_above_1():
    reason = adaptive_unsupported_reason(frozen_args(speculative_eagle_topk=2))
    assert reason is not None and "topk=1" in reason


class Backend:
    """An attention backend: only its identity matters here."""

    count = 0

    def __init__(self, owner):
        Backend.count += 1
        self.name = f"{owner}-backend-{Backend.count}"
        self.verify_mask = None  # what _build_trivial_verify_input reads


class DraftRunner:
    def __init__(self):
        self.tp_group = None
        self.attn_backend = Backend("draft")
        self.draft_attn_backend = self.attn_backend

    def _get_attention_backend(self):
        return Backend("draft")


def gemma4_model_config():
    """What start-up checks read of the target's ModelConfig (no mamba state)."""
    return types.SimpleNamespace(hf_config=PretrainedConfig(architectures=["Gemma4ForConditionalGeneration"]),
                                 linear_attn_registry_result=None)


class TargetRunner:
    def __init__(self):
        self.attn_backend = Backend("target")
        self.decode_cuda_graph_runner = "target-graphs-initial"
        self.init_new_workspace = False
        self.model_config = gemma4_model_config()

    def _get_attention_backend(self, init_new_workspace=False):
        return Backend("target")


class TargetGraphs:
    """Stands in for the target's DecodeCudaGraphRunner (verify graphs)."""

    def __init__(self, model_runner, attn_backend, speculative_num_steps, speculative_num_draft_tokens):
        self.backend = attn_backend
        self.draft_tokens = speculative_num_draft_tokens
        self.capture_bs = decode_bs_read_by_runners()


class GraphRunner:
    """Stands in for FrozenKVMTPCudaGraphRunner: records what it was built on."""

    def __init__(self, draft_worker):
        self.backend = draft_worker.draft_attn_backend
        self.steps = get_spec().speculative_num_steps
        self.capture_bs = decode_bs_read_by_runners()


def graph_config():
    return get_exec().graph.cuda_graph_config


def decode_bs_read_by_runners():
    """What get_batch_sizes_to_capture reads: the resolved decode graph list."""
    cfg = graph_config()
    return None if cfg is None else list(cfg.decode.bs)


def draft_worker():
    """FrozenKVMTPDraftWorker without __init__ (which loads the assistant)."""
    dw = object.__new__(fkv.FrozenKVMTPDraftWorker)
    dw._model_runner = DraftRunner()
    fields = dict(
        server_args=get_context().server_args, topk=1, speculative_num_steps=3,
        speculative_num_draft_tokens=4, device="cpu", gpu_id=0,
        target_worker=types.SimpleNamespace(device="cuda"),
        draft_attn_backend=dw._model_runner.attn_backend,  # topk 1: the runner's own
        cuda_graph_runner="draft-graphs-steps-3", draft_extend_attn_backend=None,
        cuda_graph_runner_for_draft_extend=None, _specialized_graph_memory_usage={},
        _specialized_graph_time_usage={})
    if RELEASE >= (0, 5, 23):
        fields["parallel_layout"] = types.SimpleNamespace(tp_group=None)  # the target's
    else:
        from sglang.srt.utils import empty_context

        fields["draft_tp_context"] = empty_context
    for k, v in fields.items():  # setattr: the base classes may define properties
        setattr(dw, k, v)
    return dw


def build_worker(monkeypatch, args):
    """A FrozenKVMTPWorkerV2 built by its real __init__ (the draft worker class
    stubbed), with the adaptive states built as EAGLEWorkerV2.init_cuda_graphs
    builds them (its real init_cuda_graphs). Draft graphs are 'captured' by
    GraphRunner."""
    monkeypatch.setattr(fkv_graph, "FrozenKVMTPCudaGraphRunner", GraphRunner)
    monkeypatch.setattr(eagle_worker_v2, "DecodeCudaGraphRunner", TargetGraphs)
    # capture as on a GPU (the CPU context has graphs off; only the draft graph
    # decision reads this)
    monkeypatch.setattr(fkv, "cuda_graph_fully_disabled", lambda: False)
    with published(args):
        dw = draft_worker()
        monkeypatch.setattr(fkv, "FrozenKVMTPDraftWorker", lambda *a, **k: dw)
        target = types.SimpleNamespace(model_runner=TargetRunner(),
                                       get_memory_pool=lambda: ("req_to_token_pool", "allocator"))
        if RELEASE >= (0, 5, 23):
            ps = ()  # the worker reads the ParallelState from the published context
        else:
            ps = (None,)  # the worker takes the ParallelState (after its gpu_id)
        w = fkv.FrozenKVMTPWorkerV2(get_context().server_args, 0, *ps, 0, target)
        assert isinstance(w.adaptive_controller, AdaptiveController)
        # EAGLEWorkerV2.init_cuda_graphs, as at start-up; the draft worker's
        # own graph set-up (TpModelWorker) is not under test.
        dw.init_cuda_graphs = lambda: None
        w.init_cuda_graphs()
        yield w


@pytest.fixture
def worker(monkeypatch):
    yield from build_worker(monkeypatch, frozen_args())


def test_each_state_has_its_own_draft_backend_and_graphs(worker):
    # (the fixture ran the real __init__ with speculative_adaptive=True: stock refused it)
    assert worker.adaptive_controller.candidate_steps == DEFAULT_CANDIDATES
    states = worker.adaptive_controller._states
    assert sorted(states) == DEFAULT_CANDIDATES
    backends = [states[s].draft_attn_backend for s in DEFAULT_CANDIDATES]
    assert len({id(b) for b in backends}) == len(backends)
    # a state with no draft graph must not keep another state's (here the steps-3 one)
    assert states[0].cuda_graph_runner is None
    g1 = states[1].cuda_graph_runner
    if RELEASE >= (0, 5, 23):
        # its one-step draft runs the assistant seed forward: a graph to capture
        assert isinstance(g1, GraphRunner) and g1.steps == 1
        assert g1.backend is states[1].draft_attn_backend
    else:
        # its one-step draft runs no forward it could capture
        assert g1 is None
    assert states[3].cuda_graph_runner == "draft-graphs-steps-3"
    g7 = states[7].cuda_graph_runner
    assert isinstance(g7, GraphRunner)
    assert g7.steps == 7 and g7.backend is states[7].draft_attn_backend
    # target side: verify graphs per state, on a backend of their own
    assert states[0].target_attn_backend is not states[3].target_attn_backend
    for s in (0, 1, 7):
        assert states[s].target_graph_runner.draft_tokens == s + 1
        assert states[s].target_graph_runner.backend is states[s].target_attn_backend


def test_apply_state_rebinds_the_drafter(worker):
    ctl = worker.adaptive_controller
    dw = worker._draft_worker
    ctl._activate(7)
    assert worker.speculative_num_steps == dw.speculative_num_steps == 7
    assert dw.draft_attn_backend is ctl._states[7].draft_attn_backend
    assert dw.draft_model_runner.draft_attn_backend is dw.draft_attn_backend
    assert dw.cuda_graph_runner is ctl._states[7].cuda_graph_runner
    ctl._activate(0)
    assert dw.cuda_graph_runner is None and dw.speculative_num_draft_tokens == 1


def test_batch_size_picks_the_step_count(worker):
    ctl = worker.adaptive_controller
    ctl.activate_step_by_batch(80)  # stock config: [0] from batch 64
    assert worker.speculative_num_steps == 0
    ctl.activate_step_by_batch(1)  # [1, 3, (5,) 7] from batch 1; starts on 3
    assert worker.speculative_num_steps == 3


# ------------------------------------------------ step spec-adaptive-per-state-capture-sizes
GRAPH_BS = [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80]


@pytest.fixture
def graph_worker(monkeypatch):
    """The worker with decode CUDA graphs on, at GRAPH_BS (as the resolved
    cuda_graph_config gives them on a GPU; --cuda-graph-bs-decode not given)."""
    args = frozen_args()
    args.cuda_graph_config = CudaGraphConfig(
        decode=PhaseConfig(backend=GraphBackend.FULL, bs=list(GRAPH_BS)),
        prefill=PhaseConfig(backend=GraphBackend.DISABLED),
    )
    assert args.cuda_graph_bs_decode is None
    yield from build_worker(monkeypatch, args)


def test_each_state_captures_only_the_batch_sizes_that_reach_it(graph_worker):
    states = graph_worker.adaptive_controller._states
    # stock config: 7 steps only below batch 8, 1 step below 64, 0 from 8 up
    assert states[7].target_graph_runner.capture_bs == [1, 2, 4]
    assert states[7].cuda_graph_runner.capture_bs == [1, 2, 4]
    assert states[1].target_graph_runner.capture_bs == [b for b in GRAPH_BS if b < 64]
    if RELEASE >= (0, 5, 23):  # a one-step draft graph too
        assert states[1].cuda_graph_runner.capture_bs == [b for b in GRAPH_BS if b < 64]
    assert states[0].target_graph_runner.capture_bs == [b for b in GRAPH_BS if b >= 8]
    # the start-up state (3 steps) was captured before; the list is restored
    assert states[3].target_graph_runner == "target-graphs-initial"
    assert graph_config().decode.bs == GRAPH_BS
    assert graph_config().decode.backend == GraphBackend.FULL


def test_every_step_a_batch_can_switch_to_has_its_graph(graph_worker):
    # pruning leaves no reachable (batch, candidate step of its slot) without a graph
    ctl = graph_worker.adaptive_controller
    for b in range(1, 81):
        slot = ctl.params._route(b)
        for steps in slot.candidate_steps:
            runner = ctl._states[steps].target_graph_runner
            if isinstance(runner, TargetGraphs):
                assert any(g >= b for g in runner.capture_bs), (b, steps, runner.capture_bs)
            if isinstance(ctl._states[steps].cuda_graph_runner, GraphRunner):
                assert any(g >= b for g in ctl._states[steps].cuda_graph_runner.capture_bs)


def test_a_step_no_batch_reaches_captures_no_graph(monkeypatch):
    # an empty pruned list turns graphs off for that state only
    from sglang.srt.speculative.adaptive_capture_sizes import capture_sizes

    args = frozen_args()
    args.cuda_graph_config = CudaGraphConfig(
        decode=PhaseConfig(backend=GraphBackend.FULL, bs=[1, 2]),
        prefill=PhaseConfig(backend=GraphBackend.BREAKABLE),
    )
    with published(args):
        with capture_sizes([]):
            assert cuda_graph_fully_disabled()
        with capture_sizes(None):
            assert graph_config().decode.bs == [1, 2]
        assert not cuda_graph_fully_disabled()
        assert graph_config().prefill.backend == GraphBackend.BREAKABLE


def decode_batch(seq_lens, bonus):
    batch = ScheduleBatch(reqs=[types.SimpleNamespace() for _ in seq_lens])
    batch.forward_mode = ForwardMode.DECODE
    batch.seq_lens = torch.tensor(seq_lens)
    batch.seq_lens_sum = sum(seq_lens)
    seed = FrozenKVMTPDraftInput()
    seed.bonus_tokens = torch.tensor(bonus)
    seed.hidden_states = torch.zeros(len(bonus), HIDDEN)
    batch.spec_info = seed
    return batch


def run_round(worker, monkeypatch, batch):
    """One decode round with a stand-in verify: every request accepts one token
    per verify row it got; hidden row i of the verify output holds i."""
    seen = {}

    def verify(batch, grammar_barrier=None):
        v = batch.spec_info
        seen["verify_input"] = v
        bs = batch.seq_lens.shape[0]
        rows = bs * v.draft_token_num
        next_seed = FrozenKVMTPDraftInput()
        next_seed.bonus_tokens = torch.arange(bs) + 500
        hidden = torch.arange(rows, dtype=torch.float32)[:, None].repeat(1, HIDDEN)
        return types.SimpleNamespace(new_seq_lens=batch.seq_lens + 1,
                                     accept_lens=torch.ones(bs, dtype=torch.long),
                                     logits_output=types.SimpleNamespace(hidden_states=hidden),
                                     next_draft_input=next_seed)

    def draft(batch):
        seen["drafted"] = True
        n = worker.speculative_num_draft_tokens
        bs = batch.seq_lens.shape[0]
        none = dict.fromkeys(("custom_mask", "positions", "retrieve_index", "retrieve_next_token",
                              "retrieve_next_sibling", "retrieve_cum_len", "capture_hidden_mode",
                              "seq_lens_sum", "seq_lens_cpu"))
        return FrozenKVMTPVerifyInput(draft_token=torch.zeros(bs * n, dtype=torch.long), topk=1,
                                      spec_steps=worker.speculative_num_steps, draft_token_num=n, **none)

    monkeypatch.setattr(worker, "verify", verify)
    monkeypatch.setattr(worker._draft_worker, "draft", draft)
    out = worker.forward_batch_generation(batch)
    return out, seen


def test_zero_step_round_verifies_the_bonus_token_alone(worker, monkeypatch):
    # 64 requests: the stock config's slot that drafts 0 steps (64 and up)
    seq_lens = list(range(10, 74))
    bonus = list(range(1000, 1064))
    out, seen = run_round(worker, monkeypatch, decode_batch(seq_lens, bonus))
    assert worker.speculative_num_steps == 0
    assert "drafted" not in seen
    v = seen["verify_input"]
    assert isinstance(v, FrozenKVMTPVerifyInput) and v.is_verify_input()
    assert v.draft_token_num == 1 and v.spec_steps == 0
    assert v.draft_token.tolist() == bonus  # the previous bonus tokens
    assert v.positions.tolist() == seq_lens
    # next seed: the new bonus token and the verify's hidden row of each request
    seed = out.next_draft_input
    assert isinstance(seed, FrozenKVMTPDraftInput)
    assert seed.bonus_tokens.tolist() == list(range(500, 564))
    assert seed.hidden_states[:, 0].tolist() == [float(i) for i in range(64)]


def test_batch_1_round_drafts(worker, monkeypatch):
    out, seen = run_round(worker, monkeypatch, decode_batch([5, 6], [3, 4]))
    assert seen.get("drafted") and seen["verify_input"].draft_token_num == 4
    # seed read at the last accepted node of each request's 4-row block
    assert out.next_draft_input.hidden_states[:, 0].tolist() == [0.0, 4.0]


# ------------------------------------------------ step spec-shared-logits-buffer-adaptive-width


@pytest.mark.parametrize("adaptive, rows", [(False, 80 * 4), (True, 80 * 8)])
def test_shared_logits_buffer_holds_the_widest_adaptive_verify(monkeypatch, adaptive, rows):
    """Run 15's first adaptive server died capturing the 7-step state's verify
    graphs: 80 x 8 logits rows against a buffer sized for 80 x 4."""
    from sglang.srt.model_executor import model_runner as mr_mod
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    # capture sizes as the decode graph config gives them (up to 80 requests)
    monkeypatch.setattr(mr_mod, "get_batch_sizes_to_capture",
                        lambda runner, width, **kw: ([1, 8, 64, 80], []))
    args = frozen_args(speculative_adaptive=adaptive)
    runner = object.__new__(ModelRunner)
    runner.spec_algorithm = SpeculativeAlgorithm.from_string("FROZEN_KV_MTP")
    runner.is_draft_worker = False
    if RELEASE >= (0, 5, 23):
        # it also asks the decode graph runner class which gathers it needs (none here)
        runner.decode_graph_gather_requirements = lambda: (False, False)
    else:
        runner.server_args = args  # what it reads
    with published(args):  # what 0.5.23 reads
        assert runner.max_decode_logits_rows() == rows
