"""Build a tiny, seeded, real-scale Gemma-4 text checkpoint for CPU tests.

The shape keeps every Gemma-4 E2B/E4B feature that the fork touches: sliding and
full-attention layers with different head dims, a KV-shared back half, per-layer
embeddings (PLE), a double-wide MLP in the shared layers, proportional partial
RoPE on full layers and final logit softcapping. Weights are drawn at the scale
of a trained model (not SGLang's +-1e-3 dummy fill) so greedy outputs vary.
"""

import json
import os

TINY_TEXT_CONFIG = {
    "architectures": ["Gemma4ForCausalLM"],
    "model_type": "gemma4_text",
    "vocab_size": 512,
    "vocab_size_per_layer_input": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "global_head_dim": 32,
    "num_kv_shared_layers": 4,
    "hidden_size_per_layer_input": 8,
    "use_double_wide_mlp": True,
    "enable_moe_block": False,
    "attention_k_eq_v": False,
    "attention_bias": False,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-06,
    "sliding_window": 16,
    "layer_types": ["sliding_attention"] * 3
    + ["full_attention"]
    + ["sliding_attention"] * 3
    + ["full_attention"],
    "rope_parameters": {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        "full_attention": {
            "rope_type": "proportional",
            "partial_rotary_factor": 0.25,
            "rope_theta": 1000000.0,
        },
    },
    "final_logit_softcapping": 30.0,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "pad_token_id": 0,
    "eos_token_id": 1,
    "bos_token_id": 2,
    "torch_dtype": "float32",
}


def make_tiny_gemma4(path: str, seed: int = 0, config: dict | None = None) -> str:
    """Write config.json + model.safetensors for a seeded tiny Gemma-4 to `path`."""
    import torch
    from safetensors.torch import save_file
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig

    cfg = dict(TINY_TEXT_CONFIG if config is None else config)
    os.makedirs(path, exist_ok=True)
    torch.manual_seed(seed)
    hf_cfg = Gemma4TextConfig(**{k: v for k, v in cfg.items() if k != "architectures"})
    model = Gemma4ForCausalLM(hf_cfg).float()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2:
                # fan-in scaled, like a trained transformer
                std = 1.0 / (p.shape[-1] ** 0.5)
                if "embed" in name:
                    std = p.shape[-1] ** -0.5
                p.copy_(torch.randn(p.shape, generator=gen) * std)
            else:
                # norm weights near one, with spread so the norms matter
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=gen))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + 0.5 * torch.rand(b.shape, generator=gen))
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    state.pop("lm_head.weight", None)  # tied to embed_tokens
    save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    return path
