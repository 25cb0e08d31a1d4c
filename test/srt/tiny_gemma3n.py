"""Build a tiny, seeded, real-scale Gemma-3n text checkpoint for CPU tests.

The shape keeps what Gemma-3n E2B/E4B have and a KV-sharing fast prefill has to carry
through: sliding and full-attention layers, a KV-shared back half whose sliding and full
layers each read the last earlier layer of their type, AltUp's several hidden-state
streams (combined after the last layer), LAuReL blocks, per-layer inputs, activation
sparsity in the first layers and final logit softcapping. The layer pattern follows the
released models (sliding layers, then one full layer, repeated; the last non-shared
layer is full). Weights are drawn at the scale of a trained model (not SGLang's +-1e-3
dummy fill) so greedy outputs vary. Like the tiny Gemma-4, it has no tokenizer: the
tests send token ids.
"""

import json
import os

_LAYERS = ["sliding_attention"] * 3 + ["full_attention"]

TINY_TEXT_CONFIG = {
    "architectures": ["Gemma3nForCausalLM"],
    "model_type": "gemma3n_text",
    "vocab_size": 512,
    "vocab_size_per_layer_input": 512,
    "hidden_size": 64,
    "intermediate_size": [128] * 8,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_kv_shared_layers": 4,
    "hidden_size_per_layer_input": 8,
    "laurel_rank": 8,
    "altup_num_inputs": 4,
    "altup_active_idx": 0,
    "altup_coef_clip": 120.0,
    "altup_correct_scale": True,
    # the released models' 0.95 (keep the top 5 % of gate activations) in the first layers
    "activation_sparsity_pattern": [0.95] * 2 + [0.0] * 6,
    "attention_bias": False,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-06,
    "sliding_window": 16,
    "layer_types": _LAYERS * 2,
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
    },
    "final_logit_softcapping": 30.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
    "torch_dtype": "float32",
}


def make_tiny_gemma3n(path: str, seed: int = 0, config: dict | None = None) -> str:
    """Write config.json + model.safetensors for a seeded tiny Gemma-3n to `path`."""
    import torch
    from safetensors.torch import save_file
    from transformers import Gemma3nForCausalLM, Gemma3nTextConfig

    cfg = dict(TINY_TEXT_CONFIG if config is None else config)
    os.makedirs(path, exist_ok=True)
    torch.manual_seed(seed)
    hf_cfg = Gemma3nTextConfig(**{k: v for k, v in cfg.items() if k != "architectures"})
    model = Gemma3nForCausalLM(hf_cfg).float()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                # fan-in scaled, like a trained transformer (AltUp's coefficient maps
                # included: their fan-in is the number of streams)
                p.copy_(torch.randn(p.shape, generator=gen) * p.shape[-1] ** -0.5)
            else:
                # norm weights and AltUp's output scale near one, with spread so they matter
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state.pop("lm_head.weight", None)  # tied to embed_tokens
    save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return path
