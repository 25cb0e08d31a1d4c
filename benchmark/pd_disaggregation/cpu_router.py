"""A PD pair on CPU reached through SGLang's own router in PD mode.

    python benchmark/pd_disaggregation/cpu_router.py ROUTER_PYTHON [WORKDIR]

ROUTER_PYTHON: an interpreter with the `sglang-router` package (its own venv:
`python3 -m venv R && R/bin/pip install sglang-router`). Starts a prefill and a decode
server (tiny Gemma-4, CPU, mooncake's engine stood in by test/srt/pd_stand_in/, as the CPU
PD tests start them) and `python -m sglang_router.launch_router --pd-disaggregation` in
front of them; sends /generate and /v1/completions through the router, and the same
prompts through the pair directly (the client naming the bootstrap fields), and prints
whether each output matches, the router's version and its status codes. The router
counts as up once a one-token request gets through (test/srt/pd_pair.PDRouter: its /health
answers before its worker checks have seen both servers).
"""
import os
import subprocess
import sys
import threading
import time

TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "test", "srt")
sys.path.insert(0, TESTS)
import requests  # noqa: E402
from pd_pair import PDPair, PDRouter  # noqa: E402
from tiny_gemma import make_tiny_gemma4  # noqa: E402


def main():
    router_python = sys.argv[1]
    args = [a for a in sys.argv[2:] if not a.startswith("--")]
    tmp = os.path.abspath(args[0] if args else "build/pd_router")
    os.makedirs(tmp, exist_ok=True)
    version = subprocess.run([router_python, "-c", "import importlib.metadata as m; print(m.version('sglang-router'))"],
                             capture_output=True, text=True).stdout.strip()
    print("sglang-router", version, flush=True)
    pair = PDPair(make_tiny_gemma4(os.path.join(tmp, "model")), tmp)
    P, D = pair.prefill, pair.decode
    router = None
    try:
        pair.wait_ready()
        router = PDRouter(pair, os.path.join(tmp, "router.log"), python=router_python)
        url = router.url
        t = time.time()
        router.wait_ready()
        print(f"a request through the router after {time.time() - t:.1f} s", flush=True)
        prompts = [[5, 6, 7, 8, 9, 10], list(range(20, 60)), [300, 301]]
        for i, prompt in enumerate(prompts):
            params = {"max_new_tokens": 6, "temperature": 0.0}
            _, d = pair.generate(pair.body(1000 + i, prompt, 6), timeout=120)
            direct = d.json().get("output_ids") if d.status_code == 200 else d.text[:200]
            t = time.time()
            r = requests.post(url + "/generate", json={"input_ids": prompt, "sampling_params": params}, timeout=120)
            via = r.json().get("output_ids") if r.status_code == 200 else r.text[:300]
            print(f"/generate prompt {i}: router {r.status_code} in {time.time() - t:.1f} s, "
                  f"equal to the direct pair: {via == direct}", via, direct, flush=True)
        for prompt in (prompts[0], "a b c"):  # token ids (as OpenAI allows), then text
            r = requests.post(url + "/v1/completions", json={"model": "x", "prompt": prompt, "max_tokens": 6,
                                                             "temperature": 0}, timeout=120)
            print(f"/v1/completions prompt {prompt!r}:", r.status_code, r.text[:300], flush=True)
        # three at once through the router (each gets a room of the router's drawing)
        outs = [None] * 3

        def go(k):
            outs[k] = requests.post(url + "/generate", json={"input_ids": prompts[k], "sampling_params": {
                "max_new_tokens": 6, "temperature": 0.0}}, timeout=120).status_code
        ths = [threading.Thread(target=go, args=(k,)) for k in range(3)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        print("three at once", outs, "servers alive", P.alive(), D.alive(), flush=True)
    finally:
        if router is not None:
            router.stop()
        pair.stop()


if __name__ == "__main__":
    main()
