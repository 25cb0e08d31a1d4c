"""Faults of a PD pair on CPU: what each server answers, and whether both keep serving.

    python benchmark/pd_disaggregation/cpu_faults.py [WORKDIR]

A prefill and a decode server (tiny Gemma-4, CPU) with mooncake's engine stood in
(test/srt/pd_stand_in/: real copies between the two processes), as the CPU PD tests
start them. In turn: a normal request through the pair; a request to the decode server
naming a bootstrap port nobody listens on; two different prompts sent through the pair
at once under one bootstrap room (each compared with its output sent alone); a prefill
request whose decode request never comes (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, here
20 s, bounds its wait). After each: /health of both and a normal request. Prints one
line per probe (status, first 300 characters of the body, seconds).
"""
import os, sys, threading, time
TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "test", "srt")
sys.path.insert(0, TESTS)
from server_process import ServerProcess, free_port
from tiny_gemma import make_tiny_gemma4
import requests

tmp = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else "build/pd_faults"); os.makedirs(tmp, exist_ok=True)
model = make_tiny_gemma4(os.path.join(tmp, "model"))
boot = free_port()
env = {"SGLANG_HOST_IP": "127.0.0.1", "SGLANG_TEST_PD_STAND_IN_DIR": tmp,
       "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "20", "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "20",
       "PYTHONPATH": os.pathsep.join(filter(None, [os.path.join(TESTS, "pd_stand_in"), os.environ.get("PYTHONPATH")]))}
P = ServerProcess(model, ["--disaggregation-mode", "prefill", "--disaggregation-transfer-backend", "mooncake",
                          "--disaggregation-bootstrap-port", str(boot)], name="pd-prefill", env=env)
D = ServerProcess(model, ["--disaggregation-mode", "decode", "--disaggregation-transfer-backend", "mooncake"], name="pd-decode", env=env)
t0 = time.time()
P.wait_ready(); D.wait_ready()
print("ready", time.time() - t0, flush=True)

def pair(room, prompt=(5, 6, 7, 8, 9, 10), host="127.0.0.1", port=None, new=4, to=60):
    body = {"input_ids": list(prompt), "bootstrap_host": host, "bootstrap_port": port or boot, "bootstrap_room": room,
            "sampling_params": {"max_new_tokens": new, "temperature": 0.0}}
    out = {}
    th = threading.Thread(target=lambda: out.update(p=_post(P, body, to)))
    th.start(); d = _post(D, body, to); th.join()
    return out["p"], d

def _post(s, body, to):
    t = time.time()
    try:
        r = requests.post(s.url + "/generate", json=body, timeout=to)
        return (r.status_code, r.text[:300], round(time.time() - t, 1))
    except Exception as e:
        return ("EXC", repr(e)[:200], round(time.time() - t, 1))

def info(s):
    try:
        j = requests.get(s.url + "/get_server_info", timeout=10).json()["internal_states"][0]
        return {k: j.get(k) for k in ("num_running_reqs", "num_waiting_reqs", "token_usage", "memory_usage") if k in j} or list(j)[:30]
    except Exception as e:
        return repr(e)[:100]

print("normal", pair(1), flush=True)
# 1. a decode request naming an unreachable bootstrap port (nobody listens)
bad = free_port()
print("decode unreachable port", _post(D, {"input_ids": [5, 6, 7], "bootstrap_host": "127.0.0.1", "bootstrap_port": bad,
      "bootstrap_room": 99, "sampling_params": {"max_new_tokens": 2}}, 120), flush=True)
print("alive", P.alive(), D.alive(), "normal after", pair(2), flush=True)
print("info P", info(P), "D", info(D), flush=True)
# 2. one room for two different prompts in flight at once
p1, p2 = tuple(range(5, 200)), tuple(range(300, 480))
alone = {k: pair(100 + i, prompt=p, new=16)[1] for i, (k, p) in enumerate((("a", p1), ("b", p2)))}
res = {}
def go(k, p):
    res[k] = pair(7, prompt=p, new=16)
a = threading.Thread(target=go, args=("a", p1)); b = threading.Thread(target=go, args=("b", p2))
a.start(); b.start(); a.join(); b.join()
print("room reuse: (prefill, decode) status, decode output as alone",
      {k: (res[k][0][0], res[k][1][0], res[k][1][1].split(',"meta_info"')[0] == alone[k][1].split(',"meta_info"')[0])
       for k in res}, {k: (res[k][0][1][:160], res[k][1][1][:160]) for k in res}, flush=True)
print("alive", P.alive(), D.alive(), "normal after", pair(3), flush=True)
# 2b. the room reused while its first request decodes (its prefill done)
res = {}
a = threading.Thread(target=go, args=("a", p1)); a.start(); time.sleep(1.0)
res["b"] = pair(7, prompt=p2, new=16, to=60); a.join()
print("room reused mid-decode: (prefill, decode) status, decode output as alone",
      {k: (res[k][0][0], res[k][1][0], res[k][1][1].split(',"meta_info"')[0] == alone[k][1].split(',"meta_info"')[0])
       for k in res}, {k: (res[k][0][1][:160], res[k][1][1][:160], res[k][0][2], res[k][1][2]) for k in res}, flush=True)
print("alive", P.alive(), D.alive(), "normal after", pair(5), flush=True)
# 3. a prefill request whose decode request never comes
print("prefill alone", _post(P, {"input_ids": [5, 6, 7], "bootstrap_host": "127.0.0.1", "bootstrap_port": boot,
      "bootstrap_room": 55, "sampling_params": {"max_new_tokens": 2}}, 120), flush=True)
print("alive", P.alive(), D.alive(), "normal after", pair(4), flush=True)
print("info P", info(P), "D", info(D), flush=True)
P.stop(); D.stop()
print("logs", P.log.name, D.log.name)
