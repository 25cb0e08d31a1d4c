"""PD disaggregation fixes. A prefill server under overlap scheduling sends a request's
cached prefix early, after recording an event on the forward stream: the event must be
the server's device's (a CPU server's stream is a torch.cpu.Stream). FROZEN_KV_MTP's
drafter has no KV pool of its own to transfer."""

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


@pytest.mark.stack("generic-fixes", step="frozen-kv-mtp-no-draft-kv-transfer", fails_before=True, bases=("0.5.17",))
def test_frozen_kv_mtp_has_no_draft_kv_pool_to_transfer():
    from sglang.srt.mem_cache.kv_cache_builder import get_draft_kv_pool
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    worker = types.SimpleNamespace(draft_worker=types.SimpleNamespace(
        draft_runner=types.SimpleNamespace(token_to_kv_pool="the drafter's pool")))
    args = types.SimpleNamespace(enable_multi_layer_eagle=False)
    pool = lambda algo: get_draft_kv_pool(  # noqa: E731
        draft_worker=worker, spec_algorithm=SpeculativeAlgorithm[algo], server_args=args)
    assert pool("FROZEN_KV_MTP") is None  # a placeholder the target's pages would overrun
    assert pool("EAGLE") == "the drafter's pool"  # other drafters write their own KV
