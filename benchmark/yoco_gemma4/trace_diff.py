"""Where does one pass spend more host time (or GPU time) in trace B than in trace A?

    python trace_diff.py OFF.trace.json.gz ON.trace.json.gz [--top 40] [--span step[] [--gpu]
        [--steps MARKER] [--launches]

Both traces are torch profiler Chrome traces of one forward pass (prefill_bench.py
--profile-point, or bench_one_batch --profile). Inside the last span whose name starts
with --span (the scheduler's `step[...]`; empty: the whole trace), the Python functions
and CPU ops are summed by name (total time, calls; addresses in names are dropped so
two processes compare), and the names are listed by how much longer B spent in them.
Inclusive times: a parent and its children both appear.
With --gpu, the GPU kernels of the whole trace are summed by name instead (kernels run
after the host span that launched them, so no span bounds them), and each trace's GPU
span, busy time and idle time (span minus busy) are printed first: idle time between
CUDA graphs is what a round's extra small launches cost when the GPU paces the loop.
With --steps MARKER (and --gpu), each trace is also cut into scheduler steps at each
launch of a kernel whose name contains MARKER (one a step, e.g. the sampler's
`ArgMaxOps`): per step its period, GPU busy time and largest idle gap, with the
kernels on either side of that gap (where the host was late).
With --launches (and --gpu), each `cudaGraphLaunch` of each trace: how long the host
call took, how far ahead of the GPU the host entered it (the GPU's work queued before the
graph ends that long after the call starts; negative: the host was behind) and how long
the GPU then waited for the graph's first kernel. A graph is late where the call takes
longer than the lead.
"""

import argparse
import bisect
import functools
import os
import re
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trace_summary import load_spans as _load_spans  # noqa: E402


@functools.lru_cache(maxsize=2)
def load_spans(path):
    """Each trace is parsed once, however many summaries read it (a second or so each);
    callers only read the events."""
    return _load_spans(path)


def host_time_by_name(path, span_prefix="step["):
    events = load_spans(path)
    t0, t1 = float("-inf"), float("inf")
    if span_prefix:
        spans = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith(span_prefix)]
        if spans:
            t0, t1 = spans[-1]["ts"], spans[-1]["ts"] + spans[-1]["dur"]
    by = defaultdict(lambda: [0.0, 0])
    for e in events:
        if e.get("cat") in ("python_function", "cpu_op") and t0 <= e["ts"] <= t1:
            name = re.sub(r" at 0x[0-9a-f]+", "", e["name"])[:120]
            by[name][0] += e["dur"] / 1000
            by[name][1] += 1
    return dict(by)


def gpu_time_by_name(path):
    """{kernel name: [ms, launches]} over the whole trace."""
    by = defaultdict(lambda: [0.0, 0])
    for e in load_spans(path):
        if e.get("cat") == "kernel":
            name = e["name"][:120]
            by[name][0] += e["dur"] / 1000
            by[name][1] += 1
    return dict(by)


def _gpu_events(path):
    """The trace's kernels, memcpys and memsets (what keeps the GPU busy), by start time."""
    return sorted((e for e in load_spans(path) if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                  key=lambda e: e["ts"])


def gpu_busy_idle(path):
    """(span_ms, busy_ms, idle_ms) of the GPU over the trace: first kernel, memcpy or
    memset start to last end; busy is the union of their intervals."""
    iv = [(e["ts"], e["ts"] + e["dur"]) for e in _gpu_events(path)]
    if not iv:
        return 0.0, 0.0, 0.0
    busy = _busy(iv)
    span = max(e for _, e in iv) - iv[0][0]
    return span / 1000, busy / 1000, (span - busy) / 1000


def _busy(iv):
    """Union length of sorted (start, end) intervals."""
    busy, (cur_s, cur_e) = 0.0, iv[0]
    for s, e in iv[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return busy + cur_e - cur_s


def step_gaps(path, marker):
    """[(period_us, busy_us, gap_us, kernel_before_gap, kernel_after_gap)], one per
    step between two consecutive `marker` kernels."""
    ev = _gpu_events(path)
    starts = [i for i, e in enumerate(ev) if marker in e["name"]]
    rows = []
    for i0, i1 in zip(starts, starts[1:]):
        # gaps through the next step's marker (a marker launched late is this step's gap)
        gap, j = max((ev[k + 1]["ts"] - ev[k]["ts"] - ev[k]["dur"], k) for k in range(i0, i1))
        rows.append((ev[i1]["ts"] - ev[i0]["ts"], _busy([(e["ts"], e["ts"] + e["dur"]) for e in ev[i0:i1]]),
                     gap, ev[j]["name"][:60], ev[j + 1]["name"][:60]))
    return rows


def graph_launches(path):
    """[(launch_us, lead_us, gpu_wait_us)], one per `cudaGraphLaunch` whose kernels are
    in the trace, in launch order: the host call's duration; the end of the GPU work
    started before the graph's first kernel, minus the call's start (how far ahead the
    host was); the idle time from that end to the graph's first kernel."""
    events = load_spans(path)
    ev = _gpu_events(path)
    starts = [e["ts"] for e in ev]
    ends_so_far, end = [], float("-inf")
    for e in ev:
        end = max(end, e["ts"] + e["dur"])
        ends_so_far.append(end)
    first = {}
    for e in ev:
        corr = e.get("args", {}).get("correlation")
        if corr is not None and corr not in first:
            first[corr] = e["ts"]
    rows = []
    for g in sorted((e for e in events if e.get("name") == "cudaGraphLaunch"), key=lambda e: e["ts"]):
        t = first.get(g.get("args", {}).get("correlation"))
        i = bisect.bisect_left(starts, t) if t is not None else 0
        if i == 0:  # no kernel of it, or nothing before it in the trace
            continue
        queued_end = ends_so_far[i - 1]
        rows.append((g["dur"], queued_end - g["ts"], max(0.0, t - queued_end)))
    return rows


def diff(a, b, top=40):
    """[(extra_ms, (a_ms, a_calls), (b_ms, b_calls), name)], most extra time in b first."""
    rows = []
    for name in set(a) | set(b):
        x, y = a.get(name, [0.0, 0]), b.get(name, [0.0, 0])
        rows.append((y[0] - x[0], tuple(x), tuple(y), name))
    rows.sort(key=lambda r: -r[0])
    return rows[:top]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--span", default="step[", help="prefix of the span to look inside; '' = whole trace")
    ap.add_argument("--gpu", action="store_true", help="GPU kernel time by name, whole trace")
    ap.add_argument("--steps", default=None, metavar="MARKER",
                    help="with --gpu: per-step period, busy time and largest gap, steps cut at kernels named *MARKER*")
    ap.add_argument("--launches", action="store_true",
                    help="with --gpu: each CUDA graph launch's host time, the host's lead and the GPU's wait")
    args = ap.parse_args()
    if args.gpu:
        for tag, path in (("A", args.a), ("B", args.b)):
            span, busy, idle = gpu_busy_idle(path)
            print(f"{tag} GPU span {span:.3f} ms, busy {busy:.3f} ms, idle {idle:.3f} ms")
            if args.steps:
                for period, sbusy, gap, before, after in step_gaps(path, args.steps):
                    print(f"{tag} step {period:8.1f} us, busy {sbusy:8.1f} us, largest gap {gap:7.1f} us "
                          f"between {before} | {after}")
            if args.launches:
                for launch, lead, wait in graph_launches(path):
                    print(f"{tag} graph launch {launch:7.1f} us, host ahead by {lead:8.1f} us, GPU waited {wait:7.1f} us")
        a, b = gpu_time_by_name(args.a), gpu_time_by_name(args.b)
        print(f"A {sum(v[0] for v in a.values()):.3f} ms in {sum(v[1] for v in a.values())} kernels, "
              f"B {sum(v[0] for v in b.values()):.3f} ms in {sum(v[1] for v in b.values())}")
    else:
        a, b = host_time_by_name(args.a, args.span), host_time_by_name(args.b, args.span)
    for extra, (am, ac), (bm, bc), name in diff(a, b, args.top):
        print(f"{extra:9.3f} ms  A {am:9.3f}/{ac:5d}  B {bm:9.3f}/{bc:5d}  {name}")


if __name__ == "__main__":
    main()
