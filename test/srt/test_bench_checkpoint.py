"""The benchmark checkpoint (config + synthetic tokenizer, dummy weights at scale)
is served by the fork on CPU: text in, text out, lengths kept, YOCO on = off. Its
multimodal layout (Gemma4ForConditionalGeneration + processor files) loads in
transformers and is served too, text and image prompts through the processor."""

import os
import random
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "yoco_gemma4"))

from make_checkpoint import (  # noqa: E402
    MM_TOKENS,
    SPECIAL_TOKENS,
    make_checkpoint,
    make_multimodal_checkpoint,
)

pytestmark = pytest.mark.stack("bench-support")


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_checkpoint(str(tmp_path_factory.mktemp("bench_ckpt")), "tiny")


@pytest.fixture(scope="module")
def mm_ckpt(tmp_path_factory):
    return make_multimodal_checkpoint(str(tmp_path_factory.mktemp("bench_mm_ckpt")), "tiny")


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
    from cpu_engine import YOCO, start_engine

    monkeypatch.setenv("SGLANG_DUMMY_WEIGHTS_AT_SCALE", "1")
    prompt = " ".join(f"t{i}" for i in range(200, 260))
    texts = {}
    for on in (False, True):
        eng = start_engine(
            ckpt, load_format="dummy", skip_tokenizer_init=False, **(YOCO if on else {})
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
         "--kv-sharing-fast-prefill", "--kv-sharing-fast-prefill-min-tokens", "0"],
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


def _image(path, seed, size=(96, 144)):
    import numpy as np
    from PIL import Image

    rgb = np.random.RandomState(seed).randint(0, 256, size=(*size, 3), dtype=np.uint8)
    Image.fromarray(rgb).save(path)
    return str(path)


@pytest.mark.parametrize("variant", ["tiny", "e4b", "e2b"])
def test_multimodal_checkpoint_loads_in_transformers(variant, tmp_path):
    """The --multimodal layout, as transformers reads a downloaded google/gemma-4-E*B-it:
    a Gemma4ForConditionalGeneration config with towers, the variant's text config, and
    a Gemma4Processor whose tokenizer holds each multimodal token at the config's id."""
    from transformers import (
        AutoConfig,
        AutoProcessor,
        AutoTokenizer,
        Gemma4AudioConfig,
        Gemma4Config,
        Gemma4VisionConfig,
    )

    from checkpoints import text_config

    path = make_multimodal_checkpoint(str(tmp_path / variant), variant)
    want_text = text_config(variant)
    cfg = AutoConfig.from_pretrained(path)
    assert isinstance(cfg, Gemma4Config) and cfg.model_type == "gemma4"
    assert cfg.architectures == ["Gemma4ForConditionalGeneration"]
    for k in ("num_hidden_layers", "num_kv_shared_layers", "hidden_size", "vocab_size", "layer_types"):
        assert getattr(cfg.text_config, k) == want_text[k], k
    assert cfg.vision_config.model_type == "gemma4_vision"
    assert cfg.audio_config.model_type == "gemma4_audio"
    if variant == "tiny":
        assert cfg.vision_config.num_hidden_layers == cfg.audio_config.num_hidden_layers == 1
    else:  # towers and token ids: transformers' defaults
        assert cfg.vision_config.to_dict() == Gemma4VisionConfig().to_dict()
        assert cfg.audio_config.to_dict() == Gemma4AudioConfig().to_dict()
        for _, field in MM_TOKENS.values():
            assert getattr(cfg, field) == getattr(Gemma4Config(), field), field

    tok = AutoTokenizer.from_pretrained(path)
    assert len(tok) == want_text["vocab_size"]
    ids = {field: getattr(cfg, field) for _, field in MM_TOKENS.values()}
    assert len(set(ids.values())) == len(ids) and max(ids.values()) < want_text["vocab_size"]
    for name, (token, field) in MM_TOKENS.items():
        assert tok.convert_tokens_to_ids(token) == ids[field], token
        assert getattr(tok, name) == token
    assert tok.convert_tokens_to_ids("<end_of_turn>") == SPECIAL_TOKENS["<end_of_turn>"]

    proc = AutoProcessor.from_pretrained(path)
    assert type(proc).__name__ == "Gemma4Processor"
    assert (proc.image_token_id, proc.video_token_id, proc.audio_token_id) == (
        cfg.image_token_id, cfg.video_token_id, cfg.audio_token_id)
    assert proc.image_processor.patch_size == cfg.vision_config.patch_size
    assert proc.image_processor.pooling_kernel_size == cfg.vision_config.pooling_kernel_size
    assert len(proc.tokenizer) == want_text["vocab_size"]  # the processor added no token
    chat = proc.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "t7"}]}],
        tokenize=False, add_generation_prompt=True)
    assert "<|image|>" in chat and chat.startswith("<bos>")
    if variant == "tiny":
        from PIL import Image

        img = Image.open(_image(tmp_path / "img.png", 0))
        out = proc(text=["t7 <|image|> t8"], images=[[img]])["input_ids"][0]
        n = out.count(cfg.image_token_id)
        assert n > 0
        assert out == [7, cfg.boi_token_id] + [cfg.image_token_id] * n + [cfg.eoi_token_id, 8]


def test_multimodal_variants_only():
    import subprocess

    script = os.path.join(ROOT, "benchmark", "yoco_gemma4", "make_checkpoint.py")
    r = subprocess.run([sys.executable, script, "/nonexistent", "--variant", "e4b-front", "--multimodal"],
                       capture_output=True, text=True)
    assert r.returncode != 0 and "--multimodal is for" in r.stderr


def test_multimodal_served_from_text_and_image(mm_ckpt, tmp_path, monkeypatch):
    """The tiny --multimodal checkpoint served by the fork on CPU (dummy weights at
    scale, tokenizer and processor loaded by SGLang): a text prompt and an image
    prompt (HF processor expansion, vision tower on CPU) give the same greedy text with
    YOCO on and off, and the image changes the output. The fast (torchvision) image
    processor stays on CPU with --device cpu (step fast-image-processor-on-cpu; stock put it on cuda:N)."""
    from PIL import Image
    from transformers import AutoProcessor

    from cpu_engine import YOCO, start_engine

    monkeypatch.setenv("SGLANG_DUMMY_WEIGHTS_AT_SCALE", "1")
    text_prompt = " ".join(f"t{i}" for i in range(200, 260))
    image_prompt = "t7 <|image|> t8"
    images = [_image(tmp_path / f"img{seed}.png", seed) for seed in (0, 1)]
    greedy = {"max_new_tokens": 8, "temperature": 0}
    results = {}
    for on in (False, True):
        eng = start_engine(mm_ckpt, load_format="dummy", skip_tokenizer_init=False,
                           **(YOCO if on else {}))
        try:
            outs = [eng.generate(prompt=text_prompt, sampling_params=greedy)]
            outs += [eng.generate(prompt=image_prompt, image_data=img, sampling_params=greedy)
                     for img in images]
        finally:
            eng.shutdown()
        results[on] = outs
    text_out, img0_out, img1_out = results[False]
    assert text_out["meta_info"]["prompt_tokens"] == 60
    words = text_out["text"].split()
    assert len(words) >= 4 and len(set(words)) > 1  # not one repeated token
    proc = AutoProcessor.from_pretrained(mm_ckpt)
    expanded = proc(text=[image_prompt], images=[[Image.open(images[0])]])["input_ids"][0]
    assert img0_out["meta_info"]["prompt_tokens"] == len(expanded) > 3
    assert img0_out["meta_info"]["completion_tokens"] == 8
    assert img0_out["text"] != img1_out["text"]  # the vision tower's output is used
    assert [o["text"] for o in results[True]] == [o["text"] for o in results[False]]


def test_trace_summary_counts_kernels_launches_and_host_ops(tmp_path):
    """The profile summary the benchmarks print (trace_summary.py) on a small
    Chrome trace as the torch profiler writes it."""
    import gzip
    import json

    from trace_summary import summarize

    ev = [
        {"ph": "X", "cat": "kernel", "name": "gemm", "dur": 300.0},
        {"ph": "X", "cat": "kernel", "name": "gemm", "dur": 100.0},
        {"ph": "X", "cat": "kernel", "name": "attn", "dur": 600.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "dur": 5.0},
        {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernelEx", "dur": 5.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "dur": 9.0},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 40.0},
        {"ph": "X", "cat": "user_annotation", "name": "forward", "dur": 2000.0},
        {"ph": "i", "cat": "kernel", "name": "instant, not a span", "dur": 1e9},
    ]
    path = tmp_path / "x.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": ev}, f)
    s = summarize(str(path))
    assert (s["kernels"], s["kernel_ms"], s["launches"], s["cpu_ops"]) == (3, 1.0, 2, 1)
    assert s["top_kernels"] == [["attn", 0.6, 1], ["gemm", 0.4, 2]]
    assert s["spans"] == [["forward", 2.0, 1]]
    assert s["top_runtime_calls"][0] == ["cudaMemcpyAsync", 0.009, 1]


def test_forward_bench_times_one_pass_with_the_fast_path_on(tmp_path):
    """forward_bench.py (one prefill pass in process, sglang.bench_one_batch) on the
    tiny model on CPU: a row per point with every mode, each mode's passes pooled over
    the rounds, and the on-all runs take the fast path, the legacy one through its
    bench-only plan hook (the tiny vocabulary is widened: bench_one_batch draws ids
    below 10000)."""
    import json
    import subprocess

    out = tmp_path / "fb.json"
    extra = (
        "--device cpu --attention-backend torch_native --dtype float32 "
        "--mem-fraction-static 0.05 --max-total-tokens 8192 --log-level debug "
        '--json-model-override-args {"vocab_size":16384,"vocab_size_per_layer_input":16384}'
    )
    env = dict(os.environ, YOCO_CKPT_DIR=str(tmp_path / "ckpt"), CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmark", "yoco_gemma4", "forward_bench.py"),
         str(out), "--variant", "tiny", "--modes", "off,on-all-legacy,on-all", "--batches", "1,4",
         "--lens", "64", "--repeats", "1", "--rounds", "2", "--extra", extra],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert [(r["len"], r["batch"]) for r in res["table"]] == [(64, 1), (64, 4)]
    assert all(r["off_ms"] > 0 and r["on-all_ms"] > 0 and r["on-all-legacy_ms"] > 0 for r in res["table"])
    assert all(len(ts) == 2 for m in res["raw_s"].values() for ts in m.values())  # 1 x 2 rounds
    log = proc.stdout + proc.stderr
    assert log.count("KV-sharing fast prefill: back half on 4 of 256 tokens") >= 4  # on-all, both
    assert log.count("BENCH_YOCO_LEGACY_PLAN:") == 2  # one per legacy process, none elsewhere


def test_trace_diff_ranks_host_time_added_inside_the_step(tmp_path):
    """trace_diff.py: per-name host time inside the last step span, B against A,
    with process addresses dropped from names."""
    import gzip
    import json

    from trace_diff import diff, host_time_by_name

    def trace(name, events):
        path = tmp_path / name
        with gzip.open(path, "wt") as f:
            json.dump({"traceEvents": events}, f)
        return str(path)

    step = {"ph": "X", "cat": "user_annotation", "name": "step[EXTEND bs=8]", "ts": 100, "dur": 1000}
    a = trace("a.json.gz", [
        step,
        {"ph": "X", "cat": "python_function", "name": "layer.py(1): forward", "ts": 200, "dur": 500},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 5000, "dur": 900},  # outside the step
    ])
    b = trace("b.json.gz", [
        step,
        {"ph": "X", "cat": "python_function", "name": "layer.py(1): forward", "ts": 200, "dur": 600},
        {"ph": "X", "cat": "python_function", "name": "yoco.py(9): plan", "ts": 150, "dur": 300},
        {"ph": "X", "cat": "python_function", "name": "<built-in method empty at 0x7f00>", "ts": 160, "dur": 50},
    ])
    ta, tb = host_time_by_name(a), host_time_by_name(b)
    assert "aten::mm" not in ta and "<built-in method empty>" in tb
    rows = diff(ta, tb)
    assert [r[3] for r in rows[:2]] == ["yoco.py(9): plan", "layer.py(1): forward"]
    assert rows[0][0] == 0.3 and rows[1][1] == (0.5, 1) and rows[1][2] == (0.6, 1)


def test_trace_diff_gpu_ranks_kernel_time_added(tmp_path):
    """trace_diff.py --gpu: GPU kernels summed by name over the whole trace (no span
    bounds them), B against A; host events do not count. Each trace's GPU idle time is
    its kernel/memcpy span minus the union of their intervals."""
    import gzip
    import json
    import subprocess

    from trace_diff import diff, gpu_busy_idle, gpu_time_by_name

    def trace(name, events):
        path = tmp_path / name
        with gzip.open(path, "wt") as f:
            json.dump({"traceEvents": events}, f)
        return str(path)

    def kernel(name, ts, dur):
        return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur}

    step = {"ph": "X", "cat": "user_annotation", "name": "step[EXTEND bs=1]", "ts": 0, "dur": 100}
    a = trace("a.json.gz", [step, kernel("gemm", 50, 400), kernel("norm", 500, 20)])
    b = trace("b.json.gz", [
        step, kernel("gemm", 50, 400), kernel("norm", 500, 20), kernel("norm", 900, 30),
        kernel("stage1", 2000, 250),  # long after the step span
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 10, "dur": 5000},
        # overlaps the gemm's last 10 us: busy grows by 10 us, not 20
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 440, "dur": 20},
    ])
    ta, tb = gpu_time_by_name(a), gpu_time_by_name(b)
    assert "aten::mm" not in tb and tb["norm"][1] == 2 and tb["norm"][0] == pytest.approx(0.05)
    rows = diff(ta, tb)
    assert [r[3] for r in rows] == ["stage1", "norm", "gemm"]
    assert rows[0][0] == pytest.approx(0.25) and rows[0][1] == (0.0, 0) and rows[2][0] == 0.0
    assert gpu_busy_idle(a) == pytest.approx((0.47, 0.42, 0.05))
    assert gpu_busy_idle(b) == pytest.approx((2.2, 0.71, 1.49))
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmark", "yoco_gemma4", "trace_diff.py"), a, b, "--gpu"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "A GPU span 0.470 ms, busy 0.420 ms, idle 0.050 ms"
    assert lines[1] == "B GPU span 2.200 ms, busy 0.710 ms, idle 1.490 ms"
    assert lines[2] == "A 0.420 ms in 2 kernels, B 0.700 ms in 4"
    assert lines[3].endswith("stage1") and lines[3].split()[0] == "0.250"


def test_trace_diff_steps_finds_the_late_launch(tmp_path):
    """trace_diff.py --gpu --steps: steps cut at each marker kernel; per step its period,
    busy time and largest idle gap with the kernels on either side (where the host was
    late to launch)."""
    import gzip
    import json

    from trace_diff import step_gaps

    def kernel(name, ts, dur, cat="kernel"):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}

    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": [
            kernel("argmax ArgMaxOps", 0, 10), kernel("prep", 12, 3), kernel("Memcpy DtoD", 16, 1, "gpu_memcpy"),
            kernel("graph_first", 20, 79),
            kernel("argmax ArgMaxOps", 100, 10), kernel("prep", 112, 3), kernel("Memcpy DtoD", 116, 1, "gpu_memcpy"),
            kernel("graph_first", 417, 82),  # launched 300 us late
            kernel("argmax ArgMaxOps", 500, 10), kernel("graph_first", 512, 88),
            kernel("argmax ArgMaxOps", 900, 10),  # the next step's first kernel 300 us late
            {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": 120, "dur": 290},
        ]}, f)
    rows = step_gaps(str(path), "ArgMaxOps")
    assert len(rows) == 3
    assert rows[0] == (100, 93, 3, "Memcpy DtoD", "graph_first")
    assert rows[1] == (400, 96, 300, "Memcpy DtoD", "graph_first")
    assert rows[2] == (400, 98, 300, "graph_first", "argmax ArgMaxOps")


def test_trace_diff_launches_times_the_host_lead_and_the_gpu_wait(tmp_path):
    """trace_diff.py --gpu --launches: per cudaGraphLaunch, the host call's time, how far
    ahead of the GPU's queued work the host entered it, and the GPU's wait for the graph's
    first kernel (matched by correlation id)."""
    import gzip
    import json
    import subprocess

    from trace_diff import graph_launches

    def gpu(name, ts, dur, corr, cat="kernel"):
        return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}

    def launch(ts, dur, corr):
        return {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": ts, "dur": dur,
                "args": {"correlation": corr}}

    path = tmp_path / "t.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": [
            gpu("prev_graph", 0, 1000, 1),
            gpu("Memcpy DtoD", 1000, 5, 2, "gpu_memcpy"),
            launch(200, 300, 3),  # host 805 us ahead, 300 us call: on time
            gpu("graph_a", 1010, 500, 3), gpu("graph_a_2", 1510, 100, 3),
            gpu("copy", 1610, 10, 4),
            launch(1400, 400, 5),  # 220 us ahead, 400 us call: the GPU waits 180 us
            gpu("graph_b", 1800, 100, 5),
            launch(2000, 50, 6),  # its kernels are not in the trace: skipped
        ]}, f)
    rows = graph_launches(str(path))
    assert rows == [(300, 805, 5), (400, 220, 180)]
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmark", "yoco_gemma4", "trace_diff.py"), str(path), str(path),
         "--gpu", "--launches", "--top", "0"],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = [line for line in proc.stdout.splitlines() if "graph launch" in line]
    assert out[1] == "A graph launch   400.0 us, host ahead by    220.0 us, GPU waited   180.0 us"
    assert len(out) == 4 and out[3].startswith("B ")


def test_gc_log_site_logs_collections_and_serve_mtp_sums_a_window(tmp_path):
    """jit_log_site with BENCH_GC_LOG (serve_mtp.py --gc-log): a process started with it
    on PYTHONPATH logs its generation-1/2 collections one a line and its short
    generation-0 ones in blocks of 200; gc_summary counts them inside a time window."""
    import subprocess
    import time

    sys.path.insert(0, os.path.join(ROOT, "benchmark", "frozen_kv_mtp"))
    from serve_mtp import gc_summary

    log = tmp_path / "gc.log"
    site = os.path.join(ROOT, "benchmark", "frozen_kv_mtp", "jit_log_site")
    script = (
        "import gc, time\n"
        "gc.disable()\n"  # explicit collections only
        "for _ in range(3): gc.collect(1)\n"
        "gc.collect(2)\n"
        "for _ in range(400): gc.collect(0)\n"
        "time.sleep(1.1)\n"
        "gc.collect(1)\n"  # past a second: this one flushes what the 20-line rule held
    )
    t0 = time.time()
    env = dict(os.environ, BENCH_GC_LOG=str(log), PYTHONPATH=site)
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = log.read_text().splitlines()
    full = [line.split() for line in lines if line.startswith("gc ")]
    blocks = [line.split() for line in lines if line.startswith("gc0 ")]
    assert [int(f[4]) for f in full if int(f[4]) > 0] == [1, 1, 1, 2, 1]
    assert all(int(f[2]) == int(blocks[0][2]) for f in full + blocks)  # one pid
    # gc.collect(0) x 400 -> two blocks of 200 (any of them over 50 us is logged alone instead)
    n0 = sum(int(b[4]) for b in blocks) + sum(1 for f in full if f[4] == "0")
    assert len(blocks) >= 1 and n0 == 400
    s = gc_summary(str(log), t0, time.time() + 1)
    (summary,) = s.values()
    assert summary["count"] == [400, 4, 1]
    assert summary["max_us"] > 0 and all(p >= 0 for p in summary["pause_ms"])
    assert gc_summary(str(log), t0 - 100, t0 - 50) == {}


def test_verify_kernel_bench_variants_agree_on_cpu(tmp_path):
    """verify_kernel_bench.py (FROZEN_KV_MTP verify attention: extend kernel vs split-KV
    variants) on its tiny shape under Triton's interpreter: one row per point, and the
    split-KV, decode-row and grouped (keys read once a request) variants compute the
    extend kernel's attention, and so do the grouped kernel's launch alternatives
    (one query head a program; 16 splits)."""
    import json
    import subprocess

    out = tmp_path / "vk.json"
    proc = subprocess.run(
        [sys.executable, os.path.join(ROOT, "benchmark", "frozen_kv_mtp", "verify_kernel_bench.py"),
         str(out), "--shape", "tiny", "--batches", "2", "--contexts", "5,20", "--dtype", "float32",
         "--grouped-alt", "h1,s16"],
        env=dict(os.environ, TRITON_INTERPRET="1"), capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert [(r["batch"], r["context"]) for r in rows] == [(2, 5), (2, 20)]
    diffs = [v for r in rows for k, v in r.items() if k.endswith("_maxdiff")]
    assert len(diffs) == 20 and max(diffs) < 1e-5
    assert all(f"{kind}_{v}_maxdiff" in r for r in rows for kind in ("sliding", "full")
               for v in ("grouped", "grouped_h1", "grouped_s16"))


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


def test_compare_outputs_of_two_code_versions(tmp_path):
    """compare_outputs.py: request-by-request identical ids and verify counts between two
    mtp_check.py results, the first differing token of each mismatch, and a refusal
    (exit 1) when the two were not made from the same prompts."""
    import json
    import subprocess

    def result(ids, verify, prompts=3):
        runs = [{"ids": i, "verify_ct": v, "accept_len": 1.0} for i, v in zip(ids, verify)]
        summary = {"prompts": prompts, "prompt_len_min": 1, "prompt_len_max": 9}
        return {"summary": summary, "off": runs, "on": runs}

    script = os.path.join(ROOT, "benchmark", "frozen_kv_mtp", "compare_outputs.py")
    base, new, other = tmp_path / "base.json", tmp_path / "new.json", tmp_path / "other.json"
    base.write_text(json.dumps(result([[1, 2, 3], [4, 5], [6]], [2, 1, 1])))
    new.write_text(json.dumps(result([[1, 2, 3], [4, 7], [6]], [2, 2, 1])))
    other.write_text(json.dumps(result([[1, 2, 3], [4, 5], [6]], [2, 1, 1], prompts=4)))
    proc = subprocess.run([sys.executable, script, str(base), str(new)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.split("SUMMARY ", 1)[1])
    assert out["identical_ids"] == 2 and out["identical_verify_steps"] == 2
    assert out["first_differing_token"] == [1] and out["same_prompts"]
    proc = subprocess.run([sys.executable, script, str(base), str(other)], capture_output=True, text=True)
    assert proc.returncode == 1


def test_compare_parity_results_of_two_code_versions(tmp_path):
    """compare_outputs.py --run on_a: YOCO-on ids and first-token top-5 logprobs of
    two parity_check.py --on-only results, request by request and to the bit; the
    first differing token of each mismatch; exit 1 for results of other prompts."""
    import json
    import subprocess

    def result(runs, prompts=3):
        summary = {"prompts": prompts, "prompt_len_min": 1, "prompt_len_max": 900}
        return {"summary": summary, "on_a": [{"ids": i, "top5": t} for i, t in runs]}

    top = [[-0.25, 7], [-1.5, 9]]
    script = os.path.join(ROOT, "benchmark", "frozen_kv_mtp", "compare_outputs.py")
    base, new, other = tmp_path / "base.json", tmp_path / "new.json", tmp_path / "other.json"
    base.write_text(json.dumps(result([([1, 2, 3], top), ([4, 5], top), ([6], top)])))
    new.write_text(json.dumps(result([([1, 2, 3], top), ([4, 8], top), ([6], [[-0.25000001, 7], [-1.5, 9]])])))
    other.write_text(json.dumps(result([([1, 2, 3], top)], prompts=1)))
    run = ["--run", "on_a"]
    proc = subprocess.run([sys.executable, script, str(base), str(new), *run], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.split("SUMMARY ", 1)[1])
    assert (out["identical_ids"], out["identical_top5"]) == (2, 2)
    assert out["first_differing_token"] == [1] and out["same_prompts"]
    proc = subprocess.run([sys.executable, script, str(base), str(other), *run], capture_output=True, text=True)
    assert proc.returncode == 1


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
