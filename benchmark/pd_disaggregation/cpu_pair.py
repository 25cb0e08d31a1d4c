"""PD (prefill+decode over mooncake TCP) vs a single server, on CPU, tiny Gemma models.

    python benchmark/pd_disaggregation/cpu_pair.py MODEL(gemma4|gemma3n) MODE(plain|off|on)

  plain: one plain server (no PD, YOCO off) -> $PD_WORKDIR/plain_<model>.json
  off/on: prefill server (YOCO off/on) + decode server -> compared with plain_<model>.json,
          written to $PD_OUT/cpu_mooncake_tcp_<model>_yoco_<mode>.json
Run with the fork installed (this interpreter) and mooncake-transfer-engine-non-cuda, whose
libibverbs.so.1 and libnl must be on LD_LIBRARY_PATH (apt libibverbs1 libnl-3-200
libnl-route-3-200). PD_WORKDIR defaults to build/pd, PD_OUT to .humanize/pd-disaggregation/data.
PD_MTP=1 (gemma4): every server, the plain one included, runs FROZEN_KV_MTP (3 steps, the
seeded assistant) on triton through Triton's interpreter (test/srt/mtp_cpu_shim/, as the
CPU MTP tests), and the files get an `_mtp` suffix.
"""
import json, os, random, re, signal, subprocess, sys, threading, time
import requests

PY = sys.executable
W = os.path.abspath(os.environ.get("PD_WORKDIR", "build/pd"))
OUTDIR = os.environ.get("PD_OUT", ".humanize/pd-disaggregation/data")
SERVER_ARGS = ["--device", "cpu", "--attention-backend", "torch_native", "--dtype", "float32",
               "--skip-tokenizer-init", "--disable-cuda-graph", "--max-total-tokens", "8192",
               "--max-running-requests", "64", "--mem-fraction-static", "0.5",
               "--random-seed", "0", "--log-level", "info", "--sleep-on-idle"]
ENV = {"CUDA_VISIBLE_DEVICES": "", "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN": "1",
       "SGLANG_HOST_IP": "127.0.0.1"}
MTP = os.environ.get("PD_MTP") == "1"
SUFFIX = "_mtp" if MTP else ""
BOOT = 31998
YOCO = ["--kv-sharing-fast-prefill", "--kv-sharing-fast-prefill-min-tokens", "0"]
PD = ["--disaggregation-transfer-backend", "mooncake_tcp"]
MAX_NEW = 8


def prompts():
    rng = random.Random(0)
    ps = [[rng.randrange(3, 512) for _ in range(n)] for n in (5, 17, 33, 48, 64, 90, 120)]
    ps.append(ps[3] + [rng.randrange(3, 512) for _ in range(20)])  # extends prompt 3: partial prefix hit
    ps.append(list(ps[1]))  # repeat of prompt 1: full radix hit
    ps.append(list(ps[6]))  # repeat of prompt 6: full radix hit
    return ps


class Server:
    def __init__(self, name, model, port, extra):
        self.name, self.port = name, port
        self.url = f"http://127.0.0.1:{port}"
        self.cmd = [PY, "-m", "sglang.launch_server", "--model-path", model, "--host", "127.0.0.1",
                    "--port", str(port), "--nccl-port", str(port + 1), *SERVER_ARGS, *extra]
        self.logpath = f"{W}/{name}.log"
        self.log = open(self.logpath, "w")
        self.t0 = time.time()
        self.proc = subprocess.Popen(self.cmd, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **ENV}, start_new_session=True)
        open(f"{W}/{name}.pid", "w").write(str(self.proc.pid))
        print(f"started {name} pid/pgid {self.proc.pid}", flush=True)

    def wait(self, timeout=400):
        while time.time() - self.t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited:\n" + open(self.logpath).read()[-4000:])
            try:
                if requests.get(self.url + "/health", timeout=10).status_code == 200:
                    self.startup_s = round(time.time() - self.t0, 2)
                    print(f"{self.name} ready in {self.startup_s}s", flush=True)
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        raise RuntimeError(f"{self.name} did not start")

    def stop(self):
        pg = self.proc.pid
        try:
            os.killpg(pg, signal.SIGTERM)
        except ProcessLookupError:
            pass
        for _ in range(40):
            self.proc.poll()  # reap the leader, else pgrep counts its zombie
            if subprocess.run(["pgrep", "-g", str(pg)], capture_output=True).returncode != 0:
                print(f"stopped {self.name}", flush=True)
                return
            time.sleep(1)
        os.killpg(pg, signal.SIGKILL)
        time.sleep(2)
        print(f"killed {self.name}", flush=True)

    def lines(self, pat):
        return [l.rstrip() for l in open(self.logpath, errors="replace") if re.search(pat, l)]


def post(url, body, out, key):
    t = time.time()
    try:
        r = requests.post(url + "/generate", json=body, timeout=180)
        j = r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text
        out[key] = {"status": r.status_code, "wall_s": round(time.time() - t, 3), "resp": j}
    except Exception as e:
        out[key] = {"status": "EXC", "wall_s": round(time.time() - t, 3), "resp": repr(e)}


def summarize(x):
    j = x["resp"]
    if x["status"] != 200 or not isinstance(j, dict):
        return {"status": x["status"], "wall_s": x["wall_s"], "error": str(j)[:1500]}
    mi = j["meta_info"]
    return {"status": 200, "wall_s": x["wall_s"], "output_ids": j["output_ids"],
            "logprobs": [a[0] for a in mi["output_token_logprobs"]],
            "logprob_ids": [a[1] for a in mi["output_token_logprobs"]],
            "cached_tokens": mi.get("cached_tokens"), "prompt_tokens": mi.get("prompt_tokens"),
            "spec_verify_ct": mi.get("spec_verify_ct")}


def sampling():
    return {"temperature": 0.0, "max_new_tokens": MAX_NEW, "ignore_eos": True}


def use_mtp():
    """FROZEN_KV_MTP on every server: its flags and the CPU MTP tests' environment."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    sys.path.insert(0, os.path.join(root, "benchmark", "yoco_gemma4"))
    from checkpoints import mtp_kwargs, write_assistant_checkpoint
    from tiny_gemma import GEMMA4_TEXT_CONFIG

    draft = write_assistant_checkpoint(f"{W}/tiny_gemma4_assistant", dict(GEMMA4_TEXT_CONFIG))
    SERVER_ARGS.extend(["--attention-backend", "triton", "--disable-overlap-schedule", "--max-running-requests", "8",
                        "--triton-attention-num-kv-splits", "2", "--no-triton-attention-split-kv-verify"])
    for k, v in mtp_kwargs(draft, 3).items():
        SERVER_ARGS.extend([f"--{k.replace('_', '-')}", str(v)])
    shim = os.path.join(root, "test", "srt", "mtp_cpu_shim")
    ENV.update({"TRITON_INTERPRET": "1", "SGLANG_TEST_MTP_CPU_SHIM": "1", "SGLANG_DUMMY_WEIGHTS_AT_SCALE": "1",
                "PYTHONPATH": os.pathsep.join(filter(None, [shim, os.environ.get("PYTHONPATH")]))})


def main():
    model, mode = sys.argv[1], sys.argv[2]
    mpath = f"{W}/tiny_{model}"
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "test", "srt"))
    if not os.path.isdir(mpath):  # the CPU tests' seeded tiny checkpoint
        import tiny_gemma

        getattr(tiny_gemma, f"make_tiny_{model}")(mpath, seed=0)
    if MTP:
        use_mtp()
    ps = prompts()
    if mode == "plain":
        s = Server(f"plain_{model}{SUFFIX}", mpath, 31300, [])
        try:
            s.wait()
            res = []
            for p in ps:
                o = {}
                post(s.url, {"input_ids": p, "sampling_params": sampling(), "return_logprob": True}, o, "x")
                res.append(summarize(o["x"]))
                print(len(p), res[-1].get("output_ids"), res[-1]["wall_s"], flush=True)
            json.dump({"model": model, "startup_s": s.startup_s, "cmd": s.cmd, "results": res,
                       "overlap_line": s.lines(r"disable_overlap_schedule=\w+")[:1] and
                       re.search(r"disable_overlap_schedule=\w+", s.lines(r"disable_overlap_schedule=\w+")[0]).group(0)},
                      open(f"{W}/plain_{model}{SUFFIX}.json", "w"), indent=1)
        finally:
            s.stop()
        return

    ref = json.load(open(f"{W}/plain_{model}{SUFFIX}.json"))
    pre = Server(f"prefill_{model}_{mode}{SUFFIX}", mpath, 31100,
                 ["--disaggregation-mode", "prefill", *PD, "--disaggregation-bootstrap-port", str(BOOT)]
                 + (YOCO if mode == "on" else []))
    dec = None
    try:
        pre.wait()
        dec = Server(f"decode_{model}_{mode}{SUFFIX}", mpath, 31200, ["--disaggregation-mode", "decode", *PD])
        dec.wait()
        info0 = requests.get(pre.url + "/get_server_info", timeout=30).json()
        passes_before = info0["internal_states"][0].get("kv_sharing_fast_prefill_passes")
        runs = []
        for i, p in enumerate(ps):
            body = {"input_ids": p, "sampling_params": sampling(), "return_logprob": True,
                    "bootstrap_host": "127.0.0.1", "bootstrap_port": BOOT, "bootstrap_room": 1000 + i}
            o = {}
            th = [threading.Thread(target=post, args=(pre.url, body, o, "prefill")),
                  threading.Thread(target=post, args=(dec.url, body, o, "decode"))]
            t0 = time.time()
            [t.start() for t in th]
            [t.join() for t in th]
            r = {"prompt_index": i, "prompt_len": len(p), "pair_wall_s": round(time.time() - t0, 3),
                 "prefill": summarize(o["prefill"]), "decode": summarize(o["decode"])}
            want = ref["results"][i]
            d = r["decode"]
            if d["status"] == 200:
                r["equal_ids"] = d["output_ids"] == want["output_ids"]
                n = min(len(d["logprobs"]), len(want["logprobs"]))
                r["n_logprobs_compared"] = n
                r["max_abs_logprob_diff"] = max(abs(a - b) for a, b in zip(d["logprobs"][:n], want["logprobs"][:n]))
            else:
                r["equal_ids"] = False
            if r["prefill"]["status"] == 200:
                r["prefill_first_token_equal"] = r["prefill"]["output_ids"][:1] == want["output_ids"][:1]
            runs.append(r)
            print(i, len(p), "equal" if r["equal_ids"] else "DIFF", d.get("output_ids"), want["output_ids"],
                  r.get("max_abs_logprob_diff"), "cached(p/d)", r["prefill"].get("cached_tokens"),
                  d.get("cached_tokens"), r["pair_wall_s"], flush=True)
        info = requests.get(pre.url + "/get_server_info", timeout=30).json()
        passes = info["internal_states"][0].get("kv_sharing_fast_prefill_passes")
        alive = {"prefill": pre.proc.poll() is None, "decode": dec.proc.poll() is None}
        out = {
            "model": model, "prefill_yoco": mode, "transfer_backend": "mooncake_tcp",
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "prefill_cmd": pre.cmd, "decode_cmd": dec.cmd, "env": ENV, "plain_cmd": ref["cmd"],
            "startup_s": {"prefill": pre.startup_s, "decode": dec.startup_s, "plain": ref["startup_s"]},
            "prompts": ps,
            "equal": sum(r["equal_ids"] for r in runs), "total": len(runs),
            "max_abs_logprob_diff": max((r.get("max_abs_logprob_diff", float("nan")) for r in runs), default=None),
            "kv_sharing_fast_prefill_passes": passes,
            "kv_sharing_fast_prefill_passes_before_requests": passes_before,
            "startup_line": pre.lines(r"KV-sharing fast prefill")[:3],
            "overlap": {"prefill": re.findall(r"disable_overlap_schedule=\w+", " ".join(pre.lines("disable_overlap_schedule")))[:1],
                        "decode": re.findall(r"disable_overlap_schedule=\w+", " ".join(dec.lines("disable_overlap_schedule")))[:1],
                        "plain": ref.get("overlap_line")},
            "mooncake_tcp_lines": pre.lines(r"mooncake_tcp|MC_FORCE_TCP is set|TcpTransport: listen")[:4],
            "prefill_cached_token_lines": [re.search(r"#new-token: \d+, #cached-token: \d+", l).group(0)
                                           for l in pre.lines(r"#cached-token") if re.search(r"#new-token: \d+, #cached-token: \d+", l)],
            "prefill_errors": pre.lines(r"Traceback|Error|error")[:10],
            "decode_errors": dec.lines(r"Traceback|Error|error")[:10],
            "servers_alive_after": alive,
            "runs": runs, "plain_results": ref["results"],
        }
        os.makedirs(OUTDIR, exist_ok=True)
        fn = f"{OUTDIR}/cpu_mooncake_tcp_{model}_yoco_{mode}{SUFFIX}.json"
        json.dump(out, open(fn, "w"), indent=1)
        print("wrote", fn, "equal", out["equal"], "/", out["total"], "maxdiff", out["max_abs_logprob_diff"],
              "passes", passes, "alive", alive, flush=True)
        print("startup_line", out["startup_line"], out["overlap"], flush=True)
    finally:
        if dec:
            dec.stop()
        pre.stop()


if __name__ == "__main__":
    main()
