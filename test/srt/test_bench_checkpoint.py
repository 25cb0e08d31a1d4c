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
