"""Served E4B: no speculation vs FROZEN_KV_MTP vs FROZEN_KV_MTP with split-KV verify.

    python benchmark/frozen_kv_mtp/serve_mtp.py OUT_DIR [--variant e4b]
        [--modes nospec,mtp,mtp-splitkv] [--workloads chat] [--port 32000]

One server per mode, one after the other on the same GPU, the YOCO benchmark's
checkpoint and engine settings (benchmark/yoco_gemma4/run.py: seeded weights at scale,
triton, the server's default radix cache), `sglang.bench_serving` with random ids at fixed lengths, seed 0.
MTP modes: E4B assistant drafter, steps 3, topk 1, 4 draft tokens,
SGLANG_SIMULATE_ACC_LEN=2.1 (the original study's accept length; --accept-len sets another); `mtp-splitkv` adds
--triton-attention-split-kv-verify, `mtp-splitkv-mrr80` also --max-running-requests 80
(FROZEN_KV_MTP's default is 48), `mtp-splitkv-mrr80-adaptive` also --speculative-adaptive,
`mtp-splitkv-mrr80-adaptive1` the same with stock's adaptive config except 1 draft step,
not 0, from batch 64 (OUT_DIR/adaptive1.json), `mtp-splitkv-mrr80-adaptive-stocktail` the
same as `-adaptive` with the one-node greedy verify tail off. For the defaults
(issue item 3): `mtp-splitkv-adaptive` is `-mrr80-adaptive` under FROZEN_KV_MTP's default
cap of 48 running requests, `mtp-splitkv-mrr80-adaptive-nooverlap` the same with
--disable-overlap-schedule.
With --profile-at S, each server's torch profiler records --profile-steps scheduler
steps from S seconds after all of a measured pass's prompts run, none waiting (GPU
activity only, so the host is barely slowed; --profile-cpu adds the host with Python stacks)
to OUT_DIR/trace_MODE_WORKLOAD/ (chrome traces; benchmark/yoco_gemma4/trace_summary.py sums them).
With --gc-log, each server process logs its Python GC pauses (OUT_DIR/gc_MODE.log, through
jit_log_site/) and each row gets a `gc` summary of its pass (counts and pause time by
generation, per process); --freeze-gc calls each server's /freeze_gc after its warm-up.
`--workloads mturn`: the reporting user's multi-turn chats instead of bench_serving
(multiturn.py: 8 users, 4 rounds, histories from 2400-3100 tokens growing by each turn and
reply, 160 new tokens streamed, radix cache on; --mturn USERS,ROUNDS,NEW sets others);
its rows give per-request decode speed and TTFT. YOCO is off throughout.
`--variant 31b|31b-w8a8|26b-a4b`: targets without KV sharing (checkpoints.py; the assistant
widened to the target). `--stock-flags`: served as the reporting user serves, `launch_server`
with the dummy weights, `--page-size` (64) and, in MTP modes, the assistant; every other
flag at its default (no MODE_FLAGS, no benchmark engine settings). A mode ending in `-real`
leaves acceptance to the seeded drafter (no SGLANG_SIMULATE_ACC_LEN); `MODE@X` simulates X. Each server serves every workload once unmeasured first (run.py's
warm-up, 16 prompts or --warmup-prompts N; --no-warmup skips it). Writes OUT_DIR/serve_mtp.json
and one `ROW {json}` line per (mode, workload).
"""

import argparse
import json
import os
import sys
import threading
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "yoco_gemma4"))
from checkpoints import text_config, write_assistant_checkpoint  # noqa: E402
from make_checkpoint import make_checkpoint  # noqa: E402
from run import MTP_ACCEPT_LEN, WARMUP_PROMPTS, WORKLOADS, _bench, _server_cmd, concurrency_workloads, log, serve_workloads  # noqa: E402

import multiturn  # noqa: E402


def stock_server_cmd(model, port, draft, page_size):
    """launch_server at its defaults but for the weights, page size and assistant."""
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", model, "--port", str(port),
           "--load-format", "dummy", "--page-size", str(page_size)]
    if draft:
        cmd += ["--speculative-algorithm", "NEXTN", "--speculative-draft-model-path", draft,
                "--speculative-draft-load-format", "dummy"]  # step counts: FROZEN_KV_MTP's defaults
    return cmd


def mturn_bench(rounds):
    """A serve_workloads pass: bench_serving, or for "mturn" the multi-turn users (the
    warm-up, seed 1: one round of each user)."""
    def bench(model, port, name, inp, outp, prompts, conc, jsonl, seed=0):
        if name != "mturn":
            return _bench(model, port, name, inp, outp, prompts, conc, jsonl, seed)
        rows, errors, wall = multiturn.run(f"http://127.0.0.1:{port}", users=prompts,
                                           rounds=1 if seed else rounds, new_tokens=outp, seed=seed)
        if errors:
            raise RuntimeError("; ".join(errors))
        with open(jsonl, "a") as f:
            f.write(json.dumps({"requests": rows}) + "\n")
        return {"workload": name, "users": prompts, "rounds": 1 if seed else rounds, "new_tokens": outp,
                **multiturn.summary(rows, wall)}
    return bench

MODE_FLAGS = {
    "nospec": [],
    "mtp": ["--no-triton-attention-split-kv-verify"],  # stock's extend-kernel verify
    "mtp-splitkv": ["--triton-attention-split-kv-verify"],
    # FROZEN_KV_MTP caps running requests at 48 when unset (speculative_hook.py)
    "mtp-splitkv-mrr80": ["--triton-attention-split-kv-verify", "--max-running-requests", "80"],
    # + stock adaptive step counts: 0 draft steps from batch 64
    "mtp-splitkv-mrr80-adaptive": [
        "--triton-attention-split-kv-verify", "--max-running-requests", "80", "--speculative-adaptive",
    ],
}
# the defaults FROZEN_KV_MTP sets or keeps: its 48-request cap, overlap scheduling
MODE_FLAGS["mtp-splitkv-adaptive"] = ["--triton-attention-split-kv-verify", "--speculative-adaptive"]
MODE_FLAGS["mtp-splitkv-mrr80-adaptive-nooverlap"] = MODE_FLAGS["mtp-splitkv-mrr80-adaptive"] + [
    "--disable-overlap-schedule"
]
# the same flags; its adaptive config file is added in main()
MODE_FLAGS["mtp-splitkv-mrr80-adaptive1"] = MODE_FLAGS["mtp-splitkv-mrr80-adaptive"]
# the same flags with the one-node greedy verify tail off (A/B)
MODE_FLAGS["mtp-splitkv-mrr80-adaptive-stocktail"] = MODE_FLAGS["mtp-splitkv-mrr80-adaptive"]


def adaptive1_config(out_dir):
    """Stock's adaptive config, but 1 draft step instead of 0 from batch 64."""
    from sglang.srt.speculative.adaptive_spec_params import DEFAULT_ADAPTIVE_CONFIG

    cfg = json.loads(json.dumps(DEFAULT_ADAPTIVE_CONFIG))
    cfg["64"]["candidate_steps"] = [1]
    path = os.path.join(out_dir, "adaptive1.json")
    with open(path, "w") as f:
        json.dump(cfg, f, indent=1)
    return ["--speculative-adaptive-config", path]


def profile_later(port, out_dir, delay_s, steps, running, cpu=False):
    """on_measured callback: once `running` requests run and none waits (the pass's
    steady batch), wait `delay_s` more, then profile `steps` scheduler steps (the
    profiler stops by itself and writes the trace). bench_serving takes seconds to
    start, so a timer from the pass's start would catch its prefills."""
    base = f"http://127.0.0.1:{port}"

    def start():
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                load = json.loads(urllib.request.urlopen(f"{base}/get_load", timeout=10).read())[0]
                if load["num_waiting_reqs"] == 0 and load["num_reqs"] >= running:
                    break
            except Exception:
                pass
            time.sleep(0.1)
        else:
            log("serve_mtp: the batch never filled; no profile")
            return
        time.sleep(delay_s)
        body = json.dumps({"output_dir": out_dir, "num_steps": steps,
                           "activities": ["CPU", "GPU"] if cpu else ["GPU"], "with_stack": cpu}).encode()
        req = urllib.request.Request(f"{base}/start_profile", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(req, timeout=60).read()
            log(f"serve_mtp: profiling {steps} steps into {out_dir}")
        except Exception as e:  # a failed profile must not lose the pass's numbers
            log(f"serve_mtp: start_profile failed: {e!r}")

    threading.Thread(target=start, daemon=True).start()


def gc_summary(path, t0, t1):
    """Per process title, the garbage collections logged by BENCH_GC_LOG (jit_log_site)
    between t0 and t1: counts by generation, total pause per generation (ms), the
    longest pause (us). Short generation-0 collections arrive in blocks of 200."""
    out = {}
    if not os.path.exists(path):
        return out
    for line in open(path):
        f = line.split()
        if len(f) < 6 or not t0 <= float(f[1]) <= t1:
            continue
        s = out.setdefault(f[3], {"count": [0, 0, 0], "pause_ms": [0.0, 0.0, 0.0], "max_us": 0})
        if f[0] == "gc0":
            s["count"][0] += int(f[4])
            s["pause_ms"][0] += float(f[5]) / 1000
        else:
            gen, us = int(f[4]), float(f[5])
            s["count"][gen] += 1
            s["pause_ms"][gen] += us / 1000
            s["max_us"] = max(s["max_us"], us)
    for s in out.values():
        s["pause_ms"] = [round(x, 3) for x in s["pause_ms"]]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--variant", default="e4b")
    ap.add_argument("--modes", default="nospec,mtp,mtp-splitkv")
    ap.add_argument("--workloads", default="chat",
                    help=f"of {', '.join(w[0] for w in WORKLOADS)}, chat-cN or summ-cN (N concurrent, as run.py's sweep)")
    ap.add_argument("--port", type=int, default=32000)
    ap.add_argument("--no-warmup", action="store_true", help="measure each server's first pass over a workload")
    # 16 never reaches batch 64, where the adaptive config switches to 0 steps: with 80 the
    # measured pass is not the first to run that state (else its last prefill pays the first 0-step round's compiles)
    ap.add_argument("--warmup-prompts", type=int, default=WARMUP_PROMPTS, help="prompts per warm-up pass")
    # One draft step caps the chain at 2 tokens, so 2.1 accepts every draft. 2.1 over 3
    # steps implies a first-token acceptance of about 0.58-0.75, i.e. 1.58-1.75 for one
    # step (sglang's default match-expected method draws 1 or 2 with that mean).
    ap.add_argument("--accept-len", default=MTP_ACCEPT_LEN, help="SGLANG_SIMULATE_ACC_LEN for the MTP modes")
    # Each server its own empty TRITON_CACHE_DIR: every one compiles cold, as in a new
    # container, and a later server cannot load what an earlier one compiled.
    ap.add_argument("--fresh-triton-cache", action="store_true", help="an empty Triton cache per server")
    ap.add_argument("--jit-log", action="store_true",
                    help="log each server's Triton compiles with times to OUT/jit_MODE.log (jit_log_site/)")
    ap.add_argument("--gc-log", action="store_true",
                    help="log each server process's Python GC pauses (gc_MODE.log); rows get a `gc` summary of the pass")
    ap.add_argument("--freeze-gc", action="store_true",
                    help="call the server's /freeze_gc after its warm-up (stock's advice against GC jitter)")
    ap.add_argument("--no-kernel-warmup", action="store_true",
                    help="MTP servers skip the start-up compile of the spec decode kernels (A/B)")
    ap.add_argument("--profile-at", type=float, default=None,
                    help="profile each measured pass this many seconds after all its prompts run (default: none)")
    ap.add_argument("--profile-steps", type=int, default=20)
    ap.add_argument("--profile-cpu", action="store_true",
                    help="record the host too, with Python stacks (slows the host: for where it is late, not how much)")
    ap.add_argument("--mturn", default="8,4,160", help="USERS,ROUNDS,NEW_TOKENS of --workloads mturn")
    ap.add_argument("--stock-flags", action="store_true",
                    help="launch_server defaults but for --page-size and the assistant (see above)")
    ap.add_argument("--page-size", type=int, default=64, help="with --stock-flags")
    ap.add_argument("--server-extra", default="{}",
                    help='JSON of engine kwargs for every server, e.g. \'{"log_level": "info"}\' (prefill batches in the log)')
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    model = make_checkpoint(f"{a.out}/ckpt-{a.variant}", a.variant)
    draft = write_assistant_checkpoint(f"{a.out}/ckpt-{a.variant}-assistant",
                                       None if a.variant == "e4b" else text_config(a.variant))
    users, rounds, new = map(int, a.mturn.split(","))
    known = list(WORKLOADS) + concurrency_workloads() + [("mturn", 3100, new, users, users)]
    workloads = [w for w in known if w[0] in a.workloads.split(",")]
    rows = []
    for i, mode in enumerate(a.modes.split(",")):
        env = dict(os.environ, SGLANG_DUMMY_WEIGHTS_AT_SCALE="1")
        mode, _, accept_len = mode.partition("@")  # "mtp@1.5": this mode at that simulated acceptance
        if mode != "nospec" and not mode.endswith("-real"):
            env["SGLANG_SIMULATE_ACC_LEN"] = accept_len or a.accept_len
        if a.fresh_triton_cache:
            env["TRITON_CACHE_DIR"] = os.path.abspath(f"{a.out}/triton_cache_{i}_{mode}")
        if a.jit_log or a.no_kernel_warmup or a.gc_log:
            site = os.path.join(HERE, "jit_log_site")
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [site, env.get("PYTHONPATH")]))
        if a.jit_log:
            env["BENCH_TRITON_JIT_LOG"] = os.path.abspath(f"{a.out}/jit_{mode}.log")
        if a.gc_log:
            env["BENCH_GC_LOG"] = os.path.abspath(f"{a.out}/gc_{mode}.log")
        if mode.endswith("-stocktail"):
            env["SGLANG_ONE_NODE_GREEDY_VERIFY"] = "0"
        if a.no_kernel_warmup and mode != "nospec":
            env["BENCH_SKIP_SPEC_KERNEL_WARMUP"] = "1"
        port = a.port + i
        if a.stock_flags:
            cmd = stock_server_cmd(model, port, None if mode == "nospec" else draft, a.page_size)
        else:
            cmd = _server_cmd(model, port, False, 1, None if mode == "nospec" else draft,
                              **json.loads(a.server_extra)) + MODE_FLAGS[mode.removesuffix("-real")]
        if mode.endswith("adaptive1"):
            cmd += adaptive1_config(a.out)
        log(f"serve_mtp: starting server, mode {mode}")

        def on_measured(name, port=port, mode=mode):
            if a.freeze_gc:  # after the warm-up; freezing twice only adds the newer objects
                urllib.request.urlopen(urllib.request.Request(f"http://127.0.0.1:{port}/freeze_gc", data=b""),
                                       timeout=60).read()
            if a.profile_at is not None:
                running = min(min(n, c or n) for w, _, _, n, c in workloads if w == name)
                profile_later(port, os.path.abspath(f"{a.out}/trace_{mode}_{name}"), a.profile_at, a.profile_steps,
                              running, a.profile_cpu)
        mode = f"{mode}@{accept_len}" if accept_len else mode
        for r in serve_workloads(cmd, env, port, model, workloads, f"{a.out}/serve_{mode.replace('@', '_acc')}.jsonl", mode, mode,
                                 not a.no_warmup, a.warmup_prompts, on_measured, mturn_bench(rounds)):
            r.pop("ttfts_ms", None)
            if a.gc_log:
                r["gc"] = gc_summary(env["BENCH_GC_LOG"], r["started_unix"], r["ended_unix"])
            print("ROW " + json.dumps(r), flush=True)
            rows.append(r)
    with open(os.path.join(a.out, "serve_mtp.json"), "w") as f:
        json.dump({"args": vars(a), "accept_len": a.accept_len, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
