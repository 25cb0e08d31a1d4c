"""A PD prefill server under overlap scheduling sends a request's cached prefix early,
after recording an event on the forward stream: the event must be the server's
device's (a CPU server's stream is a torch.cpu.Stream)."""

import types

import pytest
import torch

pytestmark = pytest.mark.stack("generic-fixes", step="pd-prefill-early-send-event-on-device")


@pytest.mark.stack("generic-fixes", step="pd-prefill-early-send-event-on-device", fails_before=True)
def test_a_cpu_prefill_server_sends_a_cached_prefix_early():
    from sglang.srt.disaggregation.prefill import SchedulerDisaggregationPrefillMixin

    sent = []
    scheduler = types.SimpleNamespace(
        enable_staging=False, enable_overlap=True, device_module=torch.get_device_module("cpu"),
        forward_stream=torch.cpu.Stream(), token_to_kv_pool_allocator=types.SimpleNamespace(page_size=1),
        send_kv_chunk=lambda req, last_chunk, end_idx: sent.append((last_chunk, end_idx)))
    req = types.SimpleNamespace(  # 16 tokens of the prompt hit the radix cache
        pending_bootstrap=False, prefix_indices=list(range(16)), prefix_len=16, host_hit_length=0,
        early_send_prefix_end=None, start_send_idx=0, disagg_kv_sender=types.SimpleNamespace())
    SchedulerDisaggregationPrefillMixin.maybe_send_cached_prefix_chunk(scheduler, req)
    assert sent == [(False, 16)]
    req.disagg_kv_sender._early_send_wait_event.synchronize()  # what the transfer waits on
