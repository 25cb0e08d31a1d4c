#!/usr/bin/env python3
"""`make demo`: serve a tiny seeded Gemma-4 with the fork on CPU and query it.

Writes the checkpoint to build/demo-model, starts
`python -m sglang.launch_server` on it, sends a few /generate requests
(batched, with a shared prefix served from the radix cache) with YOCO fast
prefill on, and prints what came back. Extra arguments go to the server.
"""

import json
import os
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "test", "srt"))
from tiny_gemma4 import make_tiny_gemma4  # noqa: E402

PORT = int(os.environ.get("DEMO_PORT", "30123"))
URL = f"http://127.0.0.1:{PORT}"


def post(path, payload):
    req = urllib.request.Request(
        URL + path, json.dumps(payload).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def main():
    model = make_tiny_gemma4(os.path.join(ROOT, "build", "demo-model"), seed=0)
    cmd = [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", model, "--device", "cpu", "--attention-backend", "torch_native",
        "--dtype", "float32", "--skip-tokenizer-init", "--max-total-tokens", "8192",
        "--port", str(PORT), "--log-level", "warning", "--kv-sharing-fast-prefill",
    ] + sys.argv[1:]
    print("$", " ".join(cmd), flush=True)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    server = subprocess.Popen(cmd, env=env)
    try:
        for _ in range(300):
            if server.poll() is not None:
                sys.exit(f"error: the server exited with code {server.returncode}")
            try:
                urllib.request.urlopen(URL + "/health", timeout=2)
                break
            except Exception:
                time.sleep(1)
        else:
            sys.exit("error: the server did not become healthy in 300 s")
        shared = list(range(10, 50))
        prompts = [shared + [7, 8, 9], shared + [100, 101], list(range(200, 230))]
        # Warm the radix cache with the shared prefix, then send a batch.
        post("/generate", {"input_ids": shared, "sampling_params": {"max_new_tokens": 1}})
        outs = post(
            "/generate",
            {
                "input_ids": prompts,
                "sampling_params": {"max_new_tokens": 12, "temperature": 0.0},
            },
        )
        for p, o in zip(prompts, outs):
            mi = o["meta_info"]
            print(
                f"prompt {len(p):3d} tokens (cached {mi['cached_tokens']:2d}) "
                f"-> {o['output_ids']}"
            )
        print("server model:", json.loads(urllib.request.urlopen(URL + "/model_info").read())["model_path"])
        print("YOCO fast prefill (--kv-sharing-fast-prefill) was on for these prefills.")
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
