"""YOCO fast prefill under FROZEN_KV_MTP, on CPU, no engine. Step
mtp-target-prefill-captures-last: the target prefill asks for LAST hidden states, FULL
only when a request, the server or spec_info needs every token's (stock: always FULL, so
YOCO never fired); per MTP phase, whether YOCO fires (the real predicate and batches).
"""

import types
from contextlib import contextmanager, nullcontext

import pytest
import torch
from release import RELEASE

from test_gemma4_yoco import make_batch, reason

from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode, ForwardMode, get_required_capture_hidden_mode)
from sglang.srt.runtime_context import get_context
from sglang.srt.speculative import frozen_kv_mtp_worker_v2 as fkv
from sglang.srt.speculative.frozen_kv_mtp_info import FrozenKVMTPDraftInput
from sglang.srt.utils import empty_context


def target_prefill_capture_mode(*args):
    # Imported on use: the assistant tests below run at the step before this module exists.
    from sglang.srt.speculative import frozen_kv_mtp_prefill_capture

    return frozen_kv_mtp_prefill_capture.target_prefill_capture_mode(*args)

pytestmark = pytest.mark.stack("yoco-mtp")

NULL, LAST, FULL = CaptureHiddenMode.NULL, CaptureHiddenMode.LAST, CaptureHiddenMode.FULL
HIDDEN = 8  # target hidden size of the fake target forward


def ns_batch(mode=NULL, spec_info=None):
    return types.SimpleNamespace(return_hidden_states_mode=mode, spec_info=spec_info)


# target_prefill_capture_mode's second argument: the server's mode, which the worker computes


@pytest.mark.stack("yoco-mtp", step="mtp-target-prefill-captures-last", fails_before=True)
def test_capture_mode_plain_batch_is_last():
    assert target_prefill_capture_mode(ns_batch(), NULL) == LAST
    # the real batch's defaults: no request asks for more
    sched = ScheduleBatch(reqs=[])
    assert sched.return_hidden_states_mode == NULL and sched.spec_info is None
    assert target_prefill_capture_mode(sched, NULL) == LAST


@pytest.mark.parametrize(
    "req_mode, server_mode, spec_mode, want",
    [(LAST, NULL, None, LAST), (FULL, NULL, None, FULL),  # a request with return_hidden_states: FULL
     (NULL, LAST, None, LAST), (NULL, FULL, None, FULL), (FULL, LAST, None, FULL),  # the larger of the two
     (NULL, NULL, NULL, LAST), (NULL, NULL, LAST, LAST), (NULL, NULL, FULL, FULL)],
)
@pytest.mark.stack("yoco-mtp", step="mtp-target-prefill-captures-last")
def test_capture_mode_follows_requests_server_and_spec_info(req_mode, server_mode, spec_mode, want):
    spec = None if spec_mode is None else types.SimpleNamespace(capture_hidden_mode=spec_mode)
    assert target_prefill_capture_mode(ns_batch(req_mode, spec), server_mode) == want
    if spec is None and server_mode == NULL:
        sched = ScheduleBatch(reqs=[])
        sched.return_hidden_states_mode = req_mode
        assert target_prefill_capture_mode(sched, NULL) == want


# ------------------------------------------------ the worker uses it


class FakeTarget:
    """Records the capture mode asked for; returns hidden states of that shape (FULL:
    row r is new token r's, LAST: each request's last new token's)."""

    def __init__(self):
        self.calls = []

    def forward_batch_generation(self, batch, capture_hidden_mode=None, **kw):
        self.calls.append(capture_hidden_mode)
        n = sum(batch.extend_lens)
        full = torch.arange(n, dtype=torch.float32)[:, None].repeat(1, HIDDEN)
        if capture_hidden_mode == FULL:
            hidden = full
        else:
            last = torch.cumsum(torch.tensor(batch.extend_lens), 0) - 1
            hidden = full[last]
        out = types.SimpleNamespace(hidden_states=hidden, mm_input_embeds=None)
        return types.SimpleNamespace(logits_output=out,
                                     next_token_ids=torch.arange(len(batch.extend_lens)) + 7)


# How the prefill branch enters the draft's TP group: 0.5.17 through the draft worker's
# own draft_tp_context(draft_runner.tp_group); 0.5.23 through spec_utils' draft_tp_context
# with the draft worker's parallel_layout.


class FakeDraft:
    """Draft worker: only what the prefill branch touches."""

    def __init__(self):
        self.seed_args = None
        self.tp_contexts = []
        self.draft_runner = types.SimpleNamespace(tp_group="draft-tp-group")
        if RELEASE >= (0, 5, 23):
            self.parallel_layout = "draft-tp-group"

    @contextmanager
    def draft_tp_context(self, tp_group):
        self.tp_contexts.append(tp_group)
        yield

    def _draft_extend_for_prefill(self, batch, hidden, next_token_ids, mm_input_embeds):
        self.seed_args = (batch, hidden, next_token_ids, mm_input_embeds)
        return "seed"


def real_draft_worker(topk=1):
    """FrozenKVMTPDraftWorker without __init__: its real seed selection
    (_draft_extend_for_prefill -> select_last_extend_hidden -> seed input)."""
    draft = object.__new__(fkv.FrozenKVMTPDraftWorker)
    draft.topk = topk
    draft.draft_tp_context = empty_context  # what __init__ sets without DP attention
    # draft_runner -> model_runner -> _model_runner (read-only properties)
    draft._model_runner = types.SimpleNamespace(tp_group=None)
    if RELEASE >= (0, 5, 23):
        # what __init__ resolves for the frozen draft (the target's layout)
        draft.parallel_layout = types.SimpleNamespace(tp_group=None)
    return draft


def draft_context(draft):
    if RELEASE >= (0, 5, 23):
        from unittest import mock

        # a FakeDraft records the layout entered through spec_utils' context
        if isinstance(draft, FakeDraft):
            return mock.patch.object(fkv, "draft_tp_context", draft.draft_tp_context)
    return nullcontext()


@contextmanager
def published_server(**fields):
    """A dummy-model ServerArgs with ``fields``, published as the process's settings
    (read on 0.5.23; 0.5.17's worker gets it as its server_args), restored after."""
    override = get_context().override_server_args(**fields)
    server = override.install()
    try:
        yield server
    finally:
        override.restore()


def make_worker(draft, server_args):
    """FrozenKVMTPWorkerV2 without __init__ (which builds model runners)."""
    worker = object.__new__(fkv.FrozenKVMTPWorkerV2)
    worker._target_worker, worker._draft_worker, worker.server_args = FakeTarget(), draft, server_args
    return worker


def extend_batch(extend_lens, return_hidden_states_mode=NULL):
    """A real ScheduleBatch for a prefill (reqs are placeholders: only their count is read)."""
    batch = ScheduleBatch(reqs=[types.SimpleNamespace() for _ in extend_lens])
    batch.forward_mode, batch.extend_lens = ForwardMode.EXTEND, list(extend_lens)
    batch.seq_lens, batch.return_hidden_states_mode = torch.tensor(extend_lens), return_hidden_states_mode
    return batch


def run_prefill(extend_lens, return_hidden_states_mode=NULL, server=None, draft=None):
    """One target-prefill step through forward_batch_generation, with ServerArgs fields
    ``server`` published: (the capture mode the target was asked for, output, worker)."""
    draft = draft or FakeDraft()
    with published_server(**(server or {})) as server_args, draft_context(draft):
        worker = make_worker(draft, server_args)
        batch = extend_batch(extend_lens, return_hidden_states_mode)
        out = worker.forward_batch_generation(batch)
    (mode,) = worker._target_worker.calls
    return mode, out, worker


@pytest.mark.stack("yoco-mtp", step="mtp-target-prefill-captures-last")
def test_worker_target_prefill_asks_for_last():
    # The prefill branch's module-level context managers (speculative_moe_*,
    # spec_stage_span) run for real: they need no GPU and no published args.
    draft = FakeDraft()
    mode, out, _ = run_prefill([5, 9, 1], draft=draft)
    assert mode == LAST
    assert out.next_draft_input == "seed"
    batch, hidden, next_ids, mm = draft.seed_args
    assert out.new_seq_lens is batch.seq_lens  # spec-v2: length before this step
    assert hidden is out.logits_output.hidden_states and hidden.shape == (3, HIDDEN)
    assert next_ids is out.next_token_ids and mm is None
    assert draft.tp_contexts == ["draft-tp-group"]


@pytest.mark.parametrize("server, want", [
    ({}, LAST), ({"return_hidden_states_mode": "last"}, LAST), ({"return_hidden_states_mode": "full"}, FULL),
    ({"enable_return_hidden_states": True}, FULL),
], ids=["default", "mode-last", "mode-full", "enable"])
@pytest.mark.stack("yoco-mtp", step="mtp-target-prefill-captures-last")
def test_worker_target_prefill_follows_the_server(server, want):
    # the server's mode, read from the real settings (no request asks for anything)
    assert run_prefill([5, 9], server=server)[0] == want


@pytest.mark.stack("yoco-mtp", step="mtp-target-prefill-captures-last")
@pytest.mark.parametrize("rhs_mode", [NULL, LAST, FULL], ids=["NULL", "LAST", "FULL"])
def test_real_seed_reads_each_requests_last_hidden_row(rhs_mode):
    # the real draft worker seeds from each request's last prompt token, LAST or FULL captured
    ext = [5, 9, 1, 3]
    mode, out, _ = run_prefill(ext, rhs_mode, draft=real_draft_worker())
    assert mode == (FULL if rhs_mode == FULL else LAST)
    seed = out.next_draft_input
    assert isinstance(seed, FrozenKVMTPDraftInput)
    last_rows = (torch.cumsum(torch.tensor(ext), 0) - 1).tolist()  # [4, 13, 14, 17]
    assert seed.hidden_states[:, 0].tolist() == last_rows
    assert seed.bonus_tokens.tolist() == out.next_token_ids.tolist()
    assert seed.capture_hidden_mode == LAST


# ------------------------------------------------ does YOCO fire, per MTP phase


@pytest.mark.parametrize("ext, rhs_mode, want", [
    ([5, 9, 1], NULL, None),
    # a request that returns hidden states still runs in full (as every stock MTP prefill did)
    ([5, 9, 1], FULL, "full_hidden_capture"),
    ([1, 1], NULL, "one_token_per_request"),  # one new token each: nothing to save
])
def test_phase_target_prefill(ext, rhs_mode, want):
    # target prefill (EXTEND) with the capture mode the worker really asks for
    mode, _, _ = run_prefill(ext, return_hidden_states_mode=rhs_mode)
    assert mode == (FULL if rhs_mode == FULL else LAST)
    fb = make_batch(ext)
    fb.capture_hidden_mode = mode
    assert reason(fb) == want


def test_phase_assistant_draft_steps_do_not_fire():
    # seed and recurrent draft steps: DECODE, the seed's spec_info raising NULL to LAST
    _, out, _ = run_prefill([5, 9], draft=real_draft_worker())
    seed = out.next_draft_input
    mode = get_required_capture_hidden_mode(NULL, seed)
    assert mode == LAST
    fb = make_batch([5, 9], mode=ForwardMode.DECODE)
    fb.capture_hidden_mode = mode
    # even if the assistant's model had a first shared layer, DECODE never fires (and a
    # draft worker plans nothing: test_gemma4_yoco)
    assert reason(fb) == "forward_mode"


def test_phase_target_verify_does_not_fire():
    # TARGET_VERIFY, capturing FULL as the drafter's verify input asks
    fb = make_batch([4, 4], mode=ForwardMode.TARGET_VERIFY)
    fb.capture_hidden_mode = FULL
    assert reason(fb) == "forward_mode"
