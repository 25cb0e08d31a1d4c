"""Write a Gemma-4 checkpoint directory that SGLang serves without weights.

    python benchmark/yoco_gemma4/make_checkpoint.py OUT_DIR --variant e4b
    python benchmark/yoco_gemma4/make_checkpoint.py OUT_DIR --variant e4b --multimodal

Contents: config.json (Google's released text config as a `Gemma4ForCausalLM`),
generation_config.json, and a synthetic tokenizer with the real vocabulary size
and Gemma's special tokens (one word per id, so any id sequence survives a
decode/encode round trip: bench_serving's random prompts keep their length).
No weights: serve it with `--load-format dummy` and SGLANG_DUMMY_WEIGHTS_AT_SCALE=1
(the fork's seeded weights at a trained model's scale).

--multimodal (e4b, e2b, tiny) writes the layout of the released
google/gemma-4-E4B-it / gemma-4-E2B-it instead: a `Gemma4ForConditionalGeneration`
config (model_type gemma4) with the same text_config plus vision and audio towers,
processor files (Gemma4Processor: image processor, video processor, audio feature
extractor) and a tokenizer that also holds the multimodal special tokens at the ids
the config names. The released tower configs and processor files are not available
here: the towers, processors and token ids are transformers 5.x defaults
(Gemma4VisionConfig(), Gemma4AudioConfig(), Gemma4Config's token ids), not the
released files. 'tiny' (the CPU test model) gets 1-layer towers a few units wide and
token ids inside its 512-word vocabulary.
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


# Multimodal special tokens: tokenizer attribute -> (token, Gemma4Config field of its id).
# The token strings are Gemma-4's (SGLang's Gemma-4 processor matches them literally).
MM_TOKENS = {
    "boi_token": ("<|image>", "boi_token_id"),
    "eoi_token": ("<image|>", "eoi_token_id"),
    "image_token": ("<|image|>", "image_token_id"),
    "video_token": ("<|video|>", "video_token_id"),
    "boa_token": ("<|audio>", "boa_token_id"),
    "eoa_token": ("<audio|>", "eoa_token_index"),
    "audio_token": ("<|audio|>", "audio_token_id"),
}
# The tiny model's vocabulary has 512 words: its multimodal tokens live at its top.
TINY_MM_TOKEN_IDS = {
    "boi_token_id": 500,
    "eoi_token_id": 501,
    "image_token_id": 502,
    "video_token_id": 503,
    "boa_token_id": 504,
    "eoa_token_index": 505,
    "audio_token_id": 506,
}
# Towers for 'tiny': one layer, a few units wide (CPU init in well under a second).
# Patch and pooling sizes stay at the defaults the image processor also uses.
TINY_VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                   num_key_value_heads=2, head_dim=8, position_embedding_size=1024)
TINY_AUDIO = dict(hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                  subsampling_conv_channels=[4, 4], output_proj_dims=16)
MM_VARIANTS = ("e4b", "e2b", "tiny")
# Chat template of the multimodal checkpoint: content is a string or a list of
# {"type": "text" | "image" | "audio" | "video", ...} items (OpenAI-style chat).
MM_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn> "
    "{{ 'model' if m['role'] == 'assistant' else m['role'] }} "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for c in m['content'] %}"
    "{% if c['type'] == 'text' %}{{ c['text'] }}"
    "{% elif c['type'] in ('image', 'image_url') %}<|image|>"
    "{% elif c['type'] in ('audio', 'audio_url', 'input_audio') %}<|audio|>"
    "{% elif c['type'] in ('video', 'video_url') %}<|video|>{% endif %} {% endfor %}{% endif %} "
    "<end_of_turn> {% endfor %}{% if add_generation_prompt %}<start_of_turn> model {% endif %}"
)


def word(i: int) -> str:
    return f"t{i}"


def write_tokenizer(path: str, vocab_size: int, mm_token_ids: dict = None) -> None:
    """mm_token_ids (Gemma4Config field -> id): also put the multimodal special
    tokens at those ids and name them in tokenizer_config.json (tokenizer.image_token,
    image_token_id, boi_token, ... as Gemma4Processor reads them)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    specials = dict(SPECIAL_TOKENS)
    if mm_token_ids is not None:
        specials.update({tok: mm_token_ids[field] for tok, field in MM_TOKENS.values()})
    vocab = {word(i): i for i in range(vocab_size)}
    for tok, i in {**specials, **WORDS}.items():
        if i < vocab_size:
            del vocab[word(i)]
            vocab[tok] = i
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tk.decoder = decoders.WordPiece(prefix="##", cleanup=False)  # joins with spaces
    tk.add_special_tokens([t for t, i in specials.items() if i < vocab_size])
    tk.save(os.path.join(path, "tokenizer.json"))
    tok_cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<bos>",
        "eos_token": "<eos>",
        "pad_token": "<pad>",
        "unk_token": "<unk>",
        "add_bos_token": False,
        "model_max_length": 131072,
        "chat_template": CHAT_TEMPLATE,
    }
    if mm_token_ids is not None:
        tok_cfg.update({name: tok for name, (tok, _) in MM_TOKENS.items()})
        tok_cfg["processor_class"] = "Gemma4Processor"
        del tok_cfg["chat_template"]  # MM_CHAT_TEMPLATE: chat_template.jinja (processor's)
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump(tok_cfg, f, indent=1)


def mm_token_ids(variant: str) -> dict:
    """Gemma4Config field -> token id: transformers' Gemma4Config defaults (which are
    Gemma's ids, inside the real 262144-word vocabulary), or the tiny model's."""
    if variant == "tiny":
        return dict(TINY_MM_TOKEN_IDS)
    from transformers import Gemma4Config

    defaults = Gemma4Config()
    return {field: getattr(defaults, field) for _, field in MM_TOKENS.values()}


def multimodal_config(variant: str) -> dict:
    """config.json of a `Gemma4ForConditionalGeneration` checkpoint: the variant's text
    config plus vision and audio towers. Towers from transformers 5.x defaults
    (Gemma4VisionConfig(), Gemma4AudioConfig()), not the released files; shrunk for
    'tiny'."""
    import transformers
    from transformers import Gemma4AudioConfig, Gemma4VisionConfig

    if variant not in MM_VARIANTS:
        raise ValueError(f"--multimodal is for {', '.join(MM_VARIANTS)}, not {variant!r}")
    text = text_config(variant)
    text.pop("architectures")
    dtype = text.pop("torch_dtype")
    tiny = variant == "tiny"
    towers = {}
    for key, cls, small in (("vision_config", Gemma4VisionConfig, TINY_VISION),
                            ("audio_config", Gemma4AudioConfig, TINY_AUDIO)):
        full = cls(**(small if tiny else {})).to_dict()
        # the tower's own fields (as in a released config), not PreTrainedConfig's
        towers[key] = {k: full[k] for k in ["model_type", *cls.__annotations__] if k in full}
    return {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": text,
        **towers,
        **mm_token_ids(variant),
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "torch_dtype": dtype,
        # as save_pretrained writes it; without it transformers' tokenizer loader
        # suspects an old Mistral tokenizer and warns
        "transformers_version": transformers.__version__,
    }


def write_processor(path: str, cfg: dict) -> None:
    """processor_config.json and chat_template.jinja from transformers' Gemma-4
    processor classes at their defaults (patch/pooling sizes from the vision tower),
    around the tokenizer already written to `path` (its files are kept as written)."""
    import shutil
    import tempfile

    from transformers import (
        AutoTokenizer,
        Gemma4AudioFeatureExtractor,
        Gemma4ImageProcessor,
        Gemma4Processor,
        Gemma4VideoProcessor,
    )

    vision = cfg["vision_config"]
    patches = dict(patch_size=vision["patch_size"], pooling_kernel_size=vision["pooling_kernel_size"])
    proc = Gemma4Processor(
        feature_extractor=Gemma4AudioFeatureExtractor(),
        image_processor=Gemma4ImageProcessor(**patches),
        tokenizer=AutoTokenizer.from_pretrained(path),
        video_processor=Gemma4VideoProcessor(**patches),
        chat_template=MM_CHAT_TEMPLATE,
    )
    want = {cfg[field] for _, field in MM_TOKENS.values()}
    got = {proc.image_token_id, proc.video_token_id, proc.audio_token_id,
           *proc.tokenizer.convert_tokens_to_ids([proc.boi_token, proc.eoi_token, proc.boa_token, proc.eoa_token])}
    if got != want:
        raise RuntimeError(f"processor token ids {sorted(got)} != config's {sorted(want)}")
    with tempfile.TemporaryDirectory() as tmp:
        proc.save_pretrained(tmp)
        for name in os.listdir(tmp):
            if not name.startswith(("tokenizer", "special_tokens_map")):
                shutil.copy(os.path.join(tmp, name), os.path.join(path, name))


def make_checkpoint(path: str, variant: str, multimodal: bool = False) -> str:
    os.makedirs(path, exist_ok=True)
    cfg = multimodal_config(variant) if multimodal else text_config(variant)
    text = cfg["text_config"] if multimodal else cfg
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    with open(os.path.join(path, "generation_config.json"), "w") as f:
        json.dump(
            {
                "bos_token_id": text["bos_token_id"],
                "eos_token_id": [text["eos_token_id"], SPECIAL_TOKENS["<end_of_turn>"]],
                "pad_token_id": text["pad_token_id"],
            },
            f,
            indent=1,
        )
    write_tokenizer(path, text["vocab_size"], mm_token_ids(variant) if multimodal else None)
    if multimodal:
        write_processor(path, cfg)
    return path


def make_multimodal_checkpoint(path: str, variant: str) -> str:
    """The `Gemma4ForConditionalGeneration` layout of google/gemma-4-E4B-it / E2B-it
    (variant 'e4b', 'e2b', or the CPU test model 'tiny')."""
    return make_checkpoint(path, variant, multimodal=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out")
    ap.add_argument("--variant", default="e4b", choices=["e4b", "e2b", "e4b-front", "e2b-front", "tiny"])
    ap.add_argument("--multimodal", action="store_true",
                    help="Gemma4ForConditionalGeneration with vision/audio towers and processor "
                         f"files, as released ({', '.join(MM_VARIANTS)})")
    a = ap.parse_args()
    if a.multimodal and a.variant not in MM_VARIANTS:
        ap.error(f"--multimodal is for --variant {', '.join(MM_VARIANTS)}")
    print(make_checkpoint(a.out, a.variant, multimodal=a.multimodal))


if __name__ == "__main__":
    main()
