"""Profile a few scheduler forwards of a running sglang.Engine and summarise the trace.

    summary = profile_engine(eng, out_dir, run_fn, num_steps=1)

`run_fn()` sends the requests to profile; `num_steps` counts scheduler forwards (the
profiler stops by itself). The summary says where the time goes on both sides:
GPU kernels (total, top by time), the host (CPU ops by total time, how many kernels
the host launched), the annotated spans and, for speculative decoding, each round's
phases (round_phases). For short prefills that are launch-bound,
the launch count and host time are the numbers to compare between two modes.
"""

import glob
import gzip
import json
import os
import time
from collections import defaultdict

# CUDA runtime/driver calls that launch one kernel each.
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernelEx")


def _wait_for_trace(out_dir, timeout_s=120):
    """The scheduler writes the trace asynchronously after the last profiled step."""
    for _ in range(timeout_s):
        files = glob.glob(os.path.join(out_dir, "**", "*.trace.json*"), recursive=True)
        if files:
            time.sleep(3)  # let the writer finish
            return max(files, key=os.path.getmtime)
        time.sleep(1)
    return None


def load_spans(path):
    """The complete ("X") events of a torch profiler Chrome trace (.json or .json.gz)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


def summarize(path, top=25):
    events = load_spans(path)
    buckets = {"kernel": defaultdict(lambda: [0.0, 0]), "cpu_op": defaultdict(lambda: [0.0, 0]),
               "span": defaultdict(lambda: [0.0, 0]), "runtime": defaultdict(lambda: [0.0, 0])}
    launches = 0
    for e in events:
        cat, name, dur = e.get("cat", ""), e.get("name", "")[:110], e.get("dur", 0.0)
        if cat == "kernel":
            key = "kernel"
        elif cat == "cpu_op":
            key = "cpu_op"
        elif cat in ("user_annotation", "gpu_user_annotation"):
            key = "span"
        elif cat in ("cuda_runtime", "cuda_driver"):
            # Launch counts, and time the host spent in runtime calls (a sync or
            # a blocking copy shows up here as a long call).
            launches += name.startswith(LAUNCH_CALLS)
            key = "runtime"
        else:
            continue
        buckets[key][name][0] += dur
        buckets[key][name][1] += 1

    def ranked(b):
        return [[n, round(us / 1000, 3), c] for n, (us, c) in sorted(b.items(), key=lambda kv: -kv[1][0])[:top]]

    return {
        "trace": path,
        "kernel_ms": round(sum(v[0] for v in buckets["kernel"].values()) / 1000, 3),
        "kernels": sum(v[1] for v in buckets["kernel"].values()),
        "launches": launches,
        "cpu_ops": sum(v[1] for v in buckets["cpu_op"].values()),
        "top_kernels": ranked(buckets["kernel"]),
        "top_cpu_ops": ranked(buckets["cpu_op"]),
        "spans": ranked(buckets["span"]),
        "top_runtime_calls": ranked(buckets["runtime"]),
        "round_phases": round_phases(path),
    }


def _busy(kernels, lo, hi):
    """Kernel time inside [lo, hi) (kernels of one stream do not overlap)."""
    return sum(max(0.0, min(hi, k0 + d) - max(lo, k0)) for k0, d in kernels)


def round_phases(path):
    """Speculative decode rounds, phase by phase, from the spans the workers open
    (spec_stage_span: `draft`, `draft_extend`; the verify is what lies between them).
    A round runs from one `draft` span's start to the next's. For each phase, on the GPU
    (`gpu_user_annotation` spans, kernels): its window and the kernel time inside it (the
    rest of the window the GPU waited for the host); on the host (`user_annotation` spans):
    the time inside the span. Medians over the rounds, in ms, or None without two rounds."""
    events = load_spans(path)
    kernels = sorted((e.get("ts", 0.0), e.get("dur", 0.0)) for e in events if e.get("cat") == "kernel")

    def spans(cat, name):
        return sorted((e["ts"], e["ts"] + e.get("dur", 0.0)) for e in events
                      if e.get("cat") == cat and e.get("name") == name)

    def med(xs):
        xs = sorted(xs)
        return round(xs[len(xs) // 2] / 1000, 3) if xs else None

    out = {}
    for side, cat in (("gpu", "gpu_user_annotation"), ("host", "user_annotation")):
        drafts, extends = spans(cat, "draft"), spans(cat, "draft_extend")
        rows = []
        for (d0, d1), (n0, _) in zip(drafts, drafts[1:]):
            ext = next(((e0, e1) for e0, e1 in extends if d1 <= e0 < n0), None)
            if ext is None:
                continue
            windows = {"draft": (d0, d1), "verify": (d1, ext[0]), "draft_extend": ext,
                       "after": (ext[1], n0), "round": (d0, n0)}
            row = {k: w[1] - w[0] for k, w in windows.items()}
            if side == "gpu":
                row.update({f"{k}_kernels": _busy(kernels, *w) for k, w in windows.items()})
            rows.append(row)
        if rows:
            out[side] = {k: med(r[k] for r in rows) for k in rows[0]}
            out[side]["rounds"] = len(rows)
    return out or None


def profile_engine(eng, out_dir, run_fn, num_steps=1, activities=("CPU", "GPU"), top=25):
    """Profile the next `num_steps` scheduler forwards, driven by `run_fn()`."""
    os.makedirs(out_dir, exist_ok=True)
    eng.start_profile(output_dir=out_dir, num_steps=num_steps, activities=list(activities), record_shapes=False)
    run_fn()
    path = _wait_for_trace(out_dir, timeout_s=30)
    if path is None:
        # run_fn ended before num_steps forwards: stop the profiler by hand.
        eng.stop_profile()
        path = _wait_for_trace(out_dir)
    return summarize(path, top) if path else {"trace": None}


def print_summary(tag, s, top=15):
    if not s.get("trace"):
        print(f"PROFILE {tag}: no trace written", flush=True)
        return
    print(f"PROFILE {tag}: kernels {s['kernels']} ({s['kernel_ms']} ms on the GPU), "
          f"launches {s['launches']}, CPU ops {s['cpu_ops']}, trace {s['trace']}", flush=True)
    for side, row in (s.get("round_phases") or {}).items():
        print(f"  rounds ({side}, median ms): " + ", ".join(f"{k} {v}" for k, v in row.items()), flush=True)
    for title, rows in (("kernel", s["top_kernels"]), ("cpu op", s["top_cpu_ops"]), ("span", s["spans"]),
                        ("cuda", s.get("top_runtime_calls", []))):
        for name, ms, n in rows[:top]:
            print(f"  {title:6s} {ms:9.3f} ms n={n:6d} {name}", flush=True)
