"""The benchmark checkpoint (config + synthetic tokenizer, dummy weights at scale)
is served by the fork on CPU: text in, text out, lengths kept, YOCO on = off."""

import os
import random
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "yoco_gemma4"))

from make_checkpoint import SPECIAL_TOKENS, make_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(str(tmp_path_factory.mktemp("bench_ckpt")), "tiny")


def test_tokenizer_round_trips_any_ids(ckpt):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(ckpt)
    assert len(tok) == 512
    assert tok.convert_tokens_to_ids("<end_of_turn>") == SPECIAL_TOKENS["<end_of_turn>"]
    rng = random.Random(0)
    for n in (1, 7, 300):
        ids = [rng.randrange(5, 512) for _ in range(n)]
        ids = [i for i in ids if i not in SPECIAL_TOKENS.values()]
        assert tok.encode(tok.decode(ids), add_special_tokens=False) == ids
    chat = tok.apply_chat_template([{"role": "user", "content": "t7 t8"}], tokenize=False)
    assert chat.startswith("<bos>") and "<start_of_turn>" in chat


def test_served_from_text_with_dummy_weights_at_scale(ckpt, monkeypatch):
    from cpu_engine import start_engine

    monkeypatch.setenv("SGLANG_DUMMY_WEIGHTS_AT_SCALE", "1")
    prompt = " ".join(f"t{i}" for i in range(200, 260))
    texts = {}
    for on in (False, True):
        eng = start_engine(
            ckpt, load_format="dummy", skip_tokenizer_init=False, kv_sharing_fast_prefill=on
        )
        try:
            out = eng.generate(prompt=prompt, sampling_params={"max_new_tokens": 8, "temperature": 0})
        finally:
            eng.shutdown()
        assert out["meta_info"]["prompt_tokens"] == 60
        texts[on] = out["text"]
    words = texts[False].split()
    assert len(words) >= 4 and len(set(words)) > 1  # not one repeated token
    assert texts[True] == texts[False]


def test_mmlu_runner_through_the_server_api(ckpt, tmp_path):
    """run_mmlu.py against the fork's HTTP server on a small local CSV: parses the
    CSV, scores A/B/C/D by token logprob, reports per-subject accuracy, and is
    deterministic. (Random weights: this checks the runner, not the model.)"""
    import json
    import subprocess
    import time
    import urllib.request

    data = tmp_path / "mmlu"
    data.mkdir()
    rows = [
        ["t20 t21 t22 ?", "t30", "t31", "t32", "t33", "A"],
        ["t40 t41 ?", "t50", "t51", "t52", "t53", "C"],
        ["t60 t61 t62 t63 ?", "t70", "t71", "t72", "t73", "D"],
    ]
    (data / "algebra_test.csv").write_text("\n".join(",".join(r) for r in rows) + "\n")
    (data / "anatomy_test.csv").write_text("question,A,B,C,D,answer\n" + ",".join(rows[1]) + "\n")
    port = 30177
    env = dict(os.environ, SGLANG_DUMMY_WEIGHTS_AT_SCALE="1", CUDA_VISIBLE_DEVICES="")
    server = subprocess.Popen(
        [sys.executable, "-m", "sglang.launch_server", "--model-path", ckpt, "--device", "cpu",
         "--attention-backend", "torch_native", "--dtype", "float32", "--load-format", "dummy",
         "--max-total-tokens", "8192", "--port", str(port), "--log-level", "error",
         "--kv-sharing-fast-prefill"],
        env=env,
    )
    try:
        for _ in range(300):
            assert server.poll() is None, "server exited"
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except Exception:
                time.sleep(1)
        runner = os.path.join(ROOT, "benchmark", "yoco_gemma4", "run_mmlu.py")
        outs = []
        for i in range(2):
            out = tmp_path / f"mmlu{i}.json"
            subprocess.run(
                [sys.executable, runner, "--csv", str(data), "--url", f"http://127.0.0.1:{port}",
                 "--out", str(out)],
                check=True, env=env, stdout=subprocess.DEVNULL,
            )
            outs.append(json.loads(out.read_text()))
    finally:
        server.terminate()
        server.wait(timeout=60)
    res = outs[0]
    assert res["questions"] == 4
    assert set(res["per_subject"]) == {"algebra", "anatomy"}
    assert res["per_subject"]["algebra"]["questions"] == 3
    assert all(p in "ABCD" for p in res["predictions"])
    assert res["correct"] == sum(p == r[5] for p, r in zip(res["predictions"], rows + [rows[1]]))
    assert outs[1]["predictions"] == res["predictions"]


def test_mmlu_runner_rejects_a_bad_csv(tmp_path):
    import subprocess

    bad = tmp_path / "bad.csv"
    bad.write_text("q,a,b,c,d,E\n")
    runner = os.path.join(ROOT, "benchmark", "yoco_gemma4", "run_mmlu.py")
    r = subprocess.run([sys.executable, runner, "--csv", str(bad), "--tokenizer", "x"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "answer 'E' is not one of A/B/C/D" in r.stderr
