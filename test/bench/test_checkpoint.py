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
