"""Build tiny, seeded, real-scale Gemma-4 and Gemma-3n text checkpoints for CPU tests.

Both keep what the E2B/E4B models have and the fork touches: sliding and full-attention
layers (the released pattern: sliding layers, then one full layer, repeated), a KV-shared
back half whose layers read the last earlier layer of their type, per-layer inputs and
final logit softcapping. Gemma-4 adds full layers with a wider head dim, a double-wide
MLP in the shared layers and proportional partial RoPE on full layers; Gemma-3n adds
AltUp's several hidden-state streams (combined after the last layer), LAuReL blocks and
activation sparsity in the first layers. Weights are drawn at the scale of a trained
model (not SGLang's +-1e-3 dummy fill) so greedy outputs vary. Neither has a tokenizer:
the tests send token ids.
"""

import json
import os

_LAYERS = ["sliding_attention"] * 3 + ["full_attention"]

_COMMON = {
    "vocab_size": 512,
    "vocab_size_per_layer_input": 512,
    "hidden_size": 64,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_kv_shared_layers": 4,
    "hidden_size_per_layer_input": 8,
    "attention_bias": False,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-06,
    "sliding_window": 16,
    "layer_types": _LAYERS * 2,
    "final_logit_softcapping": 30.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
    "torch_dtype": "float32",
}

GEMMA4_TEXT_CONFIG = {
    "architectures": ["Gemma4ForCausalLM"],
    "model_type": "gemma4_text",
    **_COMMON,
    "intermediate_size": 128,
    "global_head_dim": 32,
    "use_double_wide_mlp": True,
    "enable_moe_block": False,
    "attention_k_eq_v": False,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {
            "rope_type": "proportional",
            "partial_rotary_factor": 0.25,
            "rope_theta": 1000000.0,
        },
    },
}

GEMMA3N_TEXT_CONFIG = {
    "architectures": ["Gemma3nForCausalLM"],
    "model_type": "gemma3n_text",
    **_COMMON,
    "intermediate_size": [128] * 8,
    "laurel_rank": 8,
    "altup_num_inputs": 4,
    "altup_active_idx": 0,
    "altup_coef_clip": 120.0,
    "altup_correct_scale": True,
    # the released models' 0.95 (keep the top 5 % of gate activations) in the first layers
    "activation_sparsity_pattern": [0.95] * 2 + [0.0] * 6,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
    },
}


def _write(path: str, seed: int, cfg: dict, model_cls: str, config_cls: str) -> str:
    """Write config.json + model.safetensors of a seeded ``model_cls`` to ``path``."""
    import torch
    import transformers
    from safetensors.torch import save_file

    cfg = dict(cfg)
    os.makedirs(path, exist_ok=True)
    torch.manual_seed(seed)
    hf_cfg = getattr(transformers, config_cls)(
        **{k: v for k, v in cfg.items() if k != "architectures"})
    model = getattr(transformers, model_cls)(hf_cfg).float()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                # fan-in scaled, like a trained transformer (AltUp's coefficient maps
                # included: their fan-in is the number of streams)
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
            else:
                # norm weights (and AltUp's output scale) near one, with spread so they matter
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():  # Gemma-4's per-layer output scale
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + 0.5 * torch.rand(b.shape, generator=gen))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state.pop("lm_head.weight", None)  # tied to embed_tokens
    save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return path


def make_tiny_gemma4(path: str, seed: int = 0, config: dict | None = None) -> str:
    """A seeded tiny Gemma-4 (``config``: GEMMA4_TEXT_CONFIG unless given) at ``path``."""
    cfg = GEMMA4_TEXT_CONFIG if config is None else config
    return _write(path, seed, cfg, "Gemma4ForCausalLM", "Gemma4TextConfig")


def make_tiny_gemma3n(path: str, seed: int = 0, config: dict | None = None) -> str:
    """A seeded tiny Gemma-3n (``config``: GEMMA3N_TEXT_CONFIG unless given) at ``path``."""
    cfg = GEMMA3N_TEXT_CONFIG if config is None else config
    return _write(path, seed, cfg, "Gemma3nForCausalLM", "Gemma3nTextConfig")
