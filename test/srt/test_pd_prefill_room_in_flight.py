"""A prefill server of PD disaggregation refuses a bootstrap room already in flight.

Two requests under one bootstrap_room share its transfer status (kept by room): the
first to finish clears it, and polling the other's then stops the scheduler (seen on a
CPU pair: KeyError in check_status, the prefill server gone;
benchmark/pd_disaggregation/cpu_faults.py). The bootstrap queue answers the second with
a 400 before any sender is made for it; a room is free again once its request finished.
"""
import types

import pytest

pytestmark = pytest.mark.stack("generic-fixes", step="pd-prefill-refuses-a-room-in-flight")


def _queue(in_flight):
    from sglang.srt.disaggregation.base import KVPoll
    from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue

    q = PrefillBootstrapQueue.__new__(PrefillBootstrapQueue)
    q.kv_manager = types.SimpleNamespace(request_status={r: KVPoll.Bootstrapping for r in in_flight})
    q.streamed = []
    q.scheduler = types.SimpleNamespace(output_streamer=types.SimpleNamespace(
        stream_output=lambda reqs, return_logprob: q.streamed.extend(reqs)))
    q._check_if_req_exceed_kv_capacity = lambda req: False  # sized elsewhere
    return q


def _req(room):
    return types.SimpleNamespace(rid=f"r{room}", bootstrap_room=room, return_logprob=False,
                                 finished_reason=None)


@pytest.mark.stack("generic-fixes", step="pd-prefill-refuses-a-room-in-flight", fails_before=True)
def test_a_room_in_flight_is_refused_with_a_400(monkeypatch):
    from sglang.srt.disaggregation import prefill

    made = []

    def sender_class(backend, kind):  # a sender would register the room
        return lambda **kw: made.append(kw["bootstrap_room"]) or types.SimpleNamespace()

    monkeypatch.setattr(prefill, "get_kv_class", sender_class)
    q = _queue(in_flight=[7])
    req = _req(7)
    assert q.create_sender(req, num_kv_heads=1) is False
    assert made == [] and q.streamed == [req]  # answered now, no sender made
    assert req.finished_reason.status_code == 400
    assert "bootstrap_room 7 is held by another request in flight" in req.finished_reason.message


def test_a_free_room_gets_its_sender(monkeypatch):
    from sglang.srt.disaggregation import prefill

    made = []
    monkeypatch.setattr(prefill, "get_kv_class", lambda backend, kind: (
        lambda **kw: made.append(kw["bootstrap_room"]) or types.SimpleNamespace()))
    q = _queue(in_flight=[7])
    q.transfer_backend, q.bootstrap_port, q.tp_rank, q.pp_rank = None, 1, 0, 0
    q._process_req = lambda req: None
    for room in (8, None):
        req = _req(room)
        req.bootstrap_host, req.disagg_prefill_dp_rank = "127.0.0.1", None
        assert q.create_sender(req, num_kv_heads=1) is True and req.finished_reason is None
    assert made == [8, None] and q.streamed == []
