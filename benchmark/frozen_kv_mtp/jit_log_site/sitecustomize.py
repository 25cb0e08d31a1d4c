"""Bench-only start-up hooks for a server process (serve_mtp.py puts this directory first on
PYTHONPATH; plain runs never load it).

- BENCH_TRITON_JIT_LOG=PATH: append one line per Triton compile (or disk-cache load) to PATH,
  "start|end EPOCH PID KERNEL SIGNATURE", so a benchmark can say which kernels were built
  while it measured.
- BENCH_GC_LOG=PATH: append one line per Python garbage collection of generation 1 or 2, or
  of any generation that took 50 us or more, "gc EPOCH PID TITLE GEN PAUSE_US COLLECTED", and
  one "gc0 EPOCH PID TITLE COUNT PAUSE_US" line per 200 shorter generation-0 collections
  (buffered: written every 20 lines or after a second, at a collection's end, a partial
  block of generation-0 collections with them), so a
  benchmark can line up the host's GC pauses with the GPU's idle gaps. (Stock's
  SGLANG_LOG_GC=1 logs every collection's start and end at info level on the scheduler
  thread, which is itself host time in the loop being measured.)
- BENCH_SKIP_SPEC_KERNEL_WARMUP=1: the server skips the start-up compile of the spec decode
  kernels (speculative/spec_decode_kernel_warmup.py), as stock does, for an A/B in
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

_gc_path = os.environ.get("BENCH_GC_LOG")
if _gc_path:
    import gc

    _gc = {"t": 0.0, "lines": [], "n0": 0, "us0": 0.0, "flushed": time.time()}

    def _title():
        try:
            import setproctitle

            return setproctitle.getproctitle().split()[0]
        except Exception:
            return "?"

    def _gc_hook(phase, info):
        if phase == "start":
            _gc["t"] = time.perf_counter()
            return
        us = (time.perf_counter() - _gc["t"]) * 1e6
        gen = info["generation"]
        if gen == 0 and us < 50:
            _gc["n0"] += 1
            _gc["us0"] += us
            if _gc["n0"] == 200:
                _gc["lines"].append(f"gc0 {time.time():.6f} {os.getpid()} {_title()} 200 {_gc['us0']:.0f}\n")
                _gc["n0"], _gc["us0"] = 0, 0.0
        else:
            _gc["lines"].append(
                f"gc {time.time():.6f} {os.getpid()} {_title()} {gen} {us:.0f} {info['collected']}\n"
            )
        now = time.time()
        if (_gc["lines"] or _gc["n0"]) and (len(_gc["lines"]) >= 20 or now - _gc["flushed"] > 1.0):
            if _gc["n0"]:  # a partial block goes out with the rest, so no collection is lost
                _gc["lines"].append(
                    f"gc0 {time.time():.6f} {os.getpid()} {_title()} {_gc['n0']} {_gc['us0']:.0f}\n"
                )
                _gc["n0"], _gc["us0"] = 0, 0.0
            with open(_gc_path, "a") as f:
                f.writelines(_gc["lines"])
            _gc["lines"].clear()
            _gc["flushed"] = now

    gc.callbacks.append(_gc_hook)

if os.environ.get("BENCH_SKIP_SPEC_KERNEL_WARMUP") == "1":
    # Bound by name when eagle_worker_v2 imports it, which is after this runs.
    from sglang.srt.speculative import spec_decode_kernel_warmup

    spec_decode_kernel_warmup.warm_spec_decode_kernels = lambda worker: None
