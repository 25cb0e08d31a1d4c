"""Bench-only: each FROZEN_KV_MTP decode round under CUDA's sync debug mode.

A process started with this folder on PYTHONPATH and SGLANG_BENCH_ROUND_SYNC_LOG=FILE
(the engine's scheduler among them) runs every decode round of FrozenKVMTPWorkerV2
(draft, verify, the next round's seed) with torch.cuda.set_sync_debug_mode("warn"):
each operation that makes the host wait for the GPU warns, and the warning's
file:line (the Python line that asked for it) is written to FILE, after a "round"
line per round. round_syncs.py starts such an engine and counts them.
"""

import os
import sys

LOG = os.environ.get("SGLANG_BENCH_ROUND_SYNC_LOG")


def _probe_rounds(worker_module):
    import warnings

    import torch

    worker = worker_module.FrozenKVMTPWorkerV2
    forward = worker.forward_batch_generation

    def probed(self, batch, *args, **kwargs):
        mode = batch.forward_mode
        if mode.is_extend() or batch.is_extend_in_batch or mode.is_idle():
            return forward(self, batch, *args, **kwargs)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                result = forward(self, batch, *args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        lines = ["round\n"] + [
            f"sync {w.filename.split('/sglang/')[-1]}:{w.lineno}\n"
            for w in seen if "synchroniz" in str(w.message)
        ]
        with open(LOG, "a") as f:
            f.write("".join(lines))
        return result

    worker.forward_batch_generation = probed


if LOG:
    # the CPU tests' import hook (test/srt/mtp_cpu_shim/after_import.py)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                    "..", "..", "..", "test", "srt", "mtp_cpu_shim"))
    from after_import import after_import

    after_import("sglang.srt.speculative.frozen_kv_mtp_worker_v2", _probe_rounds)
