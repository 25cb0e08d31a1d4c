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


class _PatchOnImport:
    NAME = "sglang.srt.speculative.frozen_kv_mtp_worker_v2"

    def find_spec(self, fullname, path, target=None):
        if fullname != self.NAME:
            return None
        import importlib.util

        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        run = spec.loader.exec_module

        def exec_and_patch(module):
            run(module)
            _probe_rounds(module.FrozenKVMTPWorkerV2)

        spec.loader.exec_module = exec_and_patch
        return spec


def _probe_rounds(worker):
    import warnings

    import torch

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
    sys.meta_path.insert(0, _PatchOnImport())
