"""A PD pair on the GPU (real mooncake over TCP) that loses either server under load.

    python benchmark/pd_disaggregation/gpu_faults.py OUT_DIR [--variant e4b] [--load 16]
        [--kill-after 2.0] [--no-yoco]

The CPU test (test/srt/test_pd_faults.py) holds one transfer in flight with the copying
stand-in; real mooncake cannot be held, so here load does it: --load requests of 8,000
tokens (16 new each) go through the pair at once, and --kill-after seconds later, with
prefills, transfers and decodes in flight, one server is SIGKILLed:
  decode lost   every request answers (the prefill server's side within a bound), the
                prefill server is alive and idle (no KV token used after a cache flush,
                empty disaggregation queues); a decode server started again serves a
                request through the pair with the output it gave before the fault;
  prefill lost  the decode server answers every waiting request (an error, or 200 for
                those already decoding) within a bound, is alive and idle; a prefill
                server started again on its bootstrap port serves as before.
The prefill server runs YOCO (--no-yoco: off). Servers as gpu_pair.py starts them
(seeded weights at scale, triton, deterministic inference), with
SGLANG_DISAGGREGATION_WAITING_TIMEOUT and ..._BOOTSTRAP_TIMEOUT at 120 s: an answer well
inside them is the lost peer noticed. Writes OUT_DIR/gpu_faults_<variant>.json (per
fault: each request's status, seconds from the kill, the error's first 300 characters;
the survivor's idle state; the restarted pair's output) and a `ROW {json}` line per fault.
"""

import argparse
import json
import os
import random
import signal
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gpu_pair import PD, Server, both  # noqa: E402 (it puts the YOCO bench and test/srt on the path)
from make_checkpoint import make_checkpoint  # noqa: E402
from pd_pair import idle  # noqa: E402

TIMEOUT_S = 120
NEW = 16


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--variant", default="e4b")
    ap.add_argument("--load", type=int, default=16, help="requests in flight when a server is killed")
    ap.add_argument("--input-len", type=int, default=8000)
    ap.add_argument("--kill-after", type=float, default=2.0, help="seconds after the load is sent")
    ap.add_argument("--mem", type=float, default=0.4)
    ap.add_argument("--port", type=int, default=34000)
    ap.add_argument("--no-yoco", action="store_true")
    ap.add_argument("--no-deterministic", action="store_true", help="(a CPU dry run: torch_native has none)")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    os.environ.update(SGLANG_DISAGGREGATION_WAITING_TIMEOUT=str(TIMEOUT_S),
                      SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=str(TIMEOUT_S))
    model = make_checkpoint(f"{a.out}/ckpt-{a.variant}", a.variant)
    cfg = json.load(open(f"{model}/config.json"))
    vocab = cfg.get("vocab_size") or cfg["text_config"]["vocab_size"]
    det = not a.no_deterministic
    boot = a.port + 10
    start = {
        "prefill": lambda n: Server(a.out, f"faults_prefill{n}", model, a.port, not a.no_yoco, a.mem,
                                    ["--disaggregation-mode", "prefill", *PD, "--disaggregation-bootstrap-port", str(boot)], det),
        "decode": lambda n: Server(a.out, f"faults_decode{n}", model, a.port + 1, False, min(0.9, 2 * a.mem),
                                   ["--disaggregation-mode", "decode", *PD], det),
    }
    servers, rooms = {}, iter(range(1, 10**6))
    probe = {"input_ids": [5, 6, 7, 8, 9, 10] * 50, "sampling_params": {"temperature": 0.0, "max_new_tokens": NEW}}

    def send(body):
        """One request to both servers at once: {mode: (status, the output ids or the
        error)}; status None where no answer came (a server killed meanwhile)."""
        answers = both(servers["prefill"], servers["decode"], body, next(rooms), boot)
        return {mode: (r[0], r[1]["output_ids"] if r[0] == 200 else str(r[1])[:300])
                for mode, r in zip(("prefill", "decode"), answers)}

    def served():
        status, out = send(probe)["decode"]
        return out if status == 200 else f"{status} {out}"

    result = {"variant": a.variant, "yoco": not a.no_yoco, "load": a.load, "input_len": a.input_len,
              "kill_after_s": a.kill_after, "faults": {}}
    path = f"{a.out}/gpu_faults_{a.variant}.json"
    try:
        for mode in ("prefill", "decode"):  # the decode server second: the fraction is of what is left
            servers[mode] = start[mode](0)
            servers[mode].wait()
        want = served()
        result["before"] = {"output": want, "idle": {m: idle(s) for m, s in servers.items()}}
        rng = random.Random(0)
        for n, lost in enumerate(("decode", "prefill"), start=1):
            survivor = "prefill" if lost == "decode" else "decode"
            bodies = [{"input_ids": [rng.randrange(10, vocab) for _ in range(a.input_len)],
                       "sampling_params": {"temperature": 0.0, "max_new_tokens": NEW, "ignore_eos": True}}
                      for _ in range(a.load)]
            answers, lock = [], threading.Lock()
            killed = {}

            def one(body):
                status, out = send(body)[survivor]
                with lock:
                    answers.append({"status": status, "after_kill_s": round(time.time() - killed["at"], 2)
                                    if "at" in killed else None,
                                    "error": None if status == 200 else out})

            ths = [threading.Thread(target=one, args=(b,), daemon=True) for b in bodies]
            [t.start() for t in ths]
            time.sleep(a.kill_after)
            os.killpg(servers[lost].proc.pid, signal.SIGKILL)
            killed["at"] = time.time()
            for t in ths:
                t.join(timeout=max(1.0, killed["at"] + TIMEOUT_S + 60 - time.time()))
            rec = {"lost": lost, "answered": len(answers), "hung": sum(t.is_alive() for t in ths),
                   "statuses": sorted({str(x["status"]) for x in answers}),
                   "slowest_after_kill_s": max((x["after_kill_s"] or 0) for x in answers) if answers else None,
                   "answers": answers,
                   "survivor_alive": servers[survivor].proc.poll() is None,
                   "survivor_idle": idle(servers[survivor])}
            servers[lost] = start[lost](n)
            servers[lost].wait()
            rec["after_restart"] = served()
            rec["served_as_before"] = rec["after_restart"] == want
            rec["idle_after"] = {m: idle(s) for m, s in servers.items()}
            result["faults"][lost] = rec
            print("ROW " + json.dumps({k: v for k, v in rec.items() if k != "answers"}), flush=True)
            json.dump(result, open(path, "w"), indent=1)
    finally:
        for s in servers.values():
            s.stop()
        json.dump(result, open(path, "w"), indent=1)
    print("wrote", path, flush=True)


if __name__ == "__main__":
    main()
