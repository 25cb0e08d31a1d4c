"""FROZEN_KV_MTP's draft prepares a round without reading a value back from the device.

A read of a device tensor (`.item()`, `.tolist()`, `int(t)`, ...) makes the host wait
for every kernel queued before it: here the previous verify, so the host could build
and launch this round only after the device went idle. The draft sizes its inputs from
the scheduler's host mirror of the lengths instead. mtp_cpu_shim/host_sync_probe.py
models the device on this CPU (tensors that existed before the call are the device's,
but for the named host mirrors); the engine tests of 4, 5 and 7 steps
(test_frozen_kv_mtp_steps.py) run every decode round of a real engine under it.
"""
import os
import sys
import types

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "mtp_cpu_shim"))
from host_sync_probe import HostSyncProbe  # noqa: E402

pytestmark = pytest.mark.stack("frozen-kv-mtp-speed", step="frozen-kv-mtp-draft-host-length-sum")


class RoundPrepared(Exception):
    """Raised where the draft hands its batch to the model runner."""


@pytest.mark.stack("frozen-kv-mtp-speed", step="frozen-kv-mtp-draft-host-length-sum", fails_before=True)
def test_draft_sizes_the_round_from_the_host_mirror(monkeypatch):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode
    from sglang.srt.speculative import frozen_kv_mtp_worker_v2 as worker_module
    from sglang.srt.speculative.frozen_kv_mtp_info import FrozenKVMTPDraftInput

    seen = {}

    def init_new(batch, *args, **kwargs):
        seen["seq_lens_sum"] = batch.seq_lens_sum
        raise RoundPrepared

    monkeypatch.setattr(worker_module.ForwardBatch, "init_new", init_new)
    lengths = [17, 40, 9]
    spec_info = FrozenKVMTPDraftInput.__new__(FrozenKVMTPDraftInput)
    batch = types.SimpleNamespace(
        forward_mode=ForwardMode.DECODE,
        spec_info=spec_info,
        seq_lens=torch.tensor(lengths),
        seq_lens_cpu=torch.tensor(lengths),
        seq_lens_sum=None,
    )
    worker = types.SimpleNamespace(topk=1, draft_model_runner=None,
                                   _position_for_batch=lambda b: b.seq_lens.clone())
    with HostSyncProbe(host=[batch.seq_lens_cpu]) as probe, pytest.raises(RoundPrepared):
        worker_module.FrozenKVMTPDraftWorker.draft(worker, batch)
    assert not probe.reads, probe.reads
    assert seen["seq_lens_sum"] == sum(lengths)


def test_the_probe_reports_sglangs_reads_of_the_device_only():
    """The probe itself: SGLang code reading a device tensor (or one made from it) is
    reported; reading a host mirror, or a read in the test's own code, is not."""
    import sglang

    code = compile("def read(t):\n    return t.sum().item()\n",
                   os.path.join(os.path.dirname(sglang.__file__), "probe_check.py"), "exec")
    in_sglang = {}
    exec(code, in_sglang)
    device, host = torch.tensor([3, 4]), torch.tensor([3, 4])
    with HostSyncProbe(host=[host]) as probe:
        in_sglang["read"](host)
        in_sglang["read"](host[:1] * 2)
        int(device.sum())  # the test's own read
        assert probe.reads == []
        in_sglang["read"](device + host)
    assert probe.reads == ["item() at probe_check.py:2"], probe.reads
