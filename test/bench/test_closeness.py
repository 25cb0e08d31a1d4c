"""benchmark/frozen_kv_mtp/closeness.py (bench.py closeness) end to end on CPU: the tiny
Gemma-4 and a tiny assistant drafter on the triton backend under Triton's interpreter,
no speculation, FROZEN_KV_MTP with stock's verify and with the split-KV verify, one
engine after the other; its JSON and RESULT lines, and the outputs against HF's greedy
continuation. About 2.5 minutes of its 3 minutes of CPU time when it has 2 cores to itself
(three engine starts, the decode and verify rounds under the interpreter); 5-7 minutes
beside other jobs."""

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MTP = os.path.join(ROOT, "benchmark", "frozen_kv_mtp", "bench.py")
sys.path.insert(0, os.path.join(ROOT, "benchmark", "frozen_kv_mtp"))

PROMPTS, MAX_NEW = 3, 3


def test_closeness_help_and_dry_run():
    p = subprocess.run([sys.executable, MTP, "closeness", "--help"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and "usage:" in p.stdout and "closeness.py" in p.stdout, p.stdout + p.stderr
    assert "--page-size" in p.stdout and "--tiny" in p.stdout and "--target" in p.stdout
    p = subprocess.run([sys.executable, MTP, "closeness", "o.json", "--target", "31b", "--dry-run"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0 and p.stdout.startswith("$ python ") and "closeness.py o.json --target 31b" in p.stdout


def test_closeness_tiny_on_cpu(tmp_path):
    out = tmp_path / "closeness.json"
    env = dict(os.environ, FKV_CKPT_DIR=str(tmp_path / "ckpt"))
    p = subprocess.run([sys.executable, MTP, "closeness", str(out), "--tiny", "--prompts", str(PROMPTS),
                        "--max-new", str(MAX_NEW)], capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    results = [json.loads(l[len("RESULT "):]) for l in p.stdout.splitlines() if l.startswith("RESULT ")]
    assert [(r["mode"], r["against"]) for r in results] == [
        ("mtp", "nospec"), ("mtp-splitkv", "nospec"), ("mtp-splitkv", "mtp")]
    assert sum(l.startswith("WALL mode=") for l in p.stdout.splitlines()) == 3

    d = json.loads(out.read_text())
    assert set(d["modes"]) == {"nospec", "mtp", "mtp-splitkv"} and len(d["prompt_lens"]) == PROMPTS
    for mode, m in d["modes"].items():
        s = m["summary"]
        assert s["start_s"] > 0 and s["generate_s"] > 0 and s["engine_kwargs"]["attention_backend"] == "triton"
        assert len(m["outputs"]) == PROMPTS
        for o in m["outputs"]:
            assert 0 < len(o["ids"]) <= MAX_NEW and len(o["logprobs"]) == len(o["ids"]) and len(o["top5"]) == 5
            # the speculative path ran in the MTP modes (every request verified), not in nospec
            assert (o["verify_ct"] or 0) > 0 if mode != "nospec" else not o["verify_ct"]
    assert d["modes"]["mtp-splitkv"]["summary"]["engine_kwargs"]["triton_attention_split_kv_verify"] is True
    # stock's extend-kernel verify, opted out of FROZEN_KV_MTP's default
    assert d["modes"]["mtp"]["summary"]["engine_kwargs"]["triton_attention_split_kv_verify"] is False
    assert [(c["mode"], c["against"]) for c in d["comparisons"]] == [(r["mode"], r["against"]) for r in results]
    keys = {"identical", "of", "first_divergence_hist", "divergences", "first_token_logprob_diff_max",
            "first_token_top5_diff_max", "logprob_diff_max_before_divergence", "first_token_differs"}
    for c in d["comparisons"]:
        assert keys <= set(c) and c["of"] == PROMPTS
        assert c["identical"] + len(c["divergences"]) == PROMPTS
        assert sum(c["first_divergence_hist"].values()) == len(c["divergences"])

    # fp32 on CPU: the target's own greedy output (HF) on every prompt without a near-tie,
    # in every mode, so each comparison counts those as identical
    from cpu_engine import LOGPROB_ATOL, HFReference
    from closeness import TINY_DEFAULTS, make_prompts
    from tiny_gemma import GEMMA4_TEXT_CONFIG

    prompts = make_prompts(PROMPTS, TINY_DEFAULTS["min_len"], TINY_DEFAULTS["max_len"],
                           GEMMA4_TEXT_CONFIG["vocab_size"], seed=0)
    assert [len(x) for x in prompts] == d["prompt_lens"]
    hf = HFReference(str(tmp_path / "ckpt" / "tiny-target"))
    decisive = []
    for i, x in enumerate(prompts):
        toks, _, margin = hf.greedy(x, MAX_NEW)
        if margin >= 1e-3:
            decisive.append(i)
            for mode, m in d["modes"].items():
                ids = m["outputs"][i]["ids"]
                assert ids == toks[: len(ids)], (mode, i, ids, toks)
    assert len(decisive) >= 2, "the seeded tiny prompts should be decisive; the check means little otherwise"
    for c in d["comparisons"]:
        assert c["identical"] >= len(decisive) and c["first_token_differs"] == 0, c
        assert c["first_token_logprob_diff_max"] <= LOGPROB_ATOL and c["first_token_top5_diff_max"] <= LOGPROB_ATOL
        assert c["logprob_diff_max_before_divergence"] <= LOGPROB_ATOL
