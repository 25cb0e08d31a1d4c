"""Step war-barrier-verify-event: FROZEN_KV_MTP's WAR barrier waits on the verify graph's
read-done event, not on the whole forward (stock's barrier runner, the draft runner,
never published one). On CPU: the scheduler's barrier and the graph runner's execute
over stand-ins; both bases (BARRIER_RUNNER, READ_DONE).
"""
import contextlib
import types

import pytest
import torch
from release import RELEASE

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
from sglang.srt.speculative import frozen_kv_mtp_worker_v2 as fkv
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

pytestmark = pytest.mark.stack("frozen-kv-mtp-speed", step="war-barrier-verify-event")

# The barrier's runner and its read-done event, by name.
if RELEASE >= (0, 5, 23):
    # (the attention backend declares where a graph's shared reads end: shared_read_ends)
    BARRIER_RUNNER, READ_DONE = "last_shared_read_runner", "shared_read_done_event"
else:
    # (the graph runner decides where a graph's shared reads end)
    BARRIER_RUNNER, READ_DONE = "war_fastpath_runner", "war_fastpath_read_done_event"


def runner(name):
    r = types.SimpleNamespace(name=name)
    setattr(r, READ_DONE, None)
    return r


def frozen_worker(topk):
    w = object.__new__(fkv.FrozenKVMTPWorkerV2)
    w.topk = topk
    w._target_worker = types.SimpleNamespace(model_runner=runner("target-runner"))
    w._draft_worker = types.SimpleNamespace(draft_runner=runner("draft-runner"))
    return w


# topk > 1 compacts the accepted path after verify, reading req_to_token: the whole
# forward's barrier stays.
@pytest.mark.stack("frozen-kv-mtp-speed", step="war-barrier-verify-event", fails_before=True)
@pytest.mark.parametrize("topk, runner_name", [(1, "target-runner"), (2, "draft-runner")])
def test_barrier_reads_the_target_runner_at_topk_1(topk, runner_name):
    assert getattr(frozen_worker(topk), BARRIER_RUNNER).name == runner_name


def barrier_after_verify(worker):
    """The scheduler's WAR barrier after a decode round whose verify graph
    published its read-done event on the target runner (the frozen drafter's
    draft-extend runs no forward: the draft runner publishes nothing)."""
    waits = []
    s = object.__new__(Scheduler)
    s._war_barrier_enabled = True
    s.model_worker = worker
    s.forward_stream = "forward-stream"
    s.schedule_stream = types.SimpleNamespace(
        wait_event=lambda ev: waits.append(("event", ev)),
        wait_stream=lambda stream: waits.append(("stream", stream)),
    )
    target = worker._target_worker.model_runner
    setattr(target, READ_DONE, "verify-read-done")
    s._apply_war_barrier()
    return waits, target


@pytest.mark.stack("frozen-kv-mtp-speed", step="war-barrier-verify-event", fails_before=True)
@pytest.mark.parametrize("topk, wait", [(1, ("event", "verify-read-done")), (2, ("stream", "forward-stream"))])
def test_scheduler_waits_on_the_verify_event_not_the_forward(topk, wait):
    waits, target = barrier_after_verify(frozen_worker(topk))
    assert waits == [wait]
    if topk == 1:
        assert getattr(target, READ_DONE) is None  # consumed: a round that skips it falls back


# ------------------------------------------------ the verify graph publishes its event

class Event:
    def __init__(self, log):
        self.log = log

    def record(self):
        self.log.append("event")


def replays_into(r, log):
    """Stand-ins for the graph replay of runner ``r``: loading, events and the replay
    append to ``log``."""
    r.device_module = types.SimpleNamespace(Event=lambda: Event(log))
    r.backend = types.SimpleNamespace(
        replay_session=contextlib.nullcontext,
        replay=lambda key, fb: log.append("replay")
        or LogitsProcessorOutput(next_token_logits=torch.zeros(4, 8), hidden_states=None),
    )
    r.load_batch = lambda fb, pp=None: log.append("load")
    r._replay_graph_key = None
    r.raw_num_token = 4
    r.is_dllm = False
    return r


def graph_runner(algorithm, log, breakable=False):
    """0.5.17's DecodeCudaGraphRunner over stand-ins."""
    r = object.__new__(DecodeCudaGraphRunner)
    r.model_runner = types.SimpleNamespace(
        device_timer=None,
        spec_algorithm=SpeculativeAlgorithm.from_string(algorithm),
        war_fastpath_read_done_event=None,
    )
    r.attn_backend = types.SimpleNamespace(
        use_captured_forward_metadata_for_breakable_cuda_graph=breakable
    )
    return replays_into(r, log)


@pytest.mark.stack("frozen-kv-mtp-speed", step="war-barrier-verify-event", bases=("0.5.17",))
@pytest.mark.parametrize(
    "algorithm, mode, order",
    [
        # the fork: FROZEN_KV_MTP's verify publishes at its pre-replay snapshot
        ("FROZEN_KV_MTP", ForwardMode.TARGET_VERIFY, ["load", "event", "replay"]),
        # stock behaviour kept: EAGLE's verify publishes nothing (draft-extend reads after it)
        ("EAGLE", ForwardMode.TARGET_VERIFY, ["load", "replay"]),
        ("NONE", ForwardMode.DECODE, ["load", "event", "replay"]),
    ],
)
def test_verify_graph_publishes_its_read_done_event(algorithm, mode, order):
    log = []
    r = graph_runner(algorithm, log)
    out = r.execute(types.SimpleNamespace(forward_mode=mode))
    assert log == order
    assert (r.model_runner.war_fastpath_read_done_event is not None) == ("event" in order)
    assert out.next_token_logits.shape == (4, 8)


@pytest.mark.stack("frozen-kv-mtp-speed", step="war-barrier-verify-event", bases=("0.5.17",))
def test_breakable_verify_graph_publishes_after_replay():
    log = []
    graph_runner("FROZEN_KV_MTP", log, breakable=True).execute(
        types.SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY)
    )
    assert log == ["load", "replay", "event"]


def graph_runner_0523(log, in_graph_marker=True):
    """0.5.23's DecodeCudaGraphRunner over stand-ins, on a triton attention
    backend (what FROZEN_KV_MTP verifies Gemma-4 with): the backend declares
    where the graph's shared reads end."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    r = object.__new__(DecodeCudaGraphRunner)
    r.model_runner = types.SimpleNamespace(
        device_timer=None,
        is_draft_worker=False,
        spec_algorithm=SpeculativeAlgorithm.from_string("FROZEN_KV_MTP"),
        shared_read_done_event=None,
    )
    r.enable_pdmux = False
    r.attn_backend = object.__new__(TritonAttnBackend)
    r.in_graph_metadata_prep_done = "in-graph-marker" if in_graph_marker else None
    r.model_context = contextlib.nullcontext
    return replays_into(r, log)


@pytest.mark.stack("frozen-kv-mtp-speed", step="war-barrier-verify-event", bases=("0.5.23",))
def test_upstream_verify_graph_publishes_its_in_graph_marker():
    """The runner half of the 0.5.17 step is upstream on 0.5.23: the verify
    graph hands the barrier the in-graph marker recorded after its metadata
    reads (no event of its own), for FROZEN_KV_MTP as for every algorithm."""
    log = []
    r = graph_runner_0523(log)
    out = r.execute(types.SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY))
    assert log == ["load", "replay"]
    assert r.model_runner.shared_read_done_event == "in-graph-marker"
    assert out.next_token_logits.shape == (4, 8)


@pytest.mark.stack("frozen-kv-mtp-speed", step="war-barrier-verify-event", bases=("0.5.23",))
def test_upstream_verify_graph_without_marker_publishes_after_replay():
    log = []
    r = graph_runner_0523(log, in_graph_marker=False)
    r.execute(types.SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY))
    assert log == ["load", "replay", "event"]
    assert isinstance(r.model_runner.shared_read_done_event, Event)
