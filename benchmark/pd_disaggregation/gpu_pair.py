"""A PD pair (prefill + decode server on one GPU, mooncake over TCP) against one server.

    python benchmark/pd_disaggregation/gpu_pair.py OUT_DIR --variant e4b
        [--modes single,pd-off,pd-on] [--parity 12] [--ttft 8,32] [--mem 0.4] [--router]

Each mode starts its servers, one after the other on the same GPU, with the YOCO
benchmark's engine settings (benchmark/yoco_gemma4/run.py: seeded weights at scale,
triton) plus --enable-deterministic-inference and --mem-fraction-static MEM (the decode
server, started second, 2 x MEM: the fraction is of the memory free when a server starts):
  single      one server (no PD, YOCO off): the reference outputs
  pd-off      prefill server + decode server, YOCO off on the prefill server
  pd-on       the same with --kv-sharing-fast-prefill on the prefill server
  single-mtp  one server with FROZEN_KV_MTP (the variant's seeded assistant, 3 steps)
  pd-mtp      a pair with FROZEN_KV_MTP on both servers and YOCO on the prefill server
Without --router each request goes to both servers at once with the bootstrap fields a
router adds (host, port, room); with it, through SGLang's router in PD mode
(test/srt/pd_pair.PDRouter; the `sglang-router` package), which draws the rooms. Parity:
--parity prompts of 16-6000 tokens, one at a time, 16 greedy tokens each, with logprobs; a
PD mode's outputs are compared with `single`'s (pd-mtp's with `single-mtp`'s). Timing
(every mode but `single`): summ 8000/1000 at each --ttft concurrency (2 x N prompts, random
ids, seed 0, a fresh seed per pass so no prompt hits the radix cache), streamed from the
decode server: time to its first chunk, each request's decode speed (tokens after the
first over the time after the first) and, with speculation, its tokens per verify round;
the radix cache is flushed before each pass. Writes OUT_DIR/gpu_pair_<variant>[_nondet]
[_router].json and a `ROW {json}` line per (mode, measurement). Time with
--no-deterministic (and --parity 0): deterministic inference runs the prefill server's
back half eager, which is not how YOCO is served.

The mooncake wheel (mooncake-transfer-engine, its CUDA build) and the libraries it
loads (libibverbs, libmlx5, libnuma, libcudart.so.12) must be importable: set
PYTHONPATH and LD_LIBRARY_PATH (gpu_run.sh carries them unpacked).
"""

import argparse
import importlib.metadata
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import requests

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "yoco_gemma4"))
sys.path.insert(0, os.path.join(HERE, "..", "..", "test", "srt"))
from checkpoints import text_config, write_assistant_checkpoint  # noqa: E402
from make_checkpoint import make_checkpoint  # noqa: E402
from pd_pair import PDRouter  # noqa: E402
from run import _server_cmd, _wait_healthy  # noqa: E402

NEW_TOKENS = 16
# mode: (YOCO on at the prefill server, FROZEN_KV_MTP on every server, the mode whose
# outputs a PD mode's must equal; None: one server, no PD)
MODES = {
    "single": (False, False, None),
    "pd-off": (False, False, "single"),
    "pd-on": (True, False, "single"),
    "single-mtp": (False, True, None),
    "pd-mtp": (True, True, "single-mtp"),
}
PD = ["--disaggregation-transfer-backend", "mooncake_tcp"]


class Server:
    def __init__(self, out, name, model, port, yoco, mem, extra=(), deterministic=True, draft=None):
        self.name, self.port, self.url = name, port, f"http://127.0.0.1:{port}"
        self.cmd = _server_cmd(model, port, yoco, 1, draft, mem_fraction_static=mem,
                               enable_deterministic_inference=deterministic, log_level="info") + list(extra)
        self.logpath = f"{out}/{name}.log"
        env = dict(os.environ, SGLANG_DUMMY_WEIGHTS_AT_SCALE="1", SGLANG_HOST_IP="127.0.0.1")
        self.t0 = time.time()
        self.proc = subprocess.Popen(self.cmd, stdout=open(self.logpath, "w"), stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)

    def wait(self):
        _wait_healthy(self.port, self.proc)
        self.startup_s = round(time.time() - self.t0, 1)
        print(f"{self.name} ready in {self.startup_s} s", flush=True)
        return self

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(60)
        except ProcessLookupError:  # exited already (e.g. failed to start)
            pass
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        time.sleep(3)


def parity_prompts(n, vocab):
    rng = random.Random(0)
    lens = [16, 100, 512, 1000, 2000, 3000, 4096, 6000]
    ps = [[rng.randrange(10, vocab) for _ in range(lens[i % len(lens)])] for i in range(n)]
    if ps:
        ps[-1] = list(ps[0])  # a repeat: a prefix-cache hit on both sides
    return ps


def generate(url, body, stream=False):
    """(status, the JSON or the error text, seconds, seconds to the first chunk); status None
    where no answer came (the server was killed meanwhile: gpu_faults.py)."""
    t = time.time()
    try:
        if not stream:
            r = requests.post(url + "/generate", json=body, timeout=600)
            return r.status_code, (r.json() if r.status_code == 200 else r.text), time.time() - t, None
        first, last = None, None
        with requests.post(url + "/generate", json={**body, "stream": True}, timeout=600, stream=True) as r:
            for line in r.iter_lines():
                if line.startswith(b"data:") and line != b"data: [DONE]":
                    first = first or time.time() - t
                    last = json.loads(line[5:])
            return r.status_code, last, time.time() - t, first
    except requests.RequestException as e:
        return None, repr(e), time.time() - t, None


def both(pre, dec, body, room, boot, stream=False):
    """Send one request to the pair: the prefill server in a thread, the decode server here."""
    body = {**body, "bootstrap_host": "127.0.0.1", "bootstrap_port": boot, "bootstrap_room": room}
    res = {}
    th = threading.Thread(target=lambda: res.update(p=generate(pre.url, body)))
    th.start()
    res["d"] = generate(dec.url, body, stream)
    th.join()
    return res["p"], res["d"]


def outputs(resp):
    code, j = resp[0], resp[1]
    if code != 200:
        return {"status": code, "error": str(j)[:800]}
    lp = j["meta_info"]["output_token_logprobs"]
    return {"status": 200, "ids": j["output_ids"], "logprobs": [x[0] for x in lp],
            "cached": j["meta_info"].get("cached_tokens")}


def prefill_passes(server):
    """The prefill server's YOCO pass counts so far (which path each pass took, and why)."""
    info = requests.get(server.url + "/get_server_info", timeout=30).json()
    return info["internal_states"][0].get("kv_sharing_fast_prefill_passes")


def timed(row, d):
    """One streamed request's figures: TTFT, end to end, and (decode speed) its tokens after
    the first over the time after the first; with speculation, tokens per verify round."""
    last = d[1] if isinstance(d[1], dict) else {}  # the last streamed chunk: the whole output
    meta, n = last.get("meta_info") or {}, len(last.get("output_ids") or [])
    rec = {"status": d[0], "ttft_s": d[3], "e2e_s": d[2], "tokens": n}
    if d[0] == 200 and d[3] and n > 1 and d[2] > d[3]:
        rec["decode_tok_s"] = round((n - 1) / (d[2] - d[3]), 2)
    if meta.get("spec_verify_ct"):
        rec["accept_len"] = round(meta.get("completion_tokens", n) / meta["spec_verify_ct"], 3)
    row.append(rec)


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    return xs[len(xs) // 2] if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--variant", default="e4b")
    ap.add_argument("--modes", default="single,pd-off,pd-on", help="of " + ",".join(MODES))
    ap.add_argument("--parity", type=int, default=12)
    ap.add_argument("--ttft", default="8,32", help="concurrencies of summ 8000/1000 ('' for none)")
    ap.add_argument("--mem", type=float, default=0.4)
    ap.add_argument("--ttft-len", type=int, default=8000, help="input tokens of the TTFT workload")
    ap.add_argument("--ttft-out", type=int, default=1000, help="output tokens of the TTFT workload")
    ap.add_argument("--port", type=int, default=33000)
    ap.add_argument("--router", action="store_true",
                    help="a PD mode's requests go through SGLang's router in PD mode (sglang-router importable; "
                         "it draws the rooms) instead of to both servers with the bootstrap fields")
    ap.add_argument("--no-deterministic", action="store_true",
                    help="servers as users run them, for TTFT: deterministic inference keeps the back half "
                         "eager and the kernels' fixed tiles (written to gpu_pair_<variant>_nondet.json); "
                         "also a CPU dry run's (torch_native has none)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    model = make_checkpoint(f"{a.out}/ckpt-{a.variant}", a.variant)
    cfg = json.load(open(f"{model}/config.json"))
    vocab = cfg.get("vocab_size") or cfg["text_config"]["vocab_size"]
    prompts = parity_prompts(a.parity, vocab)
    det = not a.no_deterministic
    path = f"{a.out}/gpu_pair_{a.variant}{'' if det else '_nondet'}{'_router' if a.router else ''}.json"
    result = json.load(open(path)) if os.path.exists(path) else {"variant": a.variant, "modes": {}}
    sp = {"temperature": 0.0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
    for mode in a.modes.split(","):
        yoco, mtp, ref_mode = MODES[mode]
        draft = None
        if mtp:
            draft = write_assistant_checkpoint(f"{a.out}/ckpt-{a.variant}-assistant",
                                               None if a.variant == "e4b" else text_config(a.variant))
        boot = a.port + 10
        rec = {"date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "via": "router" if a.router else "direct"}
        if ref_mode is None:
            starts = [lambda: Server(a.out, f"{a.variant}_{mode}", model, a.port, False, a.mem,
                                     deterministic=det, draft=draft)]
        else:
            starts = [lambda: Server(a.out, f"{a.variant}_{mode}_prefill", model, a.port, yoco, a.mem,
                                     ["--disaggregation-mode", "prefill", *PD, "--disaggregation-bootstrap-port", str(boot)],
                                     det, draft),
                      # Started once the prefill server is up: the static fraction is of the
                      # memory still free then (started together, either may take the other's).
                      lambda: Server(a.out, f"{a.variant}_{mode}_decode", model, a.port + 1, False, min(0.9, 2 * a.mem),
                                     ["--disaggregation-mode", "decode", *PD], det, draft)]
        servers, router = [], None
        try:
            for start in starts:
                servers.append(start())
                servers[-1].wait()
            rec["cmds"] = [s.cmd for s in servers]
            rec["startup_s"] = [s.startup_s for s in servers]
            if ref_mode is not None and a.router:
                pair = SimpleNamespace(prefill=servers[0], decode=servers[1], boot=boot)
                router = PDRouter(pair, f"{a.out}/{a.variant}_{mode}_router.log").wait_ready()
                rec["router"] = importlib.metadata.version("sglang-router")

            def send(body, room, stream=False):
                """The decode side's (or the one server's) response; with the prefill
                server's first token where the client sent to both."""
                if ref_mode is None:
                    return None, generate(servers[0].url, body, stream)
                if router is not None:
                    return None, generate(router.url, body, stream)
                return both(*servers, body, room, boot, stream)

            runs = []
            for i, p in enumerate(prompts):
                pr, dr = send({"input_ids": p, "sampling_params": sp, "return_logprob": True}, 100 + i)
                runs.append({**outputs(dr), **({"prefill_first": outputs(pr).get("ids")} if pr else {})})
            rec["parity"] = runs
            if ref_mode is not None and ref_mode in result["modes"]:
                ref = result["modes"][ref_mode]["parity"]
                eq = [r.get("ids") == w.get("ids") for r, w in zip(runs, ref)]
                diffs = [max(abs(x - y) for x, y in zip(r["logprobs"], w["logprobs"]))
                         for r, w in zip(runs, ref) if r.get("status") == 200 and w.get("status") == 200]
                rec["parity_against"] = ref_mode
                rec["parity_equal"] = [sum(eq), len(eq)]
                rec["parity_max_abs_logprob_diff"] = max(diffs) if diffs else None
                print(f"ROW {json.dumps({'mode': mode, 'against': ref_mode, 'parity_equal': rec['parity_equal'], 'max_diff': rec['parity_max_abs_logprob_diff']})}", flush=True)
            if mode == "single":  # the parity reference only
                continue
            if ref_mode is not None:
                rec["prefill_passes"] = prefill_passes(servers[0])
            ttft = []
            for conc in [int(c) for c in a.ttft.split(",") if c]:
                rng = random.Random(1000 + conc)
                body_of = lambda: {"input_ids": [rng.randrange(10, vocab) for _ in range(a.ttft_len)],
                                   "sampling_params": {"temperature": 0.0, "max_new_tokens": a.ttft_out, "ignore_eos": True}}
                for warm in (True, False):
                    requests.post(servers[0].url + "/flush_cache", timeout=60)
                    n = min(conc, 8) if warm else 2 * conc
                    bodies = [body_of() for _ in range(n)]
                    got, lock, sem = [], threading.Lock(), threading.Semaphore(conc)

                    def one(k):
                        with sem:
                            _, d = send(bodies[k], 10000 * conc + (0 if warm else 5000) + k, stream=True)
                            with lock:
                                timed(got, d)

                    t0 = time.time()
                    ths = [threading.Thread(target=one, args=(k,)) for k in range(n)]
                    [t.start() for t in ths]
                    [t.join() for t in ths]
                    if warm:
                        continue
                    ok = sorted(g["ttft_s"] for g in got if g["status"] == 200 and g["ttft_s"])
                    row = {"mode": mode, "workload": "summ", "input_len": a.ttft_len, "output_len": a.ttft_out,
                           "concurrency": conc, "num_prompts": n, "completed": len(ok), "wall_s": round(time.time() - t0, 2),
                           "median_ttft_ms": round(1000 * ok[len(ok) // 2], 1) if ok else None,
                           "p99_ttft_ms": round(1000 * ok[min(len(ok) - 1, int(0.99 * len(ok)))], 1) if ok else None,
                           "mean_ttft_ms": round(1000 * sum(ok) / len(ok), 1) if ok else None,
                           "median_decode_tok_s": median(g.get("decode_tok_s") for g in got),
                           "median_accept_len": median(g.get("accept_len") for g in got),
                           "ttfts_ms": [round(1000 * t, 1) for t in ok], "requests": got}
                    ttft.append(row)
                    print("ROW " + json.dumps({k: v for k, v in row.items() if k not in ("ttfts_ms", "requests")}), flush=True)
            rec["ttft"] = ttft
            if ref_mode is not None:
                rec["prefill_passes_after_ttft"] = prefill_passes(servers[0])
            rec["alive_after"] = [s.proc.poll() is None for s in servers]
        finally:
            if router is not None:
                router.stop()
            for s in servers[::-1]:
                s.stop()
            result["modes"][mode] = rec
            json.dump(result, open(path, "w"), indent=1)
    print("wrote", path, flush=True)


if __name__ == "__main__":
    main()
