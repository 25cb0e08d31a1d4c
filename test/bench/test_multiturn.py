"""benchmark/frozen_kv_mtp/multiturn.py (the multi-turn users of `serve_mtp.py --workloads
mturn`) against a stand-in server that streams /generate as SGLang does: each user's
history grows by its turns and the replies, the stream's ids are read whether the server
sends them cumulative or incremental, and the timings are the stream's."""

import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmark", "frozen_kv_mtp"))
import multiturn  # noqa: E402


def stand_in(cumulative):
    """A /generate that streams new_tokens ids, each reply [len(prompt), len(prompt)+1, ...]."""
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            ids, n = body["input_ids"], body["sampling_params"]["max_new_tokens"]
            assert body["stream"] and body["sampling_params"]["ignore_eos"]
            seen.append(list(ids))
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            reply = [len(ids) + i for i in range(n)]
            for k in range(1, n + 1):
                out = reply[:k] if cumulative else reply[k - 1:k]
                # a speculative server: 2 tokens per verify round after the first token
                event = {"output_ids": out, "meta_info": {"completion_tokens": k, "spec_verify_ct": k // 2}}
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


@pytest.mark.parametrize("cumulative", [True, False])
def test_each_user_resends_its_growing_history(cumulative, tmp_path):
    server, seen = stand_in(cumulative)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        code = multiturn.main([str(tmp_path / "out.json"), "--url", url, "--users", "3", "--rounds", "3",
                               "--context", "50,60", "--turn-tokens", "4", "--new-tokens", "5", "--vocab", "500"])
    finally:
        server.shutdown()
    assert code == 0
    out = json.loads((tmp_path / "out.json").read_text())
    assert len(out["requests"]) == 9 and out["errors"] == []
    start = multiturn.histories(3, (50, 60), 500, 0)
    by_user = {u: [p for p in seen if p[: len(start[u])] == start[u]] for u in range(3)}
    for u in range(3):
        prompts = sorted(by_user[u], key=len)
        assert [len(p) for p in prompts] == [len(start[u]) + 4 + k * 9 for k in range(3)]
        for prev, nxt in zip(prompts, prompts[1:]):
            # the next request: the previous one, its reply, a new turn of 4 ids
            assert nxt[: len(prev)] == prev
            assert nxt[len(prev): len(prev) + 5] == [len(prev) + i for i in range(5)]
    for r in out["requests"]:
        assert r["new_tokens"] == 5 and r["ttft_s"] >= 0 and r["decode_tok_s"] > 0
    s = out["summary"]
    assert s["requests"] == 9 and s["decode_tok_s_per_request_median"] > 0
    assert s["prompt_len_max"] == max(len(p) for p in seen)
    assert s["accept_len"] == 2.5  # 5 tokens over the last event's 2 verify rounds


def test_a_failing_user_is_reported(tmp_path):
    code = multiturn.main([str(tmp_path / "out.json"), "--url", "http://127.0.0.1:9", "--users", "2",
                           "--rounds", "1", "--context", "5,5"])
    out = json.loads((tmp_path / "out.json").read_text())
    assert code == 1 and len(out["errors"]) == 2 and out["requests"] == []
