"""Test-only: records, in the engine's scheduler process, what an engine test
cannot see from outside (imported by every Python process started with this
folder on PYTHONPATH).

SGLANG_TEST_YOCO_LENGTHS_LOG=FILE: one line per KV-sharing fast prefill plan,
"host" when it read the requests' full lengths from the host copy the scheduler
passed (step prefill-lengths-on-host), "device" when it had to read the device tensor.
"""

import os

if os.environ.get("SGLANG_TEST_YOCO_LENGTHS_LOG"):
    from sglang.srt.layers import kv_sharing_fast_prefill

    _finishing_requests = kv_sharing_fast_prefill._finishing_requests

    def _logged_finishing_requests(forward_batch, seq_cpu):
        host = forward_batch.orig_seq_lens_cpu
        on_host = host is not None and len(host) == forward_batch.batch_size
        with open(os.environ["SGLANG_TEST_YOCO_LENGTHS_LOG"], "a") as f:
            f.write("host\n" if on_host else "device\n")
        return _finishing_requests(forward_batch, seq_cpu)

    kv_sharing_fast_prefill._finishing_requests = _logged_finishing_requests
