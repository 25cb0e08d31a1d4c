#!/usr/bin/env python3
"""The first-use stall of the compiled repetition penalty, on a CPU server (tiny Gemma-4).

    python benchmark/penalty_stall.py OUT.json [--repeats 3]

Per repeat: starts `make demo`'s server (scripts/demo.py: tiny Gemma-4, CPU) and times its
start-up (process start to /health answering); then, while a thread sends a plain greedy
request every 50 ms and records each one's latency, sends the first request that asks for
`repetition_penalty` (batch 1, then a batch of 2) and records how long it took and the
slowest plain request meanwhile. Stock compiles the penalty there (torch.compile), inside
the scheduler, so every other request waits; warmed at start-up, nothing compiles then.
Writes OUT.json with every repeat's numbers and prints their medians.
"""
import argparse
import json
import os
import statistics
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import demo  # noqa: E402


def one(model: str, port: int) -> dict:
    url = f"http://127.0.0.1:{port}"
    cmd = demo.server_command(model, port)
    t0 = time.monotonic()
    server = demo.Server(cmd, echo=lambda line: None)
    try:
        server.wait_healthy(url)
        startup = time.monotonic() - t0
        plain = {"input_ids": [11, 12, 13, 14], "sampling_params": {"max_new_tokens": 2,
                                                                   "temperature": 0}}
        demo.post(url + "/generate", plain)  # the plain path is warm
        stop, lat = threading.Event(), []

        def poll():
            while not stop.is_set():
                t = time.monotonic()
                demo.post(url + "/generate", plain)
                lat.append(time.monotonic() - t)
                time.sleep(0.05)

        th = threading.Thread(target=poll, daemon=True)
        th.start()
        time.sleep(0.5)
        before = len(lat)
        pen = {"sampling_params": {"max_new_tokens": 4, "temperature": 0,
                                   "repetition_penalty": 1.1}}
        t = time.monotonic()
        demo.post(url + "/generate", {**pen, "input_ids": [11, 12, 13, 14]})
        first_b1 = time.monotonic() - t
        t = time.monotonic()
        demo.post(url + "/generate", {**pen, "input_ids": [[11, 12], [13, 14]]})
        first_b2 = time.monotonic() - t
        time.sleep(0.5)
        stop.set()
        th.join()
        during = lat[before:] or [0.0]
        return {"startup_s": startup, "first_penalty_b1_s": first_b1,
                "first_penalty_b2_s": first_b2, "slowest_plain_during_s": max(during),
                "median_plain_during_s": statistics.median(during),
                "median_plain_before_s": statistics.median(lat[:before] or [0.0])}
    finally:
        server.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--port", type=int, default=30177)
    a = ap.parse_args()
    model = demo.build_model(os.path.join(ROOT, "build", "demo-model"))
    runs = [one(model, a.port) for _ in range(a.repeats)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    with open(a.out, "w") as f:
        json.dump({"runs": runs, "median": med, "omp_num_threads":
                   os.environ.get("OMP_NUM_THREADS")}, f, indent=1)
    for k, v in med.items():
        print(f"{k}: {v:.3f}")


if __name__ == "__main__":
    main()
