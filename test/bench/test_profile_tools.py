"""The profiling tools the benchmarks use, on CPU: trace_summary.py on a small trace,
forward_bench.py on the tiny model, serve_mtp.py's GC log, verify_kernel_bench.py under
Triton's interpreter."""

import os
import sys


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "yoco_gemma4"))


def test_trace_summary_counts_kernels_launches_and_host_ops(tmp_path):
    """The profile summary the benchmarks print (trace_summary.py) on a small
    Chrome trace as the torch profiler writes it."""
    import gzip
    import json

    from trace_summary import summarize

    ev = [
        {"ph": "X", "cat": "kernel", "name": "gemm", "dur": 300.0},
        {"ph": "X", "cat": "kernel", "name": "gemm", "dur": 100.0},
        {"ph": "X", "cat": "kernel", "name": "attn", "dur": 600.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "dur": 5.0},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernelEx", "dur": 5.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "dur": 9.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 40.0},
        {"ph": "X", "cat": "user_annotation", "name": "forward", "dur": 2000.0},
        {"ph": "i", "cat": "kernel", "name": "instant, not a span", "dur": 1e9},
    ]
    path = tmp_path / "x.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)
    s = summarize(str(path))
    assert (s["kernels"], s["kernel_ms"], s["launches"], s["cpu_ops"]) == (3, 1.0, 2, 1)
    assert s["top_kernels"] == [["attn", 0.6, 1], ["gemm", 0.4, 2]]
    assert s["spans"] == [["forward", 2.0, 1]]
    assert s["top_runtime_calls"][0] == ["cudaMemcpyAsync", 0.009, 1]


def test_round_phases_split_each_speculative_round(tmp_path):
    """trace_summary.round_phases on three rounds (draft, verify, draft_extend, then the host
    before the next draft), spans on both sides: each phase's window, the kernel time inside
    it on the GPU (the rest the GPU waited), medians; a round without its draft_extend, and
    the last draft (no next round), are not counted."""
    import json

    from trace_summary import round_phases, summarize

    ev = []
    for r, t in enumerate((0.0, 1000.0, 2200.0, 3100.0)):  # rounds 0-2; the 4th draft ends them
        span = lambda cat, name, t0, t1: ev.append({"ph": "X", "cat": cat, "name": name, "ts": t0, "dur": t1 - t0})
        span("gpu_user_annotation", "draft", t, t + 200)
        ev.append({"ph": "X", "cat": "kernel", "name": "d", "ts": t + 50, "dur": 100.0})
        ev.append({"ph": "X", "cat": "kernel", "name": "v", "ts": t + 300, "dur": 400.0})  # verify
        span("user_annotation", "draft", t - 100, t + 150)
        if r < 3:
            span("gpu_user_annotation", "draft_extend", t + 800, t + 900)
            ev.append({"ph": "X", "cat": "kernel", "name": "e", "ts": t + 800, "dur": 100.0})
            span("user_annotation", "draft_extend", t + 600, t + 650)
    path = tmp_path / "r.trace.json"
    path.write_text(json.dumps({"traceEvents": ev}))
    p = round_phases(str(path))
    assert p["gpu"]["rounds"] == 3 and p["host"]["rounds"] == 3
    assert (p["gpu"]["draft"], p["gpu"]["draft_kernels"]) == (0.2, 0.1)
    assert (p["gpu"]["verify"], p["gpu"]["verify_kernels"]) == (0.6, 0.4)  # 0.2 ms waiting
    assert (p["gpu"]["draft_extend"], p["gpu"]["draft_extend_kernels"]) == (0.1, 0.1)
    assert p["gpu"]["round"] == 1.0  # rounds of 1.0, 1.2, 0.9 ms
    assert p["gpu"]["after"] == 0.1 and p["gpu"]["round_kernels"] == 0.6
    assert (p["host"]["draft"], p["host"]["verify"], p["host"]["draft_extend"]) == (0.25, 0.45, 0.05)
    assert summarize(str(path))["round_phases"] == p
    path.write_text(json.dumps({"traceEvents": [e for e in ev if e["name"] != "draft_extend"]}))
    assert round_phases(str(path)) is None


def test_forward_bench_times_one_pass_with_the_fast_path_on(tmp_path):
    """forward_bench.py (one prefill pass in process, sglang.bench_one_batch) on the
    tiny model on CPU: a row per point with every mode, each mode's passes pooled over
    the rounds, and the on-all runs take the fast path (the tiny vocabulary is widened:
    bench_one_batch draws ids below 10000)."""
    import json
    import subprocess

    out = tmp_path / "fb.json"
    extra = (
        "--device cpu --attention-backend torch_native --dtype float32 "
        "--mem-fraction-static 0.05 --max-total-tokens 8192 --log-level debug "
        '--json-model-override-args {"vocab_size":16384,"vocab_size_per_layer_input":16384}'
    )
    env = dict(os.environ, YOCO_CKPT_DIR=str(tmp_path / "ckpt"), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmark", "yoco_gemma4", "forward_bench.py"),
         str(out), "--variant", "tiny", "--modes", "off,on-all", "--batches", "1,4",
         "--lens", "64", "--repeats", "1", "--rounds", "2", "--extra", extra],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert [(r["len"], r["batch"]) for r in res["table"]] == [(64, 1), (64, 4)]
    assert all(r["off_ms"] > 0 and r["on-all_ms"] > 0  for r in res["table"])
    assert all(len(ts) == 2 for m in res["raw_s"].values() for ts in m.values())  # 1 x 2 rounds
    log = proc.stdout + proc.stderr
    assert log.count("KV-sharing fast prefill: back half on 4 of 256 tokens") >= 2  # on-all, both rounds


def test_gc_log_site_logs_collections_and_serve_mtp_sums_a_window(tmp_path):
    """jit_log_site with BENCH_GC_LOG (serve_mtp.py --gc-log): a process started with it
    on PYTHONPATH logs its generation-1/2 collections one a line and its short
    generation-0 ones in blocks of 200; gc_summary counts them inside a time window."""
    import subprocess
    import time

    sys.path.insert(0, os.path.join(ROOT, "benchmark", "frozen_kv_mtp"))
    from serve_mtp import gc_summary

    log = tmp_path / "gc.log"
    site = os.path.join(ROOT, "benchmark", "frozen_kv_mtp", "jit_log_site")
    script = (
        "import gc, time\n"
        "gc.disable()\n"  # explicit collections only
        "for _ in range(3): gc.collect(1)\n"
        "gc.collect(2)\n"
        "for _ in range(400): gc.collect(0)\n"
        "time.sleep(1.1)\n"
        "gc.collect(1)\n"  # past a second: this one flushes what the 20-line rule held
    )
    t0 = time.time()
    env = dict(os.environ, BENCH_GC_LOG=str(log), PYTHONPATH=site)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = log.read_text().splitlines()
    full = [line.split() for line in lines if line.startswith("gc ")]
    blocks = [line.split() for line in lines if line.startswith("gc0 ")]
    assert [int(f[4]) for f in full if int(f[4]) > 0] == [1, 1, 1, 2, 1]
    assert all(int(f[2]) == int(blocks[0][2]) for f in full + blocks)  # one pid
    # gc.collect(0) x 400 -> blocks of up to 200 (any of them over 50 us is logged alone
    # instead; the last collection's flush writes the partial block), none lost
    n0 = sum(int(b[4]) for b in blocks) + sum(1 for f in full if f[4] == "0")
    assert len(blocks) >= 1 and n0 == 400
    s = gc_summary(str(log), t0, time.time() + 1)
    (summary,) = s.values()
    assert summary["count"] == [400, 4, 1]
    assert summary["max_us"] > 0 and all(p >= 0 for p in summary["pause_ms"])
    assert gc_summary(str(log), t0 - 100, t0 - 50) == {}


def test_verify_kernel_bench_variants_agree_on_cpu(tmp_path):
    """verify_kernel_bench.py (FROZEN_KV_MTP verify attention: extend kernel vs split-KV
    variants) on its tiny shape under Triton's interpreter: one row per point, and the
    split-KV, decode-row and grouped (keys read once a request) variants compute the
    extend kernel's attention, and so do the grouped kernel's launch alternatives
    (one query head a program; 16 splits)."""
    import json
    import subprocess

    out = tmp_path / "vk.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmark", "frozen_kv_mtp", "verify_kernel_bench.py"),
         str(out), "--shape", "tiny", "--batches", "2", "--contexts", "5,20", "--dtype", "float32",
         "--grouped-alt", "h1,s16"],
        env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert [(r["batch"], r["context"]) for r in rows] == [(2, 5), (2, 20)]
    diffs = [v for r in rows for k, v in r.items() if k.endswith("_maxdiff")]
    assert len(diffs) == 20 and max(diffs) < 1e-5
    assert all(f"{kind}_{v}_maxdiff" in r for r in rows for kind in ("sliding", "full")
               for v in ("grouped", "grouped_h1", "grouped_s16"))
