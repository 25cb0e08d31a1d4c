"""The fork-only benchmark hooks: `--load-format dummy` draws weights at a trained
model's scale when SGLANG_DUMMY_WEIGHTS_AT_SCALE=1 (stock draws +-1e-3 otherwise), and
the serving benchmark's datasets import without the HF `datasets` package."""
import importlib
import sys
import types

import pytest
import torch

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
    for post in ("post_load_weights", "_post_load_weights"):  # its name per release
        if hasattr(loader, post):
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
