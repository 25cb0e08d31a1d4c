"""A prefill/decode pair that loses either server while a request's KV is in flight.

The pair (pd_pair.py: two CPU servers of the tiny Gemma-4, mooncake's engine stood in by
real copies between the processes) holds one transfer in flight (the stand-in waits
while a file exists), and the test SIGKILLs one server meanwhile:
- the decode server lost: the prefill server answers that request with an error naming
  the failed transfer, frees what it held and keeps serving; a decode server started
  again serves through the pair as before;
- the prefill server lost: the decode server answers its waiting request with an error
  within a bounded time (it notices the lost peer, well inside the waiting timeout),
  frees what it held and keeps serving; a prefill server started again on the same
  bootstrap port serves through the pair as before;
- first, the prefill server restarted at once with no request in flight (the decode
  server's heartbeat set never to give up on it by failed probes): the decode server
  takes the new one, which serves through the pair as before.
"Frees what it held": once the server is idle, its KV pool holds no token (after a
cache flush) and its disaggregation queues are empty.
"""
import os
import signal
import time

import pytest
import requests

pytestmark = pytest.mark.stack("generic-fixes")

PROMPT, HELD_PROMPT, NEW = (5, 6, 7, 8, 9, 10), tuple(range(5, 100)), 4
# The decode server's wait for KV (300 s by default): set apart from the bound the test
# asserts, so an error inside it comes from the lost peer being noticed, not the timeout.
WAITING_TIMEOUT_S, NOTICED_WITHIN_S = 120, 60


@pytest.mark.stack("generic-fixes", step="pd-decode-notices-restarted-prefill", fails_before=True)
def test_a_bootstrap_address_answered_by_another_process_is_noticed():
    """The record behind the decode server's check: the instance its cached info came from
    (the pair below shows the check itself)."""
    from sglang.srt.disaggregation.bootstrap_instance import HEADER, BootstrapInstances, new_instance_headers

    a, b = new_instance_headers(), new_instance_headers()
    assert set(a) == {HEADER} and a != b  # one name a server
    seen = BootstrapInstances()
    assert not seen.replaced("p:1", b)  # nothing cached from p:1 yet
    seen.fetched("p:1", a)
    assert not seen.replaced("p:1", a) and not seen.replaced("p:1", {})  # same, or an old server
    assert seen.replaced("p:1", b)
    assert not seen.replaced("p:1", b)  # dropped: until the next fetch, nothing to compare
    seen.fetched("p:1", {})  # fetched from a server without the header: never compared
    assert not seen.replaced("p:1", a)


def test_a_pd_pair_survives_the_loss_of_either_server(model_dir, tmp_path):
    from pd_pair import PDPair, idle

    hold = str(tmp_path / "hold")
    # At first the decode server's heartbeat never drops a prefill server by failed probes
    # (by default after 2 in 10 s), so only a restart noticed as such can.
    pair = PDPair(model_dir, tmp_path, env={"SGLANG_TEST_PD_STAND_IN_HOLD": hold,
                                            "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": str(WAITING_TIMEOUT_S),
                                            "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "1000",
                                            "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "2"})

    def lose(mode, room):
        """A request through the pair whose KV transfer is held while `mode`'s server is
        SIGKILLed; (prefill response, decode response, seconds from the kill)."""
        killed = {}

        def kill():
            while not os.path.exists(hold + ".held"):
                time.sleep(0.05)
            os.killpg(pair.servers[mode].proc.pid, signal.SIGKILL)
            killed["at"] = time.time()
            time.sleep(0.5)
            os.remove(hold)  # the held write goes on, to a peer that is gone or lost its own

        open(hold, "w").close()
        p, d = pair.generate(pair.body(room, HELD_PROMPT, NEW), timeout=WAITING_TIMEOUT_S + 60,
                             while_in_flight=kill)
        os.remove(hold + ".held")
        return p, d, time.time() - killed["at"]

    def served_as_before(room):
        p, d = pair.generate(pair.body(room, PROMPT, NEW))
        assert p.status_code == 200 and d.status_code == 200, p.text + d.text
        return d.json()["output_ids"]

    try:
        pair.wait_ready()
        want = served_as_before(1)
        assert idle(pair.prefill) == {} and idle(pair.decode) == {}

        # step pd-decode-notices-restarted-prefill: before it, the decode server kept the
        # killed process's endpoints and the next request waited out both timeouts
        os.killpg(pair.prefill.proc.pid, signal.SIGKILL)
        pair.restart("prefill")
        deadline = time.time() + 60
        while "Lost connection with prefill instance" not in pair.decode.log_tail(200):
            assert time.time() < deadline, "the decode server took no new prefill server:\n" + pair.decode.log_tail()
            time.sleep(0.5)
        assert served_as_before(10) == want

        p, d, after = lose("decode", 2)
        assert isinstance(d, requests.RequestException), d
        assert p.status_code == 500 and "transfer failed" in p.text and "bootstrap_room=2" in p.text, p.text
        assert pair.prefill.alive() and idle(pair.prefill) == {}
        pair.restart("decode", env={"SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE": "2"})
        assert served_as_before(3) == want

        p, d, after = lose("prefill", 4)
        assert isinstance(p, requests.RequestException), p
        assert d.status_code == 500 and "bootstrap_room=4" in d.text, d.text
        assert after < NOTICED_WITHIN_S, (after, d.text)
        assert pair.decode.alive() and idle(pair.decode) == {}
        pair.restart("prefill")
        assert served_as_before(5) == want
        assert idle(pair.prefill) == {} and idle(pair.decode) == {}
    finally:
        pair.stop()
