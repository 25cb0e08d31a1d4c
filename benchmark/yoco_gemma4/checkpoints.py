"""Text-only Gemma-4 checkpoints for GPU runs: real configs, dummy weights at scale.

Weights come from SGLang's dummy loader with SGLANG_DUMMY_WEIGHTS_AT_SCALE=1
(the fork's scaled_dummy_weights: seeded, realistic scale, varied greedy output),
so nothing large is written or carried. The configs are Google's released text
configs (configs/*.json).
"""

import copy
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def text_config(variant: str) -> dict:
    """'e4b', 'e2b', or '<model>-front' (its layers before the first KV-shared one, no
    KV sharing: the YOCO ceiling; 'e4b-front24' is accepted as the old name).
    'tiny' is the CPU test model, for dry runs of these scripts."""
    if variant.startswith("tiny"):
        import sys

        sys.path.insert(0, os.path.join(HERE, "..", "..", "test", "srt"))
        from tiny_gemma4 import TINY_TEXT_CONFIG

        return dict(TINY_TEXT_CONFIG)
    model = variant.split("-front")[0]
    base = {"e4b": "gemma-4-E4B-it", "e2b": "gemma-4-E2B-it"}[model]
    with open(os.path.join(HERE, "configs", f"{base}.text_config.json")) as f:
        cfg = copy.deepcopy(json.load(f)["text_config"])
    if "-front" in variant:
        n = cfg["num_hidden_layers"] - cfg["num_kv_shared_layers"]
        cfg["num_hidden_layers"] = n
        cfg["layer_types"] = cfg["layer_types"][:n]
        cfg["num_kv_shared_layers"] = 0
    cfg["architectures"] = ["Gemma4ForCausalLM"]
    cfg["torch_dtype"] = "bfloat16"
    return cfg


def ceiling_variant(variant: str):
    """The ceiling variant of a model that has KV-shared layers, else None."""
    return f"{variant}-front" if variant in ("e4b", "e2b") else None


def write_text_checkpoint(path: str, variant: str) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(text_config(variant), f, indent=1)
    return path


def engine_kwargs(**overrides) -> dict:
    os.environ["SGLANG_DUMMY_WEIGHTS_AT_SCALE"] = "1"
    kw = dict(
        load_format="dummy",
        skip_tokenizer_init=True,
        attention_backend="triton",
        dtype="bfloat16",
        mem_fraction_static=0.8,
        log_level="error",
        grammar_backend="none",
        disable_prefill_cuda_graph=True,
        chunked_prefill_size=16384,
        max_prefill_tokens=16384,
        random_seed=0,
    )
    # Dry runs on CPU: YOCO_ENGINE_OVERRIDES='{"device": "cpu", ...}'
    kw.update(json.loads(os.environ.get("YOCO_ENGINE_OVERRIDES", "{}")))
    kw.update(overrides)
    return kw
