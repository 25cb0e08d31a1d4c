"""benchmark/*/bench.py: each named command maps to its script, --dry-run prints the
command line without running it, and --help reaches the script's own options (on CPU:
nothing here needs a GPU)."""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
YOCO = os.path.join(ROOT, "benchmark", "yoco_gemma4", "bench.py")
MTP = os.path.join(ROOT, "benchmark", "frozen_kv_mtp", "bench.py")


def bench(script, *args):
    p = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, timeout=120, cwd=ROOT)
    return p.returncode, p.stdout + p.stderr


@pytest.mark.parametrize("script,command,target", [
    (YOCO, "prefill", "prefill_bench.py"), (YOCO, "forward", "forward_bench.py"),
    (YOCO, "serve", "run.py"), (YOCO, "parity", "parity_check.py"),
    (YOCO, "checkpoint", "make_checkpoint.py"),
    (MTP, "step", "profile_draft.py"), (MTP, "serve", "serve_mtp.py"),
    (MTP, "kernel", "verify_kernel_bench.py"), (MTP, "parity", "mtp_check.py"),
])
def test_each_command_has_help_and_a_dry_run(script, command, target):
    rc, out = bench(script, command, "--help")
    assert rc == 0 and "usage:" in out and target in out, out
    rc, out = bench(script, command, "out.json", "--dry-run")
    assert rc == 0 and out.startswith("$ python ") and target in out.splitlines()[0], out


def test_defaults_and_overrides():
    rc, out = bench(YOCO, "prefill", "o.json", "--variant", "e2b", "--dry-run")
    assert "o.json --variant e2b --modes off,on-all,ceiling" in out
    rc, out = bench(YOCO, "prefill", "o.json", "--modes", "off,on", "--dry-run")
    assert out.count("--modes") == 1 and "--modes off,on" in out
    rc, out = bench(YOCO, "serve", "d", "--dry-run")
    assert "run.py d --skip-prefill" in out
    rc, out = bench(YOCO, "parity", "p.json", "--deterministic", "--dry-run")
    assert "enable_deterministic_inference" in out
    rc, out = bench(MTP, "step", "d", "--target", "31b", "--dry-run")
    assert "--modes off,mtp,mtp-splitkv-grouped --batches 8" in out


def test_unknown_command_is_refused():
    rc, out = bench(YOCO, "nope")
    assert rc != 0 and "prefill|forward|serve|parity|checkpoint" in out
    rc, out = bench(YOCO, "--help")
    assert rc == 0 and "prefill" in out and "serve" in out


def test_prefill_table_gives_every_yoco_modes_share_of_the_ceiling():
    """bench.py prefill: the share of the ceiling (ceiling time / the mode's time) for
    each YOCO mode measured beside the ceiling, with or without "off"."""
    sys.path.insert(0, os.path.join(ROOT, "benchmark", "yoco_gemma4"))
    from prefill_bench import ceiling_table, share_lines

    res = [{"mode": m, "len": 4096, "batch": 1, "median_s": t}
           for m, t in (("off", 0.070), ("on", 0.035), ("on-all", 0.034), ("ceiling", 0.029))]
    res += [{"mode": m, "len": 1024, "batch": 8, "median_s": t} for m, t in (("on-all-eager", 0.05), ("ceiling", 0.04))]
    big, small = ceiling_table(res, [(4096, 1), (1024, 8)])
    assert big["share_of_ceiling_on"] == big["fraction_of_ceiling"] == 0.029 / 0.035
    assert big["share_of_ceiling_on_all"] == 0.029 / 0.034 and big["speedup_on_all"] == 0.070 / 0.034
    assert big["speedup"] == 2.0 and big["ceiling_speedup"] == 0.070 / 0.029
    assert small["share_of_ceiling_on_all_eager"] == 0.04 / 0.05 and "speedup_on_all_eager" not in small
    assert big["speedup_on"] == big["speedup"]
    assert share_lines([big, small]) == [
        "SHARE on 4096x1: 2.00x over off (70.0 ms against 35.0 ms), 82.9 % of the ceiling (29.0 ms against 35.0 ms)",
        "SHARE on-all 4096x1: 2.06x over off (70.0 ms against 34.0 ms), "
        "85.3 % of the ceiling (29.0 ms against 34.0 ms)",
        "SHARE on-all-eager 1024x8: no off, 80.0 % of the ceiling (40.0 ms against 50.0 ms)"]


@pytest.mark.parametrize("model", ["e2b", "e4b", "3n-e2b", "3n-e4b"])
def test_ceiling_variant_is_the_models_front_layers(model):
    """--variant 3n-e2b|3n-e4b (Gemma-3n) and the Gemma-4 variants: the ceiling is the
    model's layers before its first KV-shared one, every per-layer list cut to them (a
    Gemma-3n list left at full length would describe other layers), and the config loads
    in transformers as its architecture's config."""
    sys.path.insert(0, os.path.join(ROOT, "benchmark", "yoco_gemma4"))
    from checkpoints import PER_LAYER_KEYS, ceiling_variant, text_config

    full, front = text_config(model), text_config(ceiling_variant(model))
    n = full["num_hidden_layers"] - full["num_kv_shared_layers"]
    assert full["num_kv_shared_layers"] > 0 and front["num_kv_shared_layers"] == 0
    assert front["num_hidden_layers"] == n
    assert set(front) == set(full)
    for k in PER_LAYER_KEYS:
        if isinstance(full.get(k), list):
            assert len(full[k]) == full["num_hidden_layers"] and front[k] == full[k][:n], k
    for k in set(full) - set(PER_LAYER_KEYS) - {"num_hidden_layers", "num_kv_shared_layers"}:
        assert front[k] == full[k], k
    if model.startswith("3n"):
        from transformers import Gemma3nTextConfig

        assert full["architectures"] == ["Gemma3nForCausalLM"]
        cfg = Gemma3nTextConfig(**{k: v for k, v in front.items() if k != "architectures"})
        assert cfg.num_hidden_layers == n and len(cfg.intermediate_size) == n
