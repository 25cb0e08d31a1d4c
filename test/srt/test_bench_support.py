"""The fork-only benchmark hooks: `--load-format dummy` draws weights at a trained
model's scale when SGLANG_DUMMY_WEIGHTS_AT_SCALE=1 (stock draws +-1e-3 otherwise), and
the serving benchmark's datasets import without the HF `datasets` package."""
import importlib
import sys
import types

import pytest
import torch
from release import RELEASE

pytestmark = pytest.mark.stack("bench-support")


class _Tiny(torch.nn.Module):
    """Names as a Gemma-4 checkpoint has them: a matrix, a norm, the final norm."""

    def __init__(self):
        super().__init__()
        self.config = types.SimpleNamespace(model_type="gemma4_text")
        self.model = torch.nn.Module()
        self.model.layers = torch.nn.ModuleList([torch.nn.Module()])
        self.model.layers[0].down_proj = torch.nn.Linear(64, 32, bias=False)
        self.model.layers[0].input_layernorm = torch.nn.Module()
        self.model.layers[0].input_layernorm.weight = torch.nn.Parameter(torch.zeros(32))
        self.model.norm = torch.nn.Module()
        self.model.norm.weight = torch.nn.Parameter(torch.zeros(32))


def _dummy_load(monkeypatch):
    """DummyModelLoader.load_model on _Tiny: the model's construction and the
    post-load passes (which need a real architecture) are stood in for."""
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader import loader

    monkeypatch.setattr(loader, "_initialize_model", lambda *a, **k: _Tiny())
    monkeypatch.setattr(loader, "_get_quantization_config", lambda *a, **k: None)
    post = "post_load_weights" if RELEASE >= (0, 5, 23) else "_post_load_weights"
    monkeypatch.setattr(loader, post, lambda model: None)
    model = loader.DummyModelLoader(LoadConfig(load_format="dummy")).load_model(
        model_config=types.SimpleNamespace(dtype=torch.float32),
        device_config=types.SimpleNamespace(device="cpu"),
    )
    return dict(model.named_parameters())


@pytest.mark.stack("bench-support", step="dummy-weights-at-scale", fails_before=True)
def test_dummy_loader_draws_weights_at_scale(monkeypatch):
    monkeypatch.setenv("SGLANG_DUMMY_WEIGHTS_AT_SCALE", "1")
    w = _dummy_load(monkeypatch)
    # a matrix at N(0, 1/fan_in), norms near 1: not stock's +-1e-3
    assert 0.1 < w["model.layers.0.down_proj.weight"].std().item() < 0.16
    assert abs(w["model.layers.0.input_layernorm.weight"].mean().item() - 1.0) < 0.1
    # the same seeded draw on every load
    again = _dummy_load(monkeypatch)
    assert all(torch.equal(w[n], again[n]) for n in w)


@pytest.mark.stack("bench-support", step="dummy-weights-at-scale")
@pytest.mark.parametrize("config", ["gemma-4-E4B-it", "gemma-3n-E2B-it", "gemma-3n-E4B-it"])
def test_seeded_attention_logits_spread_as_a_trained_models(config):
    """Gemma-4's and Gemma-3n's attention has no 1/sqrt(head_dim): seeded q/k norm scales
    of head_dim**-0.25 give attention logits of unit-order spread on the released
    shapes, as a trained model's; scales near 1 gave a spread of about sqrt(head_dim)
    (16: near-argmax attention, whose output one bf16 rounding flips)."""
    import json
    import os
    import types

    from sglang.srt.model_loader.scaled_dummy_weights import initialize_scaled_dummy_weights

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "benchmark", "yoco_gemma4", "configs",
                           f"{config}.text_config.json")) as f:
        text = json.load(f)["text_config"]
    hidden, head = text["hidden_size"], text["head_dim"]
    heads, kv = text["num_attention_heads"], text["num_key_value_heads"]

    class Attention(torch.nn.Module):  # the weights the rule sees, by their names
        def __init__(self):
            super().__init__()
            self.config = types.SimpleNamespace(model_type=text["model_type"])
            self.q_proj = torch.nn.Linear(hidden, heads * head, bias=False)
            self.k_proj = torch.nn.Linear(hidden, kv * head, bias=False)
            self.q_norm = torch.nn.Module()
            self.q_norm.weight = torch.nn.Parameter(torch.empty(head))
            self.k_norm = torch.nn.Module()
            self.k_norm.weight = torch.nn.Parameter(torch.empty(head))

    attn = Attention()
    initialize_scaled_dummy_weights(attn)

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    gen = torch.Generator().manual_seed(0)
    states = torch.randn(64, hidden, generator=gen)  # normed input: RMS 1
    with torch.no_grad():
        q = norm(attn.q_proj(states).view(64, heads, head), attn.q_norm.weight)
        k = norm(attn.k_proj(states).view(64, kv, head), attn.k_norm.weight)
        k = k.repeat_interleave(heads // kv, dim=1)
        logits = torch.einsum("qhd,khd->hqk", q, k)  # the models' attention scaling is 1
    assert 0.5 < logits.std().item() < 3.0, logits.std().item()


@pytest.mark.stack("bench-support", step="dummy-weights-at-scale")
def test_int8_weights_dequantize_to_the_bf16_rule():
    from sglang.srt.model_loader.scaled_dummy_weights import initialize_scaled_dummy_weights

    layer = torch.nn.Module()  # a W8A8 linear as compressed-tensors' int8 scheme holds it
    layer.weight = torch.nn.Parameter(torch.zeros(256, 1024, dtype=torch.int8), requires_grad=False)
    layer.weight_scale = torch.nn.Parameter(torch.zeros(256, 1), requires_grad=False)
    initialize_scaled_dummy_weights(layer)
    assert layer.weight.abs().max().item() <= 127 and layer.weight.float().std().item() > 20
    assert 0.9 < (layer.weight.float() * layer.weight_scale).std().item() * 1024**0.5 < 1.1


@pytest.mark.stack("bench-support", step="dummy-weights-at-scale")
def test_dummy_loader_is_stock_without_the_switch(monkeypatch):
    monkeypatch.delenv("SGLANG_DUMMY_WEIGHTS_AT_SCALE", raising=False)
    w = _dummy_load(monkeypatch)
    assert all(p.abs().max().item() <= 1e-3 for p in w.values())


@pytest.mark.stack("bench-support", step="bench-lazy-datasets-import", fails_before=True)
def test_serving_datasets_import_without_hf_datasets(monkeypatch):
    for name in [m for m in sys.modules if m.startswith("sglang.benchmark")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "datasets", None)  # as if not installed
    mmmu = importlib.import_module("sglang.benchmark.datasets.mmmu")
    # only the MMMU loader itself needs the package, and says so when it runs
    with pytest.raises(ImportError):
        mmmu.sample_mmmu_requests(num_requests=1, processor=None)
