"""Multi-turn chat users against one server: per-request decode speed and TTFT.

    python benchmark/frozen_kv_mtp/multiturn.py OUT.json --url http://127.0.0.1:30000
        [--users 8] [--rounds 4] [--context 2400,3100] [--turn-tokens 40] [--new-tokens 160]

The reporting user's workload: each of --users users holds a chat whose history starts at
a random length in --context (token ids, seeded) and grows each round by a new user turn
(--turn-tokens ids) and the model's reply, as a chat client resends it; so every request
after a user's first hits the radix cache on that user's history. All users run at once,
one request in flight each, --rounds rounds. Each request is streamed (`/generate` with
`input_ids`, `max_new_tokens` --new-tokens, `ignore_eos`) and timed on the client: TTFT
(sent to first token) and decode speed, tokens after the first over the time from the
first token to the last (what a reader of the stream sees). Writes OUT.json ({"args",
"requests": [{user, round, prompt_len, new_tokens, ttft_s, decode_tok_s}], "summary"})
and a RESULT line. `serve_mtp.py --workloads mturn` runs it against each mode's server.
"""

import argparse
import json
import random
import statistics
import sys
import threading
import time
import urllib.request


def histories(users, context, vocab, seed):
    """Each user's starting history: token ids, a length drawn in context=(lo, hi)."""
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(*context))] for _ in range(users)]


def turn(vocab, n, seed):
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(n)]


def stream_generate(url, input_ids, new_tokens, timeout=600):
    """(reply ids, send time, first and last token times, verify rounds or None) of one
    streamed /generate (the rounds: speculative decoding's `spec_verify_ct`)."""
    body = {"input_ids": input_ids, "stream": True,
            "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True}}
    req = urllib.request.Request(url + "/generate", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    sent, first, last, ids, verify_ct = time.perf_counter(), None, None, [], None
    with urllib.request.urlopen(req, timeout=timeout) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            event = json.loads(line[5:])
            out = event.get("output_ids") or []
            meta = event.get("meta_info", {})
            done = meta.get("completion_tokens", len(ids) + len(out))
            verify_ct = meta.get("spec_verify_ct", verify_ct)
            # cumulative or incremental output ids, as the server streams them
            ids = list(out) if len(out) == done else ids + list(out)
            if ids:
                now = time.perf_counter()
                first = first if first is not None else now
                last = now
    return ids, sent, first, last, verify_ct


def run(url, users=8, rounds=4, context=(2400, 3100), turn_tokens=40, new_tokens=160,
        vocab=32000, seed=0):
    """Every user's rounds at once; the requests' measurements."""
    chats = histories(users, context, vocab, seed)
    rows, errors, lock = [], [], threading.Lock()

    def user(u):
        try:
            for k in range(rounds):
                chats[u] += turn(vocab, turn_tokens, seed * 1000003 + u * 101 + k)
                reply, sent, first, last, verify_ct = stream_generate(url, chats[u], new_tokens)
                n = len(reply)
                decode = (n - 1) / (last - first) if n > 1 and last > first else None
                with lock:
                    rows.append({"user": u, "round": k, "prompt_len": len(chats[u]), "new_tokens": n,
                                 "ttft_s": round(first - sent, 4), "decode_tok_s": decode,
                                 "spec_verify_ct": verify_ct})
                chats[u] += reply
        except Exception as e:  # one user's failure is reported, not hidden
            with lock:
                errors.append(f"user {u}: {e!r}")

    threads = [threading.Thread(target=user, args=(u,)) for u in range(users)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    rows.sort(key=lambda r: (r["round"], r["user"]))
    return rows, errors, time.perf_counter() - t0


def summary(rows, wall_s):
    speeds = sorted(r["decode_tok_s"] for r in rows if r["decode_tok_s"])
    ttfts = sorted(r["ttft_s"] for r in rows)
    pick = lambda xs, q: xs[min(len(xs) - 1, int(q * len(xs)))] if xs else None  # noqa: E731
    verified = [r for r in rows if r.get("spec_verify_ct")]  # tokens per verify round, as the server's
    return {"requests": len(rows), "wall_s": round(wall_s, 2),
            "decode_tok_s_per_request_median": statistics.median(speeds) if speeds else None,
            "decode_tok_s_per_request_p10": pick(speeds, 0.1),
            "ttft_s_median": statistics.median(ttfts) if ttfts else None,
            "ttft_s_p90": pick(ttfts, 0.9),
            "prompt_len_max": max((r["prompt_len"] for r in rows), default=0),
            "accept_len": (round(sum(r["new_tokens"] for r in verified) / sum(r["spec_verify_ct"] for r in verified), 3)
                           if verified else None)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--url", default="http://127.0.0.1:30000")
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--context", default="2400,3100", help="starting history length range, tokens")
    ap.add_argument("--turn-tokens", type=int, default=40)
    ap.add_argument("--new-tokens", type=int, default=160)
    ap.add_argument("--vocab", type=int, default=32000, help="ids are drawn below this")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    lo, hi = map(int, a.context.split(","))
    rows, errors, wall = run(a.url, a.users, a.rounds, (lo, hi), a.turn_tokens, a.new_tokens, a.vocab, a.seed)
    s = summary(rows, wall)
    with open(a.out, "w") as f:
        json.dump({"args": vars(a), "requests": rows, "errors": errors, "summary": s}, f, indent=1)
    print("RESULT " + json.dumps(s), flush=True)
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
