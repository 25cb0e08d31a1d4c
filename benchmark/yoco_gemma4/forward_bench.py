"""Latency of one prefill forward pass, YOCO off vs on vs the ceiling, without a server.

    python forward_bench.py OUT.json [--variant e2b] [--modes off,on-all,ceiling]
        [--batches 1,8] [--lens 64,256,512,1024,2048] [--repeats 5] [--graphs] [--rounds 1]

Short prompts are bound by the host, and prefill_bench.py times them through
Engine.generate, whose inter-process round trip (tokenizer manager -> scheduler ->
detokenizer) adds jitter of the same size as the pass itself. This script times the
pass alone with SGLang's own `python -m sglang.bench_one_batch` (model runner in
process, synchronize before and after `extend`), one process per mode, each
(batch, length) --repeats times; median reported.

modes: off; off-stock-kernel (off, with stock's triton extend kernels: sliding-window
loops from key 0, as before step 02/0023); on (default --kv-sharing-fast-prefill-min-tokens); on-all (min tokens 0:
the fast path on every pass); ceiling (on-all without its back half, the same model:
checkpoints.ceiling_kwargs). --rounds R runs the mode list R times, one process
per mode each time, and pools each mode's passes (processes alternate, so a slow spell
of the host falls on every mode).
CUDA graphs are off (`--disable-cuda-graph`), so the fast path's back half runs eager;
--graphs keeps them but the prefill graph (`--disable-prefill-cuda-graph`, as in
prefill_bench.py and the multimodal server), so that the back half replays its graphs as
in a server.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoints import CEILING_HOOKS, ceiling_env  # noqa: E402
from make_checkpoint import make_checkpoint  # noqa: E402

MODE_FLAGS = {
    "off": [],
    "on": ["--kv-sharing-fast-prefill"],
    "on-all": ["--kv-sharing-fast-prefill", "--kv-sharing-fast-prefill-min-tokens", "0"],
    # on-all without its back half (yoco_ceiling.py, on the PYTHONPATH of mode_env)
    "ceiling": ["--kv-sharing-fast-prefill", "--kv-sharing-fast-prefill-min-tokens", "0",
                "--forward-hooks", json.dumps(CEILING_HOOKS)],
    # off with stock's triton extend kernels (stock_extend_kernel/sitecustomize.py)
    "off-stock-kernel": [],
}
STOCK_KERNEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stock_extend_kernel")


def mode_env(mode):
    env = dict(os.environ, SGLANG_DUMMY_WEIGHTS_AT_SCALE="1")
    if mode == "off-stock-kernel":
        env["PYTHONPATH"] = os.pathsep.join([STOCK_KERNEL] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return ceiling_env(env) if mode == "ceiling" else env


def run_mode(mode, ckpt, batches, lens, repeats, out_dir, extra, tag, graphs=False):
    result = os.path.join(out_dir, f"one_batch_{tag}_{mode}.jsonl")
    if os.path.exists(result):
        os.remove(result)
    cmd = [sys.executable, "-m", "sglang.bench_one_batch", "--model-path", ckpt,
           "--load-format", "dummy", "--dtype", "bfloat16", "--attention-backend", "triton",
           "--disable-prefill-cuda-graph" if graphs else "--disable-cuda-graph",
           "--output-len", "1", "--result-filename", result,
           "--batch-size", *map(str, batches), "--input-len", *[str(L) for L in lens for _ in range(repeats)]]
    cmd += MODE_FLAGS[mode] + extra
    print("RUN", " ".join(cmd), flush=True)
    subprocess.run(cmd, env=mode_env(mode), check=True)
    times = {}
    with open(result) as f:
        for line in f:
            r = json.loads(line)
            times.setdefault((r["batch_size"], r["input_len"]), []).append(r["prefill_latency"])
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--variant", default="e2b")
    ap.add_argument("--modes", default="off,on-all,ceiling")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--lens", default="64,256,512,1024,2048")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--extra", default="", help="more bench_one_batch/server arguments, space-separated")
    ap.add_argument("--graphs", action="store_true", help="keep CUDA graphs (the back half's among them)")
    ap.add_argument("--rounds", type=int, default=1, help="run the mode list this many times, pooled")
    a = ap.parse_args()
    batches = [int(x) for x in a.batches.split(",")]
    lens = [int(x) for x in a.lens.split(",")]
    root = os.environ.get("YOCO_CKPT_DIR", "/tmp/yoco_ckpt")
    out_dir = os.path.dirname(os.path.abspath(a.out))
    raw = {}
    for _ in range(a.rounds):
        for mode in a.modes.split(","):
            ckpt = make_checkpoint(f"{root}/tok-{a.variant}", a.variant)
            times = run_mode(mode, ckpt, batches, lens, a.repeats, out_dir, a.extra.split(), a.variant, a.graphs)
            for point, ts in times.items():
                raw.setdefault(mode, {}).setdefault(point, []).extend(ts)
            write(a, batches, lens, raw)  # after every mode, so a time limit keeps what ran
    write(a, batches, lens, raw, final=True)


def write(a, batches, lens, raw, final=False):
    table = []
    for n in batches:
        for L in lens:
            row = {"len": L, "batch": n}
            for mode, times in raw.items():
                ts = times.get((n, L))
                if ts:
                    row[f"{mode}_ms"] = round(1000 * statistics.median(ts), 2)
            off = row.get("off_ms")
            for mode in raw:
                if mode != "off" and off and row.get(f"{mode}_ms"):
                    row[f"speedup_{mode}"] = round(off / row[f"{mode}_ms"], 3)
            if final:
                print("ROW", json.dumps(row), flush=True)
            table.append(row)
    with open(a.out, "w") as f:
        json.dump({"variant": a.variant, "repeats": a.repeats, "rounds": a.rounds, "table": table,
                   "raw_s": {m: {f"{k[1]}x{k[0]}": v for k, v in t.items()} for m, t in raw.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
