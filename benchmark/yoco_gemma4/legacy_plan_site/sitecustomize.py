"""Bench-only start-up hook (forward_bench.py's mode on-all-legacy puts this directory first
on PYTHONPATH; plain runs never load it).

BENCH_YOCO_LEGACY_PLAN=1: the fast-prefill plan does its host work as before patch 0029 and
the graphs' lazy staging, so one call can time both against the current plan:
- the requests' full lengths are read from the device tensor (a sync behind the queued
  embedding), not from the scheduler's host copy;
- the back-half batch is built in the plan, before layer 0 is launched, also when the
  captured back half runs it (which now stages its rows itself at back-half time).
Outputs are unchanged either way (the same rows, the same geometry). The captured back half
still gathers its rows itself here, so legacy launches four small gathers more than the old
code did (a few microseconds of GPU time, after layer 0).
"""

import os
import sys

if os.environ.get("BENCH_YOCO_LEGACY_PLAN") == "1":
    # Bound by name when gemma4_causal imports it, which is after this runs.
    from sglang.srt.layers import kv_sharing_fast_prefill as _yoco

    _finishing_requests = _yoco._finishing_requests
    _plan_fast_prefill = _yoco.plan_fast_prefill
    _announced = []

    def _finishing_requests_from_device(forward_batch, seq_cpu):
        host = forward_batch.orig_seq_lens_cpu
        forward_batch.orig_seq_lens_cpu = None
        try:
            return _finishing_requests(forward_batch, seq_cpu)
        finally:
            forward_batch.orig_seq_lens_cpu = host

    def _plan_with_batch_first(forward_batch, *args, **kwargs):
        plan = _plan_fast_prefill(forward_batch, *args, **kwargs)
        if plan is not None and plan.graphs is not None:
            plan.batch = _yoco.make_back_half_batch(forward_batch, plan)
        if plan is not None and not _announced:
            _announced.append(1)
            print("BENCH_YOCO_LEGACY_PLAN: device lengths, back-half batch before layer 0",
                  file=sys.stderr, flush=True)
        return plan

    _yoco._finishing_requests = _finishing_requests_from_device
    _yoco.plan_fast_prefill = _plan_with_batch_first
