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
@pytest.mark.parametrize("mirror", [True, False], ids=["host-mirror", "no-mirror"])
def test_draft_sizes_the_round_without_reading_the_device(monkeypatch, mirror):
    """With the lengths' host mirror the draft sums it; without one (overlap scheduling
    on triton publishes none) the sum stays unknown rather than read from the device."""
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
        seq_lens_cpu=torch.tensor(lengths) if mirror else None,
        seq_lens_sum=None,
    )
    worker = types.SimpleNamespace(topk=1, draft_model_runner=None,
                                   _position_for_batch=lambda b: b.seq_lens.clone())
    host = [batch.seq_lens_cpu] if mirror else []
    with HostSyncProbe(host=host) as probe, pytest.raises(RoundPrepared):
        worker_module.FrozenKVMTPDraftWorker.draft(worker, batch)
    assert not probe.reads, probe.reads
    assert seen["seq_lens_sum"] == (sum(lengths) if mirror else None)


@pytest.mark.stack("frozen-kv-mtp-speed", step="frozen-kv-mtp-draft-host-length-sum", fails_before=True)
def test_verify_mask_sized_without_the_sum():
    """The verify mask as EAGLE's draft sizes it: the target's preallocated buffer where
    the batch fits (no sum needed; filled only if the backend reads it), else an
    allocation sized by the sum, or without one by the context bound."""
    from sglang.srt.layers.attention.verify_mask import VerifyMask
    from sglang.srt.speculative import frozen_kv_mtp_worker_v2 as worker_module
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

    backend = types.SimpleNamespace(verify_mask=None)
    worker = types.SimpleNamespace(target_worker=types.SimpleNamespace(model_runner=types.SimpleNamespace(
        attn_backend=backend, model_config=types.SimpleNamespace(context_len=100))))
    args = worker_module.FrozenKVMTPDraftWorker._verify_mask_args

    def batch(lengths_sum):
        return types.SimpleNamespace(seq_lens=torch.tensor([5, 7, 9]), seq_lens_sum=lengths_sum)

    full = TreeMaskMode.FULL_MASK
    assert args(worker, batch(21)) == (21, full, None, True)
    assert args(worker, batch(None)) == (3 * 100, full, None, True)
    buffer = torch.zeros(8)
    backend.verify_mask = VerifyMask(buffer=buffer, mode=TreeMaskMode.QLEN_ONLY, max_bs=4, is_read=False)
    got = args(worker, batch(None))
    assert got[0] == 0 and got[1] == TreeMaskMode.QLEN_ONLY and got[2] is buffer and got[3] is False
    backend.verify_mask = VerifyMask(buffer=buffer, mode=full, max_bs=2)
    assert args(worker, batch(None)) == (3 * 100, full, None, True)  # 3 rows do not fit


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
