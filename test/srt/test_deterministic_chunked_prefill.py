"""Deterministic inference with a chunked prefill size below the truncation alignment.

Under --enable-deterministic-inference, prefill chunks are cut to a multiple of the
backend's alignment (4096 on triton and flashinfer); PrefillAdder.add_one_req finds no
room for a chunk shorter than that, so with --chunked-prefill-size 997 a prompt longer
than one chunk was never scheduled (the scheduler spun, the request never finished).
The scheduler refuses the combination at start-up (0.5.23 has upstream's check; on
0.5.17 it is step deterministic-chunk-below-truncation-align). The check is called on a
stand-in for the scheduler: no engine starts.
"""

from types import SimpleNamespace as NS

import pytest

pytestmark = pytest.mark.stack(
    "generic-fixes", step="deterministic-chunk-below-truncation-align", fails_before=True
)


@pytest.fixture
def scheduler(monkeypatch):
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers import scheduler as scheduler_module

    parallel = NS(attn_dp_size=1)
    monkeypatch.setattr(scheduler_module, "get_parallel", lambda: parallel)

    def make(align, chunk, mode=DisaggregationMode.NULL, attn_dp_size=1):
        parallel.attn_dp_size = attn_dp_size
        return NS(truncation_align_size=align, chunked_prefill_size=chunk,
                  disaggregation_mode=mode)

    return make


def _check(stub):
    from sglang.srt.managers.scheduler import Scheduler

    Scheduler.check_truncation_align_fits_chunk(stub)


def test_chunk_below_the_alignment_refused(scheduler):
    with pytest.raises(ValueError, match=r"aligned to 4096 tokens.*chunked prefill size is 997"
                       r".*could never be scheduled.*--chunked-prefill-size to at least 4096"):
        _check(scheduler(4096, 997))
    with pytest.raises(ValueError, match=r"split across 2 DP attention ranks.*at least 8192"):
        _check(scheduler(4096, 2048, attn_dp_size=2))


def test_chunks_that_fit_and_servers_that_never_prefill_pass(scheduler):
    from sglang.srt.disaggregation.utils import DisaggregationMode

    _check(scheduler(4096, 4096))
    _check(scheduler(4096, 8192))
    _check(scheduler(None, 997))  # not deterministic: no alignment
    _check(scheduler(4096, None))  # chunked prefill off
    _check(scheduler(4096, 997, mode=DisaggregationMode.DECODE))


@pytest.mark.stack("generic-fixes", step="deterministic-chunk-below-truncation-align",
                   fails_before=True, bases=("0.5.17",))
def test_triton_deterministic_alignment_meets_the_check(scheduler, monkeypatch):
    """0.5.17's triton alignment (SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE, 4096),
    as the scheduler sets it up before the check (0.5.23's triton has none)."""
    from sglang.srt.managers import scheduler as scheduler_module
    from sglang.srt.managers.scheduler import Scheduler

    monkeypatch.delenv("SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE", raising=False)
    monkeypatch.setattr(scheduler_module, "get_exec", lambda: NS(
        deterministic=NS(enable_deterministic_inference=True)))
    stub = scheduler(None, 997)
    stub.server_args = NS(attention_backend="triton")
    Scheduler.init_deterministic_inference_config(stub)
    assert stub.truncation_align_size == 4096
    with pytest.raises(ValueError, match=r"SGLANG_TRITON_PREFILL_TRUNCATION_ALIGN_SIZE"):
        _check(stub)
