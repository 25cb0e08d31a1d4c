"""Seeded dummy weights at the scale of a trained model.

`--load-format dummy` fills every weight uniformly in +-1e-3: activations vanish
and every greedy token comes out the same, so output parity on such weights
proves nothing. With SGLANG_DUMMY_WEIGHTS_AT_SCALE=1 the dummy loader draws
matrices from N(0, 1/fan_in) (embeddings included), vectors (norm scales) near 1
and per-layer scalars in [0.5, 1). The final norm is scaled up (N(6, 0.3)) so
next-token distributions are as peaked as a trained model's: with near-flat
logits, greedy picks are numerical ties and flip with batch composition alone.
Outputs vary like a real model's, so benchmarks and parity checks exercise real
numerics without downloading weights.
"""

import zlib

import torch


def initialize_scaled_dummy_weights(model: torch.nn.Module, seed: int = 1234) -> None:
    for name, param in model.state_dict().items():
        if not torch.is_floating_point(param):
            continue
        # Seed per tensor name: stable across runs, processes and load order.
        gen = torch.Generator(device=param.device)
        gen.manual_seed(seed + zlib.crc32(name.encode()))
        tmp = torch.empty(param.shape, dtype=torch.float32, device=param.device)
        if name.endswith("model.norm.weight"):
            tmp.normal_(6.0, 0.3, generator=gen)
        elif name.endswith("layer_scalar"):
            tmp.uniform_(0.5, 1.0, generator=gen)
        elif param.dim() >= 2:
            tmp.normal_(0.0, param.shape[-1] ** -0.5, generator=gen)
        else:
            tmp.normal_(1.0, 0.1, generator=gen)
        param.data.copy_(tmp.to(param.dtype))
