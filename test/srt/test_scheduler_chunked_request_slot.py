"""A chunked request's last chunk shares its prefill batch up to --max-running-requests.

Stock 0.5.17 counts a continuing chunked request twice against the request slots:
once in the batch being formed and once as a used slot of the request pool. With
every other slot taken (FROZEN_KV_MTP serving 80 prompts at --max-running-requests 80), the
request behind it waited for a prefill pass of its own (step scheduler-chunked-request-slot-count).
"""

import re
import pytest

pytestmark = pytest.mark.stack("generic-fixes", step="scheduler-chunked-request-slot-count", fails_before=True)

MRR = 2


def _prefill_batches(log):
    """(#new-seq, #running-req) of each 'Prefill batch' line, in order."""
    return [
        (int(n), int(r))
        for n, r in re.findall(r"Prefill batch.*?#new-seq: (\d+),.*?#running-req: (\d+),", log)
    ]


def test_last_chunk_and_a_waiting_request_share_one_prefill(model_dir, capfd):
    """--max-running-requests 2, chunks of 64 tokens: a 200-token prompt takes four
    passes (64, 64, 64, 8); a 10-token prompt sent with it fits beside the last chunk,
    both in tokens and in request slots (the chunked one keeps its own slot)."""
    from cpu_engine import start_engine

    eng = start_engine(
        model_dir,
        max_running_requests=MRR,
        chunked_prefill_size=64,
        schedule_policy="fcfs",
        disable_radix_cache=True,
        disable_overlap_schedule=True,
        log_level="info",
    )
    try:
        long, short = list(range(3, 203)), list(range(300, 310))
        # Two tokens: the scheduler logs a prefill batch after streaming its outputs, so
        # with one token the requests could finish, and the engine shut down, before the
        # last pass's line was written (seen once in CI); a decode step now follows it.
        outs = eng.generate(
            input_ids=[long, short], sampling_params={"max_new_tokens": 2, "temperature": 0.0}
        )
        assert [len(o["output_ids"]) for o in outs] == [2, 2]
    finally:
        eng.shutdown()
    batches = _prefill_batches(capfd.readouterr().err)
    # Stock: (1, 0) five times, the short prompt alone after the last chunk.
    assert batches == [(1, 0), (1, 0), (1, 0), (2, 0)], batches
