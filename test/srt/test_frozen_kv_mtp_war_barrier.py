"""Step war-barrier-verify-event: FROZEN_KV_MTP's WAR barrier waits on the verify graph's read-done
event (as plain decode waits on its graph's), not on the whole forward.

Stock: FrozenKVMTPWorkerV2 inherits EAGLE v2's barrier runner (the draft
runner), which never publishes an event under the frozen drafter, and the verify
graph publishes none outside DFlash, so the scheduler always took
``wait_stream(forward_stream)``. CPU only: the graph runner's ``execute`` runs
over stand-ins (load and replay recorded, events counted).
"""

import contextlib
import types

import pytest
import torch

from sglang.srt.layers.logits_processor import LogitsProcessorOutput
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
from sglang.srt.speculative import frozen_kv_mtp_worker_v2 as fkv
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

pytestmark = pytest.mark.stack("frozen-kv-mtp-speed", step="war-barrier-verify-event")


def frozen_worker(topk):
    w = object.__new__(fkv.FrozenKVMTPWorkerV2)
    w.topk = topk
    w._target_worker = types.SimpleNamespace(model_runner="target-runner")
    w._draft_worker = types.SimpleNamespace(draft_runner="draft-runner")
    return w


@pytest.mark.stack("frozen-kv-mtp-speed", step="war-barrier-verify-event", fails_before=True)
def test_topk_1_barrier_reads_the_target_runner():
    assert frozen_worker(1).war_fastpath_runner == "target-runner"


def test_topk_above_1_keeps_the_whole_forward_barrier():
    # topk > 1 compacts the accepted path after verify, reading req_to_token
    assert frozen_worker(2).war_fastpath_runner == "draft-runner"


class Event:
    def __init__(self, log):
        self.log = log

    def record(self):
        self.log.append("event")


def graph_runner(algorithm, log, breakable=False):
    r = object.__new__(DecodeCudaGraphRunner)
    r.model_runner = types.SimpleNamespace(
        device_timer=None,
        spec_algorithm=SpeculativeAlgorithm.from_string(algorithm),
        war_fastpath_read_done_event=None,
    )
    r.attn_backend = types.SimpleNamespace(
        use_captured_forward_metadata_for_breakable_cuda_graph=breakable
    )
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


def test_breakable_verify_graph_publishes_after_replay():
    log = []
    graph_runner("FROZEN_KV_MTP", log, breakable=True).execute(
        types.SimpleNamespace(forward_mode=ForwardMode.TARGET_VERIFY)
    )
    assert log == ["load", "replay", "event"]
