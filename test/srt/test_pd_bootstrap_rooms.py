"""One request in flight per bootstrap room on a PD server (stack 02).

Both servers of a pair key a request's KV transfer by its bootstrap_room. Two requests in
flight under one room stopped the prefill server (KeyError in check_status: the first to
finish cleared the room's status under the other) and mixed their transfers on the decode
server (benchmark/pd_disaggregation/cpu_faults.py found both on a CPU pair). Each server's
tokenizer manager now refuses the second with a 400 before anything is allocated for it.
The pair itself is probed in test_gemma4_yoco.py's PD pair test.
"""
import types

import pytest

pytestmark = pytest.mark.stack("generic-fixes", step="pd-one-request-per-bootstrap-room")


def _manager(mode):
    """A tokenizer manager's request bookkeeping, as its __init__ sets it up."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    tm = object.__new__(TokenizerManager)
    tm.init_running_status()
    tm.disaggregation_mode = DisaggregationMode(mode)
    tm.enable_trace = False
    return tm


def _generate(rid, room, n=None):
    from sglang.srt.managers.io_struct import GenerateReqInput

    obj = GenerateReqInput(input_ids=[[5, 6]] * n if n else [5, 6], rid=rid, bootstrap_room=room,
                           sampling_params={"max_new_tokens": 1})
    obj.normalize_batch_and_arguments()
    return obj


@pytest.mark.stack("generic-fixes", step="pd-one-request-per-bootstrap-room", fails_before=True)
@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_a_room_in_flight_is_refused_until_its_request_ends(mode):
    tm = _manager(mode)
    tm._init_req_state(_generate("a", 7))
    with pytest.raises(ValueError, match=r"bootstrap_room 7 is held by request a in flight on this "
                                         r"server: each request through a PD pair needs a room of its own"):
        tm._init_req_state(_generate("b", 7))
    assert "b" not in tm.rid_to_state  # refused whole: nothing kept for it
    tm._init_req_state(_generate("c", 8))  # another room
    del tm.rid_to_state["a"]  # a finished (or was aborted), by any path: its room is free
    tm._init_req_state(_generate("b", 7))
    # a batch naming one room twice is refused whole
    with pytest.raises(ValueError, match=r"bootstrap_room 9 is held by request d1"):
        tm._init_req_state(_generate(["d1", "d2"], [9, 9], n=2))
    assert "d1" not in tm.rid_to_state and tm.bootstrap_rooms.holder(9) is None


def test_a_server_without_pd_ignores_rooms():
    tm = _manager("null")
    tm._init_req_state(_generate("a", 7))
    tm._init_req_state(_generate("b", 7))


def test_claims_of_finished_requests_are_dropped():
    from sglang.srt.disaggregation.bootstrap_rooms import BootstrapRoomsInFlight

    in_flight = {}
    rooms = BootstrapRoomsInFlight(in_flight)
    for i in range(5000):  # each request ends before the next: claims stay bounded
        rooms.claim([(f"r{i}", i)])
        in_flight[f"r{i}"] = types.SimpleNamespace(obj=types.SimpleNamespace(bootstrap_room=i))
        if i % 10:
            del in_flight[f"r{i}"]
    assert len(rooms._claims) <= 2 * len(in_flight) + 1024 + 1
    assert all(rooms.holder(i) == f"r{i}" for i in range(0, 5000, 10))
    assert rooms.holder(1) is None
    with pytest.raises(ValueError, match="bootstrap_room 4990 is held by request r4990"):
        rooms.claim([("x", 4990)])
