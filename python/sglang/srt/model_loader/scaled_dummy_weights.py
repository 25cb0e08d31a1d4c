"""Seeded dummy weights that behave like a trained model's.

`--load-format dummy` fills every weight uniformly in +-1e-3: activations vanish
and every greedy token comes out the same, so output parity on such weights
proves nothing. With SGLANG_DUMMY_WEIGHTS_AT_SCALE=1 the dummy loader draws
matrices from N(0, 1/fan_in), vectors (norm scales) near 1, and the final norm
so that logits have std ~6 (peaked next-token distributions).

Scale alone makes a deep Gemma-4 chaotic: a bf16 rounding difference (another
batch mix or GEMM shape) flips the greedy token, so greedy parity means nothing.
A trained model is stable because each layer makes a small update to a residual
stream that persists and grows with depth. For Gemma-4 (model_type gemma4*):
  * layer_scalar = 1: a scalar < 1 in every layer erases the residual stream,
    so each layer rewrites it;
  * q_norm/k_norm scales head_dim**-0.25: Gemma-4 has no 1/sqrt(head_dim) in
    attention, so this gives the usual unit-variance attention logits instead
    of near-argmax attention;
  * token embeddings (tied with lm_head) at RMS 0.25 of the post-norm branch
    outputs, final norm x4 to keep the logit scale: otherwise the input token's
    embedding dominates the final state and the model predicts its own input.
Gemma-3n (model_type gemma3n*) has no 1/sqrt(head_dim) in attention either: its q/k
norm scales get the same head_dim**-0.25 (trained ones are that small, or the model's
attention would be near-argmax and a bf16 rounding would flip its output); its other
weights follow the generic rule.
Int8 weights (W8A8 checkpoints such as compressed-tensors' int-quantized scheme)
draw integers with a per-channel scale (`weight_scale`) so that the dequantized
matrix follows the same rule as a bf16 one.
Each tensor is seeded by its name: stable across runs, processes and load order.
"""

import zlib

import torch

_BRANCH_NORMS = (
    "post_attention_layernorm.weight",
    "post_feedforward_layernorm.weight",
    "post_per_layer_input_norm.weight",
)
_QK_NORMS = ("q_norm.weight", "k_norm.weight")


def _model_types(model: torch.nn.Module) -> list:
    cfg = getattr(model, "config", None)
    types = [getattr(cfg, "model_type", "")]
    if cfg is not None and hasattr(cfg, "get_text_config"):
        types.append(getattr(cfg.get_text_config(), "model_type", ""))
    return [str(t) for t in types]


def _is_gemma4(model: torch.nn.Module) -> bool:
    return any(t.startswith("gemma4") for t in _model_types(model))


def _is_gemma3n(model: torch.nn.Module) -> bool:
    return any(t.startswith("gemma3n") for t in _model_types(model))


def fill_scaled_dummy(
    name: str,
    tmp: torch.Tensor,
    gen: torch.Generator,
    *,
    gemma4: bool = True,
    gemma3n: bool = False,
    logit_std: float = 6.0,
    embed_rms: float = 0.25,
    branch_norm: float = 1.0,
    layer_scalar: tuple | None = None,
    qk_unit: bool = True,
) -> None:
    """Fill fp32 `tmp` for the parameter called `name` (SGLang or HF naming).

    The keyword knobs exist for benchmark/yoco_gemma4/chaos_probe.py; the
    defaults are the init. layer_scalar None means 1, (lo, hi) uniform.
    """
    embed = gemma4 and name.endswith(("embed_tokens.weight", "lm_head.weight"))
    if name.endswith("model.norm.weight"):
        g = logit_std / (embed_rms if gemma4 else 1.0)
        tmp.normal_(g, 0.05 * g, generator=gen)
    elif name.endswith("layer_scalar"):
        if layer_scalar is None:
            tmp.fill_(1.0)
        else:
            tmp.uniform_(layer_scalar[0], layer_scalar[1], generator=gen)
    elif tmp.dim() >= 2:
        std = tmp.shape[-1] ** -0.5
        tmp.normal_(0.0, std * embed_rms if embed else std, generator=gen)
    elif gemma4 and name.endswith(_BRANCH_NORMS):
        tmp.normal_(branch_norm, 0.1 * branch_norm, generator=gen)
    elif (gemma4 or gemma3n) and qk_unit and name.endswith(_QK_NORMS):
        g = tmp.shape[0] ** -0.25
        tmp.normal_(g, 0.1 * g, generator=gen)
    else:
        tmp.normal_(1.0, 0.1, generator=gen)


# Int8 weights are N(0, 1) * _INT8_STEPS, rounded and clipped at 4 sigma: their
# scale 1 / _INT8_STEPS times the bf16 rule's std dequantizes to that rule.
_INT8_STEPS = 127 / 4


def initialize_scaled_dummy_weights(
    model: torch.nn.Module, seed: int = 1234, **knobs
) -> None:
    knobs.setdefault("gemma4", _is_gemma4(model))
    knobs.setdefault("gemma3n", _is_gemma3n(model))
    params = model.state_dict()
    for name, param in params.items():
        int8 = param.dtype == torch.int8
        if not (int8 or torch.is_floating_point(param)):
            continue
        # Seed per tensor name: stable across runs, processes and load order.
        gen = torch.Generator(device=param.device)
        gen.manual_seed(seed + zlib.crc32(name.encode()))
        tmp = torch.empty(param.shape, dtype=torch.float32, device=param.device)
        if int8:
            tmp.normal_(0.0, _INT8_STEPS, generator=gen).round_().clamp_(-127, 127)
        elif name.endswith("weight_scale") and _is_int8(params, name[:-6]):
            fan_in = params[name[:-6]].shape[-1]
            tmp.fill_(fan_in**-0.5 / _INT8_STEPS)
        else:
            fill_scaled_dummy(name, tmp, gen, **knobs)
        param.data.copy_(tmp.to(param.dtype))


def _is_int8(params: dict, name: str) -> bool:
    return name in params and params[name].dtype == torch.int8
