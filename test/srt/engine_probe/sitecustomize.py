"""Test-only: records, in the engine's scheduler process, what an engine test
cannot see from outside (run by every Python process started with this folder on
PYTHONPATH; the patch applies when the process imports the module it patches).

SGLANG_TEST_YOCO_LENGTHS_LOG=FILE: one line per KV-sharing fast prefill plan,
"host" when it read the requests' full lengths from the host copy the scheduler
passed (step prefill-lengths-on-host), "device" when it had to read the device tensor.
"""

import importlib.util
import os

if os.environ.get("SGLANG_TEST_YOCO_LENGTHS_LOG"):
    # ../mtp_cpu_shim/after_import.py: patch the module when the process imports it
    _spec = importlib.util.spec_from_file_location(
        "after_import", os.path.join(os.path.dirname(__file__), "..", "mtp_cpu_shim", "after_import.py"))
    _after = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_after)

    def _log_length_reads(kv_sharing_fast_prefill_plan):
        _finishing_requests = kv_sharing_fast_prefill_plan._finishing_requests

        def _logged_finishing_requests(forward_batch, seq_cpu):
            host = forward_batch.orig_seq_lens_cpu
            on_host = host is not None and len(host) == forward_batch.batch_size
            with open(os.environ["SGLANG_TEST_YOCO_LENGTHS_LOG"], "a") as f:
                f.write("host\n" if on_host else "device\n")
            return _finishing_requests(forward_batch, seq_cpu)

        kv_sharing_fast_prefill_plan._finishing_requests = _logged_finishing_requests

    _after.after_import("sglang.srt.model_executor.kv_sharing_fast_prefill_plan", _log_length_reads)
