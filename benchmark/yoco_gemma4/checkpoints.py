"""Text-only Gemma-4 and Gemma-3n checkpoints for GPU runs: real configs, dummy weights at scale.

Weights come from SGLang's dummy loader with SGLANG_DUMMY_WEIGHTS_AT_SCALE=1
(the fork's scaled_dummy_weights: seeded, realistic scale, varied greedy output),
so nothing large is written or carried. The configs are Google's released text
configs (configs/*.json).
"""

import copy
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))


# Released text configs by model name (configs/*.text_config.json; Gemma-3n's sources
# are in configs/gemma-3n.md).
RELEASED = {"e4b": "gemma-4-E4B-it", "e2b": "gemma-4-E2B-it",
            "3n-e4b": "gemma-3n-E4B-it", "3n-e2b": "gemma-3n-E2B-it"}
# Targets without KV sharing, for FROZEN_KV_MTP (serve_mtp.py): dense and MoE.
OTHER = {"31b": "gemma-4-31B-it", "26b-a4b": "gemma-4-26B-A4B-it"}
# '<model>-w8a8': the model as a compressed-tensors W8A8 INT8 checkpoint (int8 weights
# per output channel, int8 activations per token, dynamic), every linear layer of the
# decoder quantized, as llm-compressor's W8A8 recipe writes it (lm_head, tied, not).
W8A8 = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "config_groups": {"group_0": {
        "targets": ["Linear"],
        "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel",
                    "dynamic": False},
        "input_activations": {"num_bits": 8, "type": "int", "symmetric": True,
                              "strategy": "token", "dynamic": True},
    }},
    "ignore": ["lm_head"],
}
# Per-layer lists of a config, cut with the layers for a ceiling variant.
PER_LAYER_KEYS = ("layer_types", "intermediate_size", "activation_sparsity_pattern")


def text_config(variant: str) -> dict:
    """'e4b', 'e2b', '3n-e4b', '3n-e2b' (Gemma-3n), '31b', '26b-a4b' (no KV sharing), '31b-w8a8'
    (W8A8, see W8A8), or '<model>-front' (its layers before
    the first KV-shared one, no KV sharing: the cut model, see ceiling_variant; 'e4b-front24'
    is accepted as the old name). 'tiny' and 'tiny-3n' are the CPU test models, for dry
    runs of these scripts."""
    if variant.startswith("tiny"):
        import sys

        sys.path.insert(0, os.path.join(HERE, "..", "..", "test", "srt"))
        if variant == "tiny-3n":
            from tiny_gemma import GEMMA3N_TEXT_CONFIG as TINY_TEXT_CONFIG
        else:
            from tiny_gemma import GEMMA4_TEXT_CONFIG as TINY_TEXT_CONFIG

        return copy.deepcopy(TINY_TEXT_CONFIG)
    model = variant.split("-front")[0].removesuffix("-w8a8")
    name = RELEASED.get(model) or OTHER[model]
    with open(os.path.join(HERE, "configs", f"{name}.text_config.json")) as f:
        cfg = copy.deepcopy(json.load(f)["text_config"])
    if variant.endswith("-w8a8"):
        cfg["quantization_config"] = copy.deepcopy(W8A8)
    if "-front" in variant:
        n = cfg["num_hidden_layers"] - cfg["num_kv_shared_layers"]
        cfg["num_hidden_layers"] = n
        for k in PER_LAYER_KEYS:
            if isinstance(cfg.get(k), list):
                cfg[k] = cfg[k][:n]
        cfg["num_kv_shared_layers"] = 0
    cfg["architectures"] = ["Gemma3nForCausalLM" if model.startswith("3n") else "Gemma4ForCausalLM"]
    cfg["torch_dtype"] = "bfloat16"
    return cfg


def ceiling_variant(variant: str):
    """The cut variant of a model that has KV-shared layers (prefill_bench.py's
    ceiling-cut), else None. It does a little less than the fast path outside the back
    half: its per-layer embedding and projection GEMM are only the front layers' width
    (num_hidden_layers x hidden_size_per_layer_input), where the fast path's keep every
    layer's. The ceiling proper is ceiling_kwargs()."""
    return f"{variant}-front" if variant in RELEASED else None


# SGLang's --forward-hooks entry that takes the back half out of the fast path
# (yoco_ceiling.py). A factory is only called for an entry that names a module.
CEILING_HOOKS = [{"name": "yoco-ceiling", "target_modules": ["model"], "hook_factory": "yoco_ceiling:no_back_half"}]


def ceiling_kwargs() -> dict:
    """Engine kwargs that make an engine serving the full model (the same checkpoint as
    YOCO off and on) the YOCO ceiling: the fast path on every prefill pass (on-all's
    flag and min tokens 0) with no back half. By construction it does exactly the fast
    path's work outside the back half (embedding, per-layer inputs as the fast path
    computes them, front layers, final norm, logits for each request's last token), all
    by the fork's own code; see yoco_ceiling.py. yoco_ceiling must be importable in the
    engine's processes: it is beside this file, which the scripts put on sys.path
    (spawned processes inherit it; a launched command needs ceiling_env)."""
    return dict(kv_sharing_fast_prefill=True, kv_sharing_fast_prefill_min_tokens=0,
                forward_hooks=copy.deepcopy(CEILING_HOOKS))


def ceiling_env(env: dict) -> dict:
    """`env` for a command that serves the ceiling: yoco_ceiling.py on its PYTHONPATH."""
    path = [HERE] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(env, PYTHONPATH=os.pathsep.join(path))


def write_text_checkpoint(path: str, variant: str) -> str:
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(text_config(variant), f, indent=1)
    return path


ASSISTANT_CONFIG = os.path.join(HERE, "configs", "gemma-4-E4B-it-assistant.config.json")
# Attention geometry an assistant must share with its target (it reads target KV).
ASSISTANT_GEOMETRY = ["num_key_value_heads", "num_global_key_value_heads", "head_dim", "global_head_dim",
                      "attention_k_eq_v", "sliding_window", "max_position_embeddings", "rope_parameters",
                      "num_attention_heads"]


def write_assistant_checkpoint(path: str, target_cfg: dict = None) -> str:
    """The released E4B assistant (drafter) config. For another target (target_cfg
    given) it is rescaled: backbone width and attention geometry from the target,
    its own depth/width/centroid head kept (no other assistant config exists here)."""
    with open(ASSISTANT_CONFIG) as f:
        cfg = json.load(f)
    cfg.pop("source_model", None)
    # The released file pairs hidden_size_per_layer_input 0 with the target's
    # per-layer vocab; transformers >= 5.17 rejects that (it must be 0 too).
    cfg["text_config"]["vocab_size_per_layer_input"] = 0
    if target_cfg is not None:
        cfg["backbone_hidden_size"] = target_cfg["hidden_size"]
        for k in ASSISTANT_GEOMETRY:
            if k in target_cfg:
                cfg["text_config"][k] = copy.deepcopy(target_cfg[k])
    cfg["torch_dtype"] = "bfloat16"
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return path


def mtp_kwargs(draft_dir: str, steps: int = 3) -> dict:
    """NEXTN with a Gemma-4 assistant (promoted to FROZEN_KV_MTP): steps 3, topk 1,
    4 draft tokens, as in the original E4B study."""
    return dict(speculative_algorithm="NEXTN", speculative_draft_model_path=draft_dir,
                speculative_draft_load_format="dummy", speculative_num_steps=steps,
                speculative_eagle_topk=1, speculative_num_draft_tokens=steps + 1)


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
