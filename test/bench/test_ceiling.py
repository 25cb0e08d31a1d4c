"""The YOCO ceiling of bench.py prefill/forward, on CPU.

The ceiling is the fast path without its back half: the full model (the same checkpoint
as YOCO off and on), the flag on with min tokens 0, every pass planned with no
back-half rows (yoco_ceiling.py). Served on the tiny Gemma-4 (8 layers, the last 4
KV-shared), a prefill pass runs layers 0-3 on every token and none of layers 4-7, where
on-all runs them on the last token. The cut model (ceiling-cut) is the full config cut
at the first KV-shared layer: every per-layer list cut, the per-layer-input sizes
unchanged, so its per-layer inputs are the front layers' share of the full model's."""

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "benchmark", "yoco_gemma4"))

from checkpoints import (  # noqa: E402
    CEILING_HOOKS,
    PER_LAYER_KEYS,
    ceiling_env,
    ceiling_kwargs,
    ceiling_variant,
    text_config,
    write_text_checkpoint,
)


@pytest.mark.parametrize("model", ["e2b", "e4b", "3n-e2b", "3n-e4b"])
def test_cut_config_is_the_full_config_cut_at_the_first_kv_shared_layer(model):
    full, cut = text_config(model), text_config(ceiling_variant(model))
    first = full["num_hidden_layers"] - full["num_kv_shared_layers"]  # kv_sharing_fast_prefill.first_kv_shared_layer
    assert cut["num_hidden_layers"] == first and cut["num_kv_shared_layers"] == 0
    per_layer = {k for k, v in full.items() if isinstance(v, list) and len(v) == full["num_hidden_layers"]}
    assert per_layer <= set(PER_LAYER_KEYS)  # no per-layer list left at full length
    for k in per_layer:
        assert cut[k] == full[k][:first], k
    # Per-layer inputs: a vector of hidden_size_per_layer_input per layer and token, from a
    # table of vocab_size_per_layer_input rows; the cut model's are the front layers'.
    for k in ("hidden_size_per_layer_input", "vocab_size_per_layer_input", "hidden_size", "vocab_size"):
        assert cut[k] == full[k], k
    ple = full["hidden_size_per_layer_input"]
    assert cut["num_hidden_layers"] * ple < full["num_hidden_layers"] * ple
    assert full["layer_types"][first - 1] in full["layer_types"][:first]
    for k in set(full) - per_layer - {"num_hidden_layers", "num_kv_shared_layers"}:
        assert cut[k] == full[k], k


def test_ceiling_engine_kwargs_and_the_hook_it_names():
    kw = ceiling_kwargs()
    assert kw["kv_sharing_fast_prefill"] is True and kw["kv_sharing_fast_prefill_min_tokens"] == 0
    assert kw["forward_hooks"] == CEILING_HOOKS and kw["forward_hooks"] is not CEILING_HOOKS
    (spec,) = kw["forward_hooks"]
    assert spec["target_modules"]  # SGLang skips an entry without one before calling its factory
    module, name = spec["hook_factory"].split(":")
    import importlib

    assert callable(getattr(importlib.import_module(module), name))
    env = ceiling_env({"PYTHONPATH": "/a"})
    assert env["PYTHONPATH"].split(os.pathsep) == [os.path.join(ROOT, "benchmark", "yoco_gemma4"), "/a"]


@pytest.mark.parametrize("mode", ["ceiling", "on-all"])
def test_the_ceiling_runs_the_front_layers_on_every_token_and_no_back_half(tmp_path, mode):
    pytest.importorskip("sglang.srt.layers.kv_sharing_fast_prefill")
    from cpu_engine import YOCO, start_engine

    ckpt = write_text_checkpoint(str(tmp_path / "tiny"), "tiny")
    first = text_config("tiny")["num_hidden_layers"] - text_config("tiny")["num_kv_shared_layers"]
    log = tmp_path / "rows.txt"
    probe = {"name": "rows", "target_modules": ["model.layers.?"], "hook_factory": "layer_rows_probe:record_rows",
             "config": {"out": str(log)}}
    kw = ceiling_kwargs() if mode == "ceiling" else dict(YOCO, forward_hooks=[])
    kw["forward_hooks"] = kw["forward_hooks"] + [probe]
    # No overlap scheduling: it also runs one decode step (the whole model, output
    # discarded) after a request's last prefill, in every mode; the prefill pass is checked.
    eng = start_engine(ckpt, load_format="dummy", disable_overlap_schedule=True, **kw)
    try:
        log.write_text("")
        out = eng.generate(input_ids=list(range(10, 50)), sampling_params={"max_new_tokens": 1, "temperature": 0})
    finally:
        eng.shutdown()
    assert len(out["output_ids"]) == 1
    rows = [tuple(map(int, line.split())) for line in log.read_text().splitlines()]
    assert [r for layer, r in rows if layer < first] == [40] * first
    back = [r for layer, r in rows if layer >= first]
    assert back == ([] if mode == "ceiling" else [1] * (8 - first))
