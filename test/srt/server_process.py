"""`python -m sglang.launch_server` of the tiny Gemma-4 on CPU, as a client sees it.

Loopback only. The server runs in its own session (process group), so stop()
ends exactly the processes it started: the HTTP server and its scheduler and
detokenizer children.
"""

import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

import requests

SERVER_ARGS = [
    "--device", "cpu",
    "--attention-backend", "torch_native",
    "--dtype", "float32",
    "--skip-tokenizer-init",
    "--disable-cuda-graph",
    "--max-total-tokens", "8192",
    "--max-running-requests", "64",
    "--mem-fraction-static", "0.5",
    "--random-seed", "0",
    "--log-level", "warning",
    # An idle scheduler polls without pause otherwise: a whole core each.
    "--sleep-on-idle",
]


_handed_out: set = set()


def free_port() -> int:
    """A free port below the kernel's ephemeral range, never the same twice in a process.
    A server binds its ports only once its model has loaded; until then a port from the
    ephemeral range can go to any connection on the machine (another test's requests):
    the bind failed with EADDRINUSE in CI. The engine's own pick of its rendezvous port
    has the same race on 0.5.17 (0.5.23 picks it below the range:
    `utils/network.py:get_free_port_below_ephemeral`). Each test process (pytest-xdist
    worker, the per-step check's runs) draws from its own block of 100 ports first, so
    two processes that start servers at once do not pick the same port before either
    binds it (seen: the soak's rendezvous port taken, EADDRINUSE)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    top = min(ephemeral, 32768)
    blocks = (top - 20000) // 100
    own = 20000 + (os.getpid() * 7919 % blocks) * 100
    candidates = [p for p in range(own, own + 100) if p not in _handed_out]
    random.shuffle(candidates)
    rest = [p for p in random.sample(range(20000, top), 64) if p not in _handed_out]
    for port in candidates + rest:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")


class ServerProcess:
    def __init__(self, model_path: str, extra_args=(), name: str = "server", env=None):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(
            prefix=f"sglang-{name}-", suffix=".log", delete=False
        )
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="",
                   SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN="1", **(env or {}))
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model_path,
               "--host", "127.0.0.1", "--port", str(self.port),
               "--nccl-port", str(free_port()), *SERVER_ARGS, *extra_args]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env, start_new_session=True)

    def wait_ready(self, timeout: float = 600.0) -> "ServerProcess":
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited at start-up:\n{self.log_tail()}")
            if self.alive():
                return self
            time.sleep(1.0)
        raise RuntimeError(f"the server did not start in {timeout:.0f} s:\n{self.log_tail()}")

    def alive(self) -> bool:
        try:
            return requests.get(self.url + "/health", timeout=30).status_code == 200
        except requests.RequestException:
            return False

    def log_tail(self, n: int = 60) -> str:
        with open(self.log.name, errors="replace") as f:
            return "".join(f.readlines()[-n:])

    def post(self, path: str, body, timeout: float = 300.0):
        return requests.post(self.url + path, json=body, timeout=timeout)

    def loads(self, timeout: float = 30.0, include=None) -> list:
        """/v1/loads: one entry per data-parallel rank (num_running_reqs, ...), with the
        sections `include` names (e.g. "disagg")."""
        r = requests.get(self.url + "/v1/loads", params={"include": include} if include else None,
                         timeout=timeout)
        assert r.status_code == 200, r.text
        body = r.json()
        loads = body.get("loads", body) if isinstance(body, dict) else body
        return loads if isinstance(loads, list) else [loads]

    def stop(self):
        # SIGTERM first (the server's own shutdown), but not its wait: a scheduler ended
        # by it makes the server sleep 5 s before exiting, which only costs test time.
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=1)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                pass
        try:  # what is left of it, and children left behind by a crashed server
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.log.close()
