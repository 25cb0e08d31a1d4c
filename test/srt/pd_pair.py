"""A prefill/decode pair of servers of one model on this host, as the CPU PD tests start it.

mooncake's transfer engine is stood in (pd_stand_in/: real copies between the two
processes); the prefill server listens for its bootstrap on a port of its own, which a
restarted prefill server takes again. `generate` sends one request to both servers at
once, as a router does; `PDRouter` puts SGLang's own router (the `sglang-router` package,
PD mode) in front of a pair, as users reach one.
"""

import os
import subprocess
import sys
import threading
import time

import requests
from release import RELEASE
from server_process import ServerProcess, free_port

HERE = os.path.dirname(os.path.abspath(__file__))


class PDPair:
    def __init__(self, model_dir, workdir, server_args=(), prefill_args=(), decode_args=(), env=None):
        self.model_dir = model_dir
        self.boot = free_port()
        self.env = {"SGLANG_HOST_IP": "127.0.0.1", "SGLANG_TEST_PD_STAND_IN_DIR": str(workdir),
                    "PYTHONPATH": os.pathsep.join(filter(None, [os.path.join(HERE, "pd_stand_in"),
                                                                os.environ.get("PYTHONPATH")])),
                    **(env or {})}
        self.args = {
            "prefill": [*server_args, "--disaggregation-mode", "prefill", "--disaggregation-transfer-backend",
                        "mooncake", "--disaggregation-bootstrap-port", str(self.boot), *prefill_args],
            "decode": [*server_args, "--disaggregation-mode", "decode", "--disaggregation-transfer-backend",
                       "mooncake", *decode_args],
        }
        if RELEASE >= (0, 5, 23):  # its default retraction backup pins host memory via CUDA
            self.args["decode"] += ["--disaggregation-decode-retraction-backup", "cpu_tensor"]
        self.servers = {}
        for mode in self.args:
            self.servers[mode] = ServerProcess(model_dir, self.args[mode], name=f"pd-{mode}", env=self.env)

    @property
    def prefill(self) -> ServerProcess:
        return self.servers["prefill"]

    @property
    def decode(self) -> ServerProcess:
        return self.servers["decode"]

    def wait_ready(self) -> "PDPair":
        for s in self.servers.values():
            s.wait_ready()
        return self

    def restart(self, mode, env=None) -> ServerProcess:
        """A new server in place of `mode`'s (stopped first if it still runs), with `env`
        over the pair's environment."""
        self.servers[mode].stop()
        self.servers[mode] = ServerProcess(self.model_dir, self.args[mode], name=f"pd-{mode}",
                                           env={**self.env, **(env or {})})
        return self.servers[mode].wait_ready()

    def body(self, room, input_ids, max_new_tokens, sampling=None, **extra) -> dict:
        """A greedy /generate request through this pair under bootstrap room `room`."""
        return {"input_ids": list(input_ids), "bootstrap_host": "127.0.0.1", "bootstrap_port": self.boot,
                "bootstrap_room": room, **extra,
                "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, **(sampling or {})}}

    def generate(self, body, timeout=300.0, while_in_flight=None):
        """(the prefill server's response, the decode server's) to one request sent to both,
        each a requests.RequestException where none came (a server killed meanwhile).
        `while_in_flight` runs beside them."""
        out = {}

        def post(mode):
            try:
                out[mode] = self.servers[mode].post("/generate", body, timeout)
            except requests.RequestException as e:
                out[mode] = e

        threads = [threading.Thread(target=post, args=(mode,)) for mode in ("prefill", "decode")]
        for th in threads:
            th.start()
        if while_in_flight is not None:
            while_in_flight()
        for th in threads:
            th.join()
        return out["prefill"], out["decode"]

    def stop(self):
        for s in self.servers.values():
            s.stop()


def idle(server) -> dict:
    """A server's load once idle, or what it still holds: nothing running or queued, no KV
    token used (after a cache flush), empty disaggregation queues. `server`: its `.url`."""
    deadline = time.time() + 60
    while (r := requests.post(server.url + "/flush_cache", timeout=60)).status_code != 200:
        assert time.time() < deadline, r.text  # a flush waits for an idle scheduler
        time.sleep(0.5)
    r = requests.get(server.url + "/v1/loads", params={"include": "disagg"}, timeout=30)
    assert r.status_code == 200, r.text
    (load,) = r.json()["loads"]  # one data-parallel rank
    queues = load.get("disaggregation") or {}
    queues = {k: v for k, v in queues.items() if k.endswith("_queue_reqs") and v}
    return {k: v for k, v in load.items() if k in ("num_running_reqs", "num_waiting_reqs", "num_used_tokens") and v} | queues


class PDRouter:
    """`python -m sglang_router.launch_router --pd-disaggregation` in front of `pair`: it
    draws each request's bootstrap room and sends the request to both servers."""

    def __init__(self, pair: PDPair, log_path, python=sys.executable):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(
            [python, "-m", "sglang_router.launch_router", "--pd-disaggregation",
             "--prefill", pair.prefill.url, str(pair.boot), "--decode", pair.decode.url,
             "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=self.log, stderr=subprocess.STDOUT)

    def wait_ready(self, timeout=120.0) -> "PDRouter":
        """Until a request gets through: the router's /health answers before its worker
        checks have seen both servers (a request meanwhile gets a 503)."""
        probe = {"input_ids": [5, 6], "sampling_params": {"max_new_tokens": 1}}
        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc.poll() is None, "the router exited:\n" + self.log_tail()
            try:
                if requests.post(self.url + "/generate", json=probe, timeout=60).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise TimeoutError("no request got through the router:\n" + self.log_tail())

    def post(self, path, body, timeout=300.0):
        return requests.post(self.url + path, json=body, timeout=timeout)

    def log_tail(self, n=40) -> str:
        self.log.flush()
        with open(self.log.name, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()
