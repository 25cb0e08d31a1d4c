"""Bench-only start-up hooks for a server process (serve_mtp.py puts this directory first on
PYTHONPATH; plain runs never load it).

- BENCH_TRITON_JIT_LOG=PATH: append one line per Triton compile (or disk-cache load) to PATH,
  "start|end EPOCH PID KERNEL SIGNATURE", so a benchmark can say which kernels were built
  while it measured.
- BENCH_SKIP_SPEC_KERNEL_WARMUP=1: the server skips the start-up compile of the spec decode
  kernels (speculative/spec_decode_kernel_warmup.py), as before patch 0027, for an A/B in
  one session.
"""

import os
import time

_log_path = os.environ.get("BENCH_TRITON_JIT_LOG")
if _log_path:
    from triton import knobs

    def _hook(event):
        def hook(**kw):
            with open(_log_path, "a") as f:
                f.write(f"{event} {time.time():.3f} {os.getpid()} {kw['fn'].name} {kw['repr']}\n")
            return None  # anything else would skip the compile

        return hook

    knobs.runtime.jit_cache_hook = _hook("start")
    knobs.runtime.jit_post_compile_hook = _hook("end")

if os.environ.get("BENCH_SKIP_SPEC_KERNEL_WARMUP") == "1":
    # Bound by name when eagle_worker_v2 imports it, which is after this runs.
    from sglang.srt.speculative import spec_decode_kernel_warmup

    spec_decode_kernel_warmup.warm_spec_decode_kernels = lambda worker: None
