"""The served benchmarks' plumbing (run.py, serve_mtp.py) on CPU: server flags, warm-up,
one-sided runs merged, an empty prefix cache per pass."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "yoco_gemma4"))


def test_served_benchmark_server_flags(tmp_path, monkeypatch):
    """run.py's servers: the flag only on the "on" side, --modes picks the sides, the
    multimodal layout gets a vision attention backend that needs no FA3, and
    --prefill-graph keeps the prefill CUDA graph that the benchmark otherwise turns off."""
    import run

    cmds = []
    monkeypatch.setattr(run, "make_checkpoint", lambda path, *a, **k: path)
    warm = []
    monkeypatch.setattr(run, "serve_workloads", lambda cmd, *a, **k: cmds.append(cmd) or warm.append(a[-1]) or [])

    def flag(cmd, name):
        return cmd[cmd.index(name) + 1] if name in cmd else None

    run.run_serving(str(tmp_path), "e4b", quick=True, tp=1, only=["summ"])
    off, on = cmds
    assert "--kv-sharing-fast-prefill" not in off and "--kv-sharing-fast-prefill" in on
    assert all("--disable-prefill-cuda-graph" in c and flag(c, "--mm-attention-backend") is None for c in cmds)

    cmds.clear()
    run.run_serving(str(tmp_path), "e4b", quick=True, tp=1, only=["summ"], multimodal=True,
                    prefill_graph=True, modes=("on",))
    (on,) = cmds
    assert "--kv-sharing-fast-prefill" in on
    assert flag(on, "--mm-attention-backend") == "triton_attn"
    assert "--disable-prefill-cuda-graph" not in on
    assert warm == [True, True, True]  # every server warms up unless asked not to
    run.run_serving(str(tmp_path), "e4b", quick=True, tp=1, only=["summ"], modes=("on",), warmup=False)
    assert warm[-1] is False
    assert flag(cmds[-1], "--log-level") == "warning"
    run.run_serving(str(tmp_path), "e4b", quick=True, tp=2, only=["summ"], modes=("off",),
                    server_extra={"log_level": "info"})
    assert flag(cmds[-1], "--log-level") == "info" and flag(cmds[-1], "--tp-size") == "2"


def test_serve_mtp_adaptive1_config(tmp_path):
    """serve_mtp.py's mode mtp-splitkv-mrr80-adaptive1: stock's adaptive config with 1
    draft step, not 0, from batch 64, in a file the server's own loader accepts."""
    import json

    sys.path.insert(0, os.path.join(ROOT, "benchmark", "frozen_kv_mtp"))
    import serve_mtp
    from sglang.srt.speculative.adaptive_spec_params import (
        DEFAULT_ADAPTIVE_CONFIG,
        resolve_candidate_steps_from_config,
    )

    flags = serve_mtp.adaptive1_config(str(tmp_path))
    assert flags[0] == "--speculative-adaptive-config"
    cfg = json.loads(open(flags[1]).read())
    assert cfg["64"]["candidate_steps"] == [1]
    assert {k: v for k, v in cfg.items() if k != "64"} == {
        k: v for k, v in DEFAULT_ADAPTIVE_CONFIG.items() if k != "64"}
    assert resolve_candidate_steps_from_config(flags[1]) == [0, 1, 3, 7]
    assert "--speculative-adaptive" in serve_mtp.MODE_FLAGS["mtp-splitkv-mrr80-adaptive1"]


def test_served_benchmark_warms_each_workload_unmeasured(tmp_path, monkeypatch):
    """serve_workloads runs every workload once, small, unmeasured and with other prompts
    (another seed), before the measured passes; only the measured passes become rows;
    warmup=False measures the first pass."""
    import run

    calls = []
    monkeypatch.setattr(run.subprocess, "Popen", lambda *a, **k: type("P", (), {
        "terminate": lambda self: None, "wait": lambda self, timeout=None: 0})())
    monkeypatch.setattr(run, "_wait_healthy", lambda port, proc: None)
    monkeypatch.setattr(run, "_bench", lambda model, port, name, inp, outp, n, conc, jsonl, seed=0: calls.append(
        (name, outp, n, os.path.basename(jsonl), seed)) or {"workload": name})
    workloads = [("summ", 8000, 1000, 80, None), ("chat-c8", 1000, 1000, 32, 8)]
    rows = run.serve_workloads([], {}, 0, "m", workloads, str(tmp_path / "serving_on.jsonl"), "on", "on")
    # the warm-up's prompts come from another seed: none of them is in the radix cache
    # when the measured pass starts
    assert calls == [
        ("summ", run.WARMUP_OUTPUT, run.WARMUP_PROMPTS, "serving_on_warmup.jsonl", 1),
        ("chat-c8", run.WARMUP_OUTPUT, run.WARMUP_PROMPTS, "serving_on_warmup.jsonl", 1),
        ("summ", 1000, 80, "serving_on.jsonl", 0),
        ("chat-c8", 1000, 32, "serving_on.jsonl", 0),
    ]
    assert [r["workload"] for r in rows] == ["summ", "chat-c8"] and all(r["mode"] == "on" for r in rows)
    calls.clear()
    run.serve_workloads([], {}, 0, "m", workloads, str(tmp_path / "serving_on.jsonl"), "on", "on", warmup=False)
    assert [c[3] for c in calls] == ["serving_on.jsonl"] * 2

def test_served_benchmark_merges_one_sided_runs(tmp_path):
    """run.py --merge: the off side and the on side served in two calls (TP=2 fills a
    call per side) become one table with the change column; runs of another setup, or
    serving the same mode twice, are refused with the reason."""
    import json

    import run

    def side(name, mode, tp=2, tok_s=100.0):
        d = tmp_path / name
        d.mkdir()
        rows = [{"workload": "chat", "mode": mode, "output_throughput": tok_s, "median_ttft_ms": 10.0,
                 "p99_ttft_ms": 20.0, "median_tpot_ms": 5.0}]
        (d / "results.json").write_text(json.dumps({
            "variant": "e4b", "tp": tp, "mtp": False, "multimodal": True, "prefill_graph": False,
            "warmup": True, "started": name, "serving": rows}))
        return str(d)

    off, on = side("off", "off"), side("on", "on", tok_s=110.0)
    out = tmp_path / "merged"
    out.mkdir()
    run.merge(str(out), [off, on])
    run.report(str(out))
    data = json.loads((out / "results.json").read_text())
    assert [r["mode"] for r in data["serving"]] == ["off", "on"] and data["tp"] == 2
    assert [m["started"] for m in data["merged_from"]] == ["off", "on"]
    table = (out / "results.md").read_text()
    assert "| chat | output_throughput | 100.0 | 110.0 | +10.0% |" in table and "2 runs merged" in table

    info = side("on_info", "on")
    data = json.loads(open(f"{info}/results.json").read())
    open(f"{info}/results.json", "w").write(json.dumps({**data, "server_extra": {"log_level": "info"}}))
    with pytest.raises(SystemExit, match="differs .* in server_extra"):
        run.merge(str(out), [off, info])
    with pytest.raises(SystemExit, match="differs .* in tp"):
        run.merge(str(out), [off, side("on_tp1", "on", tp=1)])
    with pytest.raises(SystemExit, match=r"\('off', 'chat'\).*more than one run"):
        run.merge(str(out), [off, side("off2", "off")])


def test_served_benchmark_passes_start_from_an_empty_prefix_cache(tmp_path, monkeypatch):
    """Every bench_serving pass flushes the server's prefix cache first: with one seed,
    chat prompt i is the start of summ prompt i (checked here on sglang's own random-ids
    sampler), so without the flush a chat pass after summ prefilled almost nothing."""
    import json
    import random

    import numpy as np
    import run
    from sglang.benchmark.datasets.random import sample_random_requests

    class Tok:
        vocab_size = 1000

        def num_special_tokens_to_add(self):
            return 0

    def prompts(input_len, seed):
        random.seed(seed)
        np.random.seed(seed)
        rows = sample_random_requests(input_len, 16, 8, 1.0, Tok(), "", random_sample=False, return_text=False)
        return [r.prompt for r in rows]

    summ, chat = prompts(80, 0), prompts(10, 0)
    assert all(s[:10] == c for s, c in zip(summ, chat))  # why the flush is needed

    cmds = []
    jsonl = tmp_path / "s.jsonl"

    def fake_run(cmd, check, stdout):
        cmds.append(cmd)
        jsonl.write_text(json.dumps({"output_throughput": 1.0, "ttfts": [0.1], "completed": 1}) + "\n")

    monkeypatch.setattr(run.subprocess, "run", fake_run)
    row = run._bench("m", 0, "chat", 10, 16, 8, None, str(jsonl))
    assert "--flush-cache" in cmds[0] and row["completed"] == 1


def test_serve_mtp_serves_the_users_targets_at_stock_flags(tmp_path, monkeypatch):
    """--variant 31b-w8a8 --stock-flags: a compressed-tensors checkpoint that SGLang reads as
    its W8A8 INT8 scheme (dynamic per-token int8 activations), an assistant widened to it,
    servers at launch_server's defaults but for the page size and the assistant, and
    simulated acceptance only where the mode does not end in -real."""
    import json

    sys.path.insert(0, os.path.join(ROOT, "benchmark", "frozen_kv_mtp"))
    import serve_mtp
    from compressed_tensors.quantization import QuantizationArgs
    from sglang.srt.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig

    runs = []
    monkeypatch.setattr(serve_mtp, "serve_workloads", lambda cmd, env, *a, **k: runs.append((cmd, env)) or [])
    monkeypatch.setattr(sys, "argv", ["serve_mtp.py", str(tmp_path), "--variant", "31b-w8a8", "--stock-flags",
                                      "--modes", "nospec,mtp,mtp-real", "--workloads", "mturn"])
    serve_mtp.main()
    cfg = json.load(open(tmp_path / "ckpt-31b-w8a8" / "config.json"))
    group = cfg["quantization_config"]["config_groups"]["group_0"]
    quant = CompressedTensorsConfig.from_config(cfg["quantization_config"])
    w, x = (QuantizationArgs(**group[k]) for k in ("weights", "input_activations"))
    assert quant._is_dynamic_token_w8a8(w, x)
    assert json.load(open(tmp_path / "ckpt-31b-w8a8-assistant" / "config.json"))["backbone_hidden_size"] == 5376
    (nospec, env0), (mtp, env1), (real, env2) = runs
    flag = lambda cmd, name: cmd[cmd.index(name) + 1]  # noqa: E731
    assert [flag(c, "--page-size") for c in (nospec, mtp, real)] == ["64"] * 3
    assert not any(f.startswith("--speculative") for f in nospec) and "--attention-backend" not in mtp
    assert flag(mtp, "--speculative-algorithm") == "NEXTN" and flag(real, "--speculative-draft-model-path")
    assert "SGLANG_SIMULATE_ACC_LEN" in env1 and "SGLANG_SIMULATE_ACC_LEN" not in env2
