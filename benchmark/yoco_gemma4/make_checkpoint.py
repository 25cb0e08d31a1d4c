"""Write a text-only Gemma-4 checkpoint directory that SGLang serves without weights.

    python benchmark/yoco_gemma4/make_checkpoint.py OUT_DIR --variant e4b

Contents: config.json (Google's released text config as a `Gemma4ForCausalLM`),
generation_config.json, and a synthetic tokenizer with the real vocabulary size
and Gemma's special tokens (one word per id, so any id sequence survives a
decode/encode round trip: bench_serving's random prompts keep their length).
No weights: serve it with `--load-format dummy` and SGLANG_DUMMY_WEIGHTS_AT_SCALE=1
(the fork's seeded weights at a trained model's scale).

Not covered yet: the multimodal `Gemma4ForConditionalGeneration` layout (vision and
audio tower configs and processor files are not available here).
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoints import text_config  # noqa: E402

# Gemma's special tokens at the ids Gemma tokenizers use for them.
SPECIAL_TOKENS = {
    "<pad>": 0,
    "<eos>": 1,
    "<bos>": 2,
    "<unk>": 3,
    "<mask>": 4,
    "<start_of_turn>": 105,
    "<end_of_turn>": 106,
}
# Plain words with their own ids, so prompts such as MMLU's "A. ...\nAnswer:" and
# the choice letters tokenize to distinct tokens (run_mmlu.py scores A/B/C/D).
WORDS = {"A": 65, "B": 66, "C": 67, "D": 68, "Answer:": 69}
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn> "
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }} {{ m['content'] }} "
    "<end_of_turn> {% endfor %}{% if add_generation_prompt %}<start_of_turn> model {% endif %}"
)


def word(i: int) -> str:
    return f"t{i}"


def write_tokenizer(path: str, vocab_size: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {word(i): i for i in range(vocab_size)}
    for tok, i in {**SPECIAL_TOKENS, **WORDS}.items():
        if i < vocab_size:
            del vocab[word(i)]
            vocab[tok] = i
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins with spaces
    tk.add_special_tokens([t for t, i in SPECIAL_TOKENS.items() if i < vocab_size])
    tk.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<bos>",
                "eos_token": "<eos>",
                "pad_token": "<pad>",
                "unk_token": "<unk>",
                "add_bos_token": False,
                "model_max_length": 131072,
                "chat_template": CHAT_TEMPLATE,
            },
            f,
            indent=1,
        )


def make_checkpoint(path: str, variant: str) -> str:
    os.makedirs(path, exist_ok=True)
    cfg = text_config(variant)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump(
            {
                "bos_token_id": cfg["bos_token_id"],
                "eos_token_id": [cfg["eos_token_id"], SPECIAL_TOKENS["<end_of_turn>"]],
                "pad_token_id": cfg["pad_token_id"],
            },
            f,
            indent=1,
        )
    write_tokenizer(path, cfg["vocab_size"])
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--variant", default="e4b", choices=["e4b", "e2b", "e4b-front", "e2b-front", "tiny"])
    a = ap.parse_args()
    print(make_checkpoint(a.out, a.variant))


if __name__ == "__main__":
    main()
