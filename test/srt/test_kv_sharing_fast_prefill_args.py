"""--kv-sharing-fast-prefill (Gemma-4 YOCO fast prefill): the server argument
and the start-up checks in arg_groups/kv_sharing_fast_prefill_hook.py.

Models are config-only checkpoints (ServerArgs reads config.json, no weights)
shaped like the real Gemma-4 text configs: E2B (35 layers, 20 KV-shared) and
E4B (42/18) are accepted, 26B-A4B (MoE) and 31B (no KV-shared layers) and a
non-Gemma model are rejected. Most cases go through ServerArgs on CPU
(device=cpu, attention_backend=torch_native), which is what
sglang.Engine(**kwargs) and launch_server build. Cases that ServerArgs blocks on
a CPU-only machine before the hook runs (GPU-only attention backends,
DFLASH/DSPARK, multi-item scoring) call the hook on a resolved ServerArgs with
the setting overridden.
"""

import argparse
import copy
import json
import logging

import pytest

from resolved_server_args import (
    attention_backends,
    build,
    from_cli,
    model_config,
    published,
    resolved,
    with_fields,
    with_model_config,
)
from tiny_gemma import GEMMA4_TEXT_CONFIG

pytestmark = pytest.mark.stack("yoco-flag", step="kv-sharing-fast-prefill-arg")

FLAG = "--kv-sharing-fast-prefill"
HOOK_LOGGER = "sglang.srt.arg_groups.kv_sharing_fast_prefill_hook"


# --------------------------------------------------------------------------- models


def _layer_types(num_layers, period):
    """Gemma-4 pattern: (period - 1) sliding layers, then one full layer."""
    return [
        "full_attention" if (i + 1) % period == 0 else "sliding_attention"
        for i in range(num_layers)
    ]


def gemma4_text_config(variant):
    """The tiny test config with the layer structure of a real Gemma-4 model."""
    cfg = copy.deepcopy(GEMMA4_TEXT_CONFIG)
    if variant == "E2B":
        cfg.update(
            num_hidden_layers=35,
            num_kv_shared_layers=20,
            layer_types=_layer_types(35, 5),
            use_double_wide_mlp=True,
        )
    elif variant == "E4B":
        cfg.update(
            num_hidden_layers=42,
            num_kv_shared_layers=18,
            layer_types=_layer_types(42, 6),
            use_double_wide_mlp=False,
        )
    elif variant == "26B-A4B":
        cfg.update(
            num_hidden_layers=30,
            num_kv_shared_layers=0,
            layer_types=_layer_types(30, 6),
            enable_moe_block=True,
            num_experts=4,
            top_k_experts=2,
            moe_intermediate_size=32,
            attention_k_eq_v=True,
            num_global_key_value_heads=1,
            hidden_size_per_layer_input=0,
            use_double_wide_mlp=False,
        )
    elif variant == "31B":
        cfg.update(
            num_hidden_layers=60,
            num_kv_shared_layers=0,
            layer_types=_layer_types(60, 6),
            attention_k_eq_v=True,
            num_global_key_value_heads=1,
            hidden_size_per_layer_input=0,
            use_double_wide_mlp=False,
        )
    else:
        raise ValueError(variant)
    return cfg


LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 512,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "float32",
}


def gemma4_assistant_config():
    """A Gemma-4 MTP assistant draft (NEXTN with it resolves to FROZEN_KV_MTP)."""
    text = {k: v for k, v in GEMMA4_TEXT_CONFIG.items() if k != "architectures"}
    text.update(
        num_hidden_layers=4,
        num_kv_shared_layers=4,
        layer_types=_layer_types(4, 4),
        hidden_size_per_layer_input=0,
        vocab_size_per_layer_input=0,
        use_double_wide_mlp=False,
    )
    return {
        "architectures": ["Gemma4AssistantForCausalLM"],
        "model_type": "gemma4_assistant",
        "backbone_hidden_size": GEMMA4_TEXT_CONFIG["hidden_size"],
        "use_ordered_embeddings": True,
        "num_centroids": 16,
        "centroid_intermediate_top_k": 4,
        "tie_word_embeddings": True,
        "text_config": text,
    }


CONFIGS = {
    "E2B": lambda: gemma4_text_config("E2B"),
    "E4B": lambda: gemma4_text_config("E4B"),
    "26B-A4B": lambda: gemma4_text_config("26B-A4B"),
    "31B": lambda: gemma4_text_config("31B"),
    "llama": lambda: LLAMA_CONFIG,
    # A non-Gemma-4 architecture that carries the attribute is still rejected.
    "llama-kv-shared": lambda: dict(LLAMA_CONFIG, num_kv_shared_layers=1),
    "assistant": gemma4_assistant_config,
}


@pytest.fixture
def model(tmp_path):
    """model("E4B") -> path of a config-only checkpoint dir."""

    def make(name):
        path = tmp_path / name
        if not path.exists():
            path.mkdir()
            (path / "config.json").write_text(json.dumps(CONFIGS[name](), indent=1))
        return str(path)

    return make


# --------------------------------------------------------------------------- helpers

BASE_KWARGS = dict(
    device="cpu",
    attention_backend="torch_native",
    skip_tokenizer_init=True,
    kv_sharing_fast_prefill=True,
)


def server_args(model_path, **overrides):
    """ServerArgs as sglang.Engine(model_path=..., **kwargs) builds them."""
    kwargs = dict(BASE_KWARGS, model_path=model_path)
    kwargs.update(overrides)
    return build(**kwargs)


def cli_parser():
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    return parser


def server_args_from_cli(argv):
    return from_cli(cli_parser().parse_args(argv))


def reject(fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError) as info:
        fn(*args, **kwargs)
    return str(info.value)


def run_hook(args, **fields):
    """Run the hook on with_fields(args, **fields)."""
    from sglang.srt.arg_groups.kv_sharing_fast_prefill_hook import (
        handle_kv_sharing_fast_prefill,
    )

    args = with_fields(args, **fields)
    handle_kv_sharing_fast_prefill(args)
    return args


def prefill_graph(args):
    return resolved(args, "cuda_graph_config").prefill


@pytest.fixture
def e4b_resolved(model):
    return server_args(model("E4B"))


# --------------------------------------------------------------------------- the flag


@pytest.mark.stack("yoco-flag", step="kv-sharing-fast-prefill-arg", fails_before=True)
def test_default_is_off(model):
    from sglang.srt.server_args import ServerArgs

    assert ServerArgs(model_path="dummy").kv_sharing_fast_prefill is False
    kwargs = dict(BASE_KWARGS)
    del kwargs["kv_sharing_fast_prefill"]
    args = build(model_path=model("E4B"), **kwargs)
    assert resolved(args, "kv_sharing_fast_prefill") is False
    argv = ["--model-path", model("E4B"), "--device", "cpu"]
    argv += ["--attention-backend", "torch_native"]
    assert resolved(server_args_from_cli(argv), "kv_sharing_fast_prefill") is False


def test_off_skips_every_check(model):
    # 26B-A4B has no KV-shared layers; without the flag nothing is checked.
    args = server_args(model("26B-A4B"), kv_sharing_fast_prefill=False, pp_size=2)
    assert resolved(args, "kv_sharing_fast_prefill") is False


def test_cli_round_trip(model):
    argv = ["--model-path", model("E4B"), "--device", "cpu"]
    argv += ["--attention-backend", "torch_native", FLAG]
    assert resolved(server_args_from_cli(argv), "kv_sharing_fast_prefill") is True


def test_help_mentions_flag():
    help_text = " ".join(cli_parser().format_help().split())
    assert FLAG in help_text
    assert "last token of each request" in help_text
    assert "YOCO" in help_text


@pytest.mark.parametrize("on", [False, True])
def test_model_reads_flag_from_exec_features(model, on):
    # The model branch reads get_exec().features.kv_sharing_fast_prefill.
    from sglang.srt.runtime_context import get_exec

    args = server_args(model("E4B"), kv_sharing_fast_prefill=on)
    with published(args):
        assert get_exec().features.kv_sharing_fast_prefill is on


def test_min_tokens_default_cli_and_exec_features(model):
    from sglang.srt.runtime_context import get_exec
    from sglang.srt.server_args import ServerArgs

    # unset: resolved once at start-up, by the hook
    assert ServerArgs(model_path="dummy").kv_sharing_fast_prefill_min_tokens is None
    argv = ["--model-path", model("E4B"), "--device", "cpu", "--attention-backend", "torch_native"]
    argv += [FLAG, "--kv-sharing-fast-prefill-min-tokens", "0"]
    args = server_args_from_cli(argv)
    assert resolved(args, "kv_sharing_fast_prefill_min_tokens") == 0
    with published(args):
        assert get_exec().features.kv_sharing_fast_prefill_min_tokens == 0


def test_negative_min_tokens_rejected(model):
    with pytest.raises(ValueError, match=r"--kv-sharing-fast-prefill-min-tokens must be >= 0 \(got -1\)"):
        server_args(model("E4B"), kv_sharing_fast_prefill_min_tokens=-1)


@pytest.mark.stack("yoco-flag", step="min-tokens-without-flag-warns", fails_before=True)
def test_min_tokens_without_the_flag_warns(model, caplog):
    """Accepted silently, --kv-sharing-fast-prefill-min-tokens alone read as if YOCO
    were tuned while it was off."""
    argv = ["--model-path", model("E4B"), "--device", "cpu", "--attention-backend", "torch_native"]
    with caplog.at_level(logging.WARNING, logger=HOOK_LOGGER):
        args = server_args_from_cli(argv + ["--kv-sharing-fast-prefill-min-tokens", "100"])
    assert resolved(args, "kv_sharing_fast_prefill") is False
    warnings = [r.getMessage() for r in caplog.records if r.name == HOOK_LOGGER]
    assert len(warnings) == 1, warnings
    assert ("--kv-sharing-fast-prefill-min-tokens 100 has no effect" in warnings[0]
            and f"off without {FLAG}" in warnings[0]), warnings
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=HOOK_LOGGER):
        server_args_from_cli(argv)
        server_args_from_cli(argv + [FLAG, "--kv-sharing-fast-prefill-min-tokens", "100"])
    assert not [r for r in caplog.records if "has no effect" in r.getMessage()]


CLI_VS_KWARGS = {
    "E4B accepted": ({}, []),
    "26B-A4B rejected": ({"model": "26B-A4B"}, []),
    "pipeline parallel rejected": ({"pp_size": 2}, ["--pp-size", "2"]),
    "EAGLE rejected": (
        {"speculative_algorithm": "EAGLE", "speculative_draft_model_path": "E4B"},
        ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "E4B"],
    ),
    "pinned full prefill graph rejected": (
        {"attention_backend": "triton", "cuda_graph_backend_prefill": "full"},
        ["--attention-backend", "triton", "--cuda-graph-backend-prefill", "full"],
    ),
    "pinned breakable prefill graph accepted": (
        {"attention_backend": "triton", "cuda_graph_backend_prefill": "breakable"},
        ["--attention-backend", "triton", "--cuda-graph-backend-prefill", "breakable"],
    ),
}


@pytest.mark.parametrize("case", list(CLI_VS_KWARGS))
def test_cli_and_engine_kwargs_decide_alike(model, case):
    kwargs, extra_argv = copy.deepcopy(CLI_VS_KWARGS[case])
    path = model(kwargs.pop("model", "E4B"))
    if kwargs.get("speculative_draft_model_path"):
        kwargs["speculative_draft_model_path"] = model("E4B")
        extra_argv[extra_argv.index("E4B")] = model("E4B")
    argv = ["--model-path", path, "--device", "cpu", "--skip-tokenizer-init"]
    argv += ["--attention-backend", "torch_native", FLAG] + extra_argv

    def outcome(build):
        try:
            args = build()
        except ValueError as e:
            return ("rejected", str(e))
        graph = prefill_graph(args)
        return ("accepted", resolved(args, "kv_sharing_fast_prefill"), graph.backend, graph.bs)

    from_kwargs = outcome(lambda: server_args(path, **kwargs))
    from_cli = outcome(lambda: server_args_from_cli(argv))
    assert from_kwargs == from_cli
    assert from_kwargs[0] == ("accepted" if case.endswith("accepted") else "rejected")


# --------------------------------------------------------------------------- models


@pytest.mark.parametrize(
    "variant, first_shared, num_layers", [("E2B", 15, 35), ("E4B", 24, 42)]
)
def test_gemma4_with_kv_shared_layers_accepted(
    model, caplog, variant, first_shared, num_layers
):
    with caplog.at_level(logging.INFO, logger=HOOK_LOGGER):
        args = server_args(model(variant))
    assert resolved(args, "kv_sharing_fast_prefill") is True
    lines = [r.getMessage() for r in caplog.records if r.name == HOOK_LOGGER]
    assert len(lines) == 1
    # min-tokens unset: resolved once, here, with the reason in the line
    assert resolved(args, "kv_sharing_fast_prefill_min_tokens") == 4096
    assert lines[0].startswith(
        f"KV-sharing fast prefill (YOCO) on: first KV-shared layer {first_shared} "
        f"of {num_layers}; prefill passes of >= 4096 new tokens (unset: "
    )
    assert lines[0].endswith(
        f") run layers {first_shared}-{num_layers - 1} for the last token of each "
        "request only"
    )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=HOOK_LOGGER):
        server_args(model(variant), kv_sharing_fast_prefill_min_tokens=64)
    (line,) = [r.getMessage() for r in caplog.records if r.name == HOOK_LOGGER]
    assert "passes of >= 64 new tokens (--kv-sharing-fast-prefill-min-tokens)" in line


@pytest.mark.stack("yoco-model", step="back-half-cuda-graphs", fails_before=True)
def test_unset_min_tokens_is_0_where_the_back_half_replays_graphs(
    model, caplog, monkeypatch
):
    from sglang.srt.arg_groups import kv_sharing_fast_prefill_hook as hook
    from sglang.srt.runtime_context import get_exec

    # on this CPU-only machine the back half runs eager: the default stays
    with caplog.at_level(logging.INFO, logger=HOOK_LOGGER):
        args = server_args(model("E4B"))
    (line,) = [r.getMessage() for r in caplog.records if r.name == HOOK_LOGGER]
    assert resolved(args, "kv_sharing_fast_prefill_min_tokens") == 4096
    assert "(unset: the back half runs eager (device cpu), and smaller" in line
    # where start-up captures the back half (and no prefill graph runs): 0
    monkeypatch.setattr(hook, "back_half_graph_skip_reason", lambda server_args: None)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=HOOK_LOGGER):
        args = server_args(model("E4B"))
    (line,) = [r.getMessage() for r in caplog.records if r.name == HOOK_LOGGER]
    assert resolved(args, "kv_sharing_fast_prefill_min_tokens") == 0
    assert "passes of >= 0 new tokens (unset: the back half replays CUDA graphs)" in line
    with published(args):  # what the model reads
        assert get_exec().features.kv_sharing_fast_prefill_min_tokens == 0
    # set explicitly: kept
    args = server_args(model("E4B"), kv_sharing_fast_prefill_min_tokens=64)
    assert resolved(args, "kv_sharing_fast_prefill_min_tokens") == 64


@pytest.mark.stack("yoco-model", step="back-half-cuda-graphs")
def test_when_start_up_captures_the_back_half(monkeypatch):
    """The decision itself, on the settings it reads (each release reads them
    from its own resolved record through kv_sharing_fast_prefill_settings)."""
    import types

    from sglang.srt.arg_groups import kv_sharing_fast_prefill_settings as settings
    from sglang.srt.arg_groups.kv_sharing_fast_prefill_hook import (
        back_half_graph_skip_reason,
    )
    from sglang.srt.environ import envs
    from sglang.srt.model_executor.cuda_graph_config import Backend

    def args(**over):
        a = dict(device="cuda", backend="triton", decode=Backend.FULL,
                 enable_deterministic_inference=False, dcp_size=1)
        a.update(over)
        return types.SimpleNamespace(
            view=types.SimpleNamespace(
                device=a["device"],
                enable_deterministic_inference=a["enable_deterministic_inference"],
                dcp_size=a["dcp_size"],
            ),
            graphs=types.SimpleNamespace(decode=types.SimpleNamespace(backend=a["decode"])),
            backends=(a["backend"], a["backend"]),
        )

    monkeypatch.setattr(settings, "view", lambda ns: ns.view)
    monkeypatch.setattr(settings, "cuda_graph_config", lambda ns: ns.graphs)
    monkeypatch.setattr(settings, "attention_backends", lambda ns: ns.backends)
    assert back_half_graph_skip_reason(args()) is None
    assert back_half_graph_skip_reason(args(device="cpu")) == "device cpu"
    assert back_half_graph_skip_reason(args(decode=Backend.DISABLED)) == "decode CUDA graphs are off"
    assert "triton only" in back_half_graph_skip_reason(args(backend="trtllm_mha"))
    assert back_half_graph_skip_reason(args(enable_deterministic_inference=True)) == (
        "--enable-deterministic-inference"
    )
    assert back_half_graph_skip_reason(args(dcp_size=2)) == "decode context parallelism"
    with envs.SGLANG_KV_SHARING_FAST_PREFILL_GRAPH.override(False):
        assert back_half_graph_skip_reason(args()) == "SGLANG_KV_SHARING_FAST_PREFILL_GRAPH=0"



@pytest.mark.parametrize("variant, num_layers", [("26B-A4B", 30), ("31B", 60)])
def test_gemma4_without_kv_shared_layers_rejected(model, variant, num_layers):
    msg = reject(server_args, model(variant))
    assert FLAG in msg
    assert "num_kv_shared_layers=0" in msg
    assert f"num_hidden_layers={num_layers}" in msg
    assert "Gemma4ForCausalLM" in msg


@pytest.mark.parametrize("name, num_shared", [("llama", 0), ("llama-kv-shared", 1)])
def test_non_gemma4_model_rejected(model, name, num_shared):
    msg = reject(server_args, model(name))
    assert FLAG in msg
    assert "architecture LlamaForCausalLM" in msg
    assert f"num_kv_shared_layers={num_shared}" in msg


def test_multimodal_gemma4_architectures_accepted(e4b_resolved):
    # The real E2B/E4B checkpoints are Gemma4ForConditionalGeneration; their
    # text stack is the same Gemma4TextModel.
    from sglang.srt.arg_groups import kv_sharing_fast_prefill_hook as hook

    for arch in (
        "Gemma4ForConditionalGeneration",
        "Gemma4UnifiedForConditionalGeneration",
    ):
        config = copy.copy(model_config(e4b_resolved))
        config.hf_config = copy.copy(config.hf_config)
        config.hf_config.architectures = [arch]
        args = with_model_config(e4b_resolved, config)
        assert hook._check_model(args) == (24, 42)


# --------------------------------------------------------------------------- spec


@pytest.mark.parametrize("algorithm", ["EAGLE", "EAGLE3", "STANDALONE"])
def test_speculative_needing_every_token_rejected(model, algorithm):
    msg = reject(
        server_args,
        model("E4B"),
        speculative_algorithm=algorithm,
        speculative_draft_model_path=model("E4B"),
    )
    assert f"{FLAG} is incompatible with --speculative-algorithm {algorithm}" in msg
    assert "FROZEN_KV_MTP" in msg


def test_nextn_with_non_assistant_draft_resolves_to_eagle_and_is_rejected(model):
    msg = reject(
        server_args,
        model("E4B"),
        speculative_algorithm="NEXTN",
        speculative_draft_model_path=model("E4B"),
    )
    assert "--speculative-algorithm EAGLE" in msg


@pytest.mark.parametrize("algorithm", ["DFLASH", "DSPARK", "SOME_PLUGIN_ALGO"])
def test_speculative_gpu_only_or_plugin_rejected(e4b_resolved, algorithm):
    # ServerArgs on CPU rejects DFLASH/DSPARK before the hook; check the hook.
    msg = reject(run_hook, e4b_resolved, speculative_algorithm=algorithm)
    assert f"--speculative-algorithm {algorithm}" in msg


@pytest.mark.parametrize("algorithm", ["NEXTN", "EAGLE"])
def test_frozen_kv_mtp_accepted(model, algorithm):
    args = server_args(
        model("E4B"),
        speculative_algorithm=algorithm,
        speculative_draft_model_path=model("assistant"),
    )
    assert resolved(args, "speculative_algorithm") == "FROZEN_KV_MTP"
    assert resolved(args, "kv_sharing_fast_prefill") is True


def test_ngram_accepted(model):
    args = server_args(model("E4B"), speculative_algorithm="NGRAM")
    assert resolved(args, "speculative_algorithm") == "NGRAM"


# --------------------------------------------------------------------------- attention


def test_torch_native_on_cpu_accepted(e4b_resolved):
    assert attention_backends(e4b_resolved) == ("torch_native", "torch_native")


def test_triton_accepted(model):
    args = server_args(model("E4B"), attention_backend="triton")
    assert attention_backends(args) == ("triton", "triton")


def test_deterministic_inference_with_triton_accepted(model):
    # The mode in which the back half is byte-identical to the full pass.
    args = server_args(model("E4B"), attention_backend="triton", enable_deterministic_inference=True)
    assert resolved(args, "kv_sharing_fast_prefill")
    assert resolved(args, "enable_deterministic_inference")
    assert attention_backends(args) == ("triton", "triton")


def test_trtllm_mha_accepted(e4b_resolved):
    # trtllm_mha needs a Blackwell GPU to get through ServerArgs.
    args = run_hook(e4b_resolved, device="cuda", attention_backend="trtllm_mha")
    assert attention_backends(args) == ("trtllm_mha", "trtllm_mha")


@pytest.mark.parametrize(
    "prefill, decode", [("triton", "trtllm_mha"), ("trtllm_mha", "triton")]
)
def test_split_prefill_and_decode_backends_rejected(e4b_resolved, prefill, decode):
    # HybridAttnBackend: the back half would run on the other phase's backend.
    msg = reject(
        run_hook,
        e4b_resolved,
        device="cuda",
        prefill_attention_backend=prefill,
        decode_attention_backend=decode,
    )
    assert f"(got prefill {prefill!r}, decode {decode!r})" in msg
    assert "--attention-backend" in msg


@pytest.mark.parametrize("backend", ["flashinfer", "fa3", "intel_xpu"])
def test_other_attention_backends_rejected(e4b_resolved, backend):
    # Gemma-4's own check rejects most of these before the hook on CPU.
    msg = reject(run_hook, e4b_resolved, device="cuda", attention_backend=backend)
    assert f"prefill attention backend {backend!r}" in msg
    assert "supported: triton, trtllm_mha)" in msg
    assert "--attention-backend" in msg


def test_torch_native_off_cpu_rejected(e4b_resolved):
    msg = reject(
        run_hook, e4b_resolved, device="cuda", attention_backend="torch_native"
    )
    assert "prefill attention backend 'torch_native' on device 'cuda'" in msg


def test_decode_attention_backend_checked_too(e4b_resolved):
    msg = reject(
        run_hook,
        e4b_resolved,
        device="cuda",
        attention_backend="triton",
        decode_attention_backend="flashinfer",
    )
    assert "decode attention backend 'flashinfer'" in msg
    assert "--decode-attention-backend" in msg


# --------------------------------------------------------------------------- features


UNSUPPORTED = {
    "pipeline parallelism": (dict(pp_size=2), "got pp_size=2", "--pp-size 1"),
    # --enable-dp-attention is a field on 0.5.17; 0.5.23 resolves it into attn_dp_size
    "DP attention": (
        dict(enable_dp_attention=True, dp_size=2, tp_size=2),
        ("got enable_dp_attention=True", "got attn_dp_size=2"),
        "--enable-dp-attention",
    ),
    "context parallelism": (
        dict(attn_cp_size=2, tp_size=2), "got attn_cp_size=2", "--attn-cp-size 1"
    ),
    "context parallelism (prefill CP)": (
        dict(enable_prefill_cp=True, cp_strategy="zigzag"),
        "enable_prefill_cp=True",
        "--enable-prefill-cp",
    ),
    "two-batch overlap": (
        dict(enable_two_batch_overlap=True),
        "got enable_two_batch_overlap=True",
        "--enable-two-batch-overlap",
    ),
    "embedding models": (
        dict(is_embedding=True),
        "got is_embedding=True",
        "--is-embedding",
    ),
}


@pytest.mark.parametrize("feature", list(UNSUPPORTED))
def test_unsupported_features_rejected(model, feature):
    overrides, got, advice = UNSUPPORTED[feature]
    msg = reject(server_args, model("E4B"), **overrides)
    assert f"does not support {feature.split(' (')[0]} yet" in msg
    assert any(g in msg for g in ((got,) if isinstance(got, str) else got)), msg
    assert advice in msg


def test_each_context_parallel_setting_rejected(e4b_resolved):
    # enable_prefill_cp, and on releases that have them its legacy aliases
    from sglang.srt.arg_groups.kv_sharing_fast_prefill_settings import (
        PREFILL_CP_SETTINGS,
    )

    assert "enable_prefill_cp" in PREFILL_CP_SETTINGS
    for field in PREFILL_CP_SETTINGS:
        msg = reject(run_hook, e4b_resolved, **{field: True})
        assert f"does not support context parallelism yet (got {field}=True)" in msg


def test_multi_item_scoring_rejected(e4b_resolved):
    # ServerArgs requires flashinfer for --enable-mis, which Gemma-4 rejects first.
    msg = reject(run_hook, e4b_resolved, enable_mis=True)
    assert "does not support multi-item scoring yet (got enable_mis=True)" in msg
    assert "--enable-mis" in msg


# --------------------------------------------------------------------------- CUDA graph


@pytest.mark.parametrize(
    "overrides",
    [
        dict(cuda_graph_backend_prefill="full"),
        dict(cuda_graph_config={"prefill": {"backend": "full"}}),
        # Breakable is kept only below the threshold: 0 sends every pass to
        # the fast path, 4 leaves no capture size (the smallest is 4) below it.
        dict(cuda_graph_backend_prefill="breakable", kv_sharing_fast_prefill_min_tokens=0),
        dict(cuda_graph_backend_prefill="breakable", kv_sharing_fast_prefill_min_tokens=4),
    ],
    ids=["--cuda-graph-backend-prefill", "--cuda-graph-config", "breakable-min0", "breakable-min4"],
)
def test_pinned_prefill_cuda_graph_rejected(model, overrides):
    msg = reject(server_args, model("E4B"), attention_backend="triton", **overrides)
    assert "prefill CUDA graph" in msg
    assert "set explicitly" in msg
    assert "--kv-sharing-fast-prefill-min-tokens" in msg
    assert "--disable-prefill-cuda-graph" in msg


def _hook_records(caplog, level):
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == HOOK_LOGGER and r.levelno == level
    ]


@pytest.mark.parametrize("min_tokens", [4096, 1024, 300])
def test_breakable_prefill_graph_capped_below_threshold(model, caplog, min_tokens):
    """Passes below min-tokens run the full computation and keep their graph;
    every capture size at or above it is dropped, so those passes run eager."""
    from sglang.srt.model_executor.cuda_graph_config import Backend

    plain = prefill_graph(
        server_args(
            model("E4B"),
            attention_backend="triton",
            cuda_graph_backend_prefill="breakable",
            kv_sharing_fast_prefill=False,
        )
    )
    with caplog.at_level(logging.INFO, logger=HOOK_LOGGER):
        args = server_args(
            model("E4B"),
            attention_backend="triton",
            cuda_graph_backend_prefill="breakable",
            kv_sharing_fast_prefill_min_tokens=min_tokens,
        )
    graph = prefill_graph(args)
    assert graph.backend == Backend.BREAKABLE
    assert graph.bs == [s for s in plain.bs if s < min_tokens]
    assert graph.max_bs == graph.bs[-1] < min_tokens
    capped = any("capped" in m for m in _hook_records(caplog, logging.INFO))
    assert capped == (plain.max_bs >= min_tokens)
    assert not _hook_records(caplog, logging.WARNING)


def test_defaulted_breakable_prefill_graph_capped_quietly(e4b_resolved, caplog):
    """The CUDA default (breakable, as a GPU server resolves it) is capped too."""
    from sglang.srt.arg_groups.kv_sharing_fast_prefill_hook import (
        handle_kv_sharing_fast_prefill,
    )
    from sglang.srt.model_executor.cuda_graph_config import Backend

    config = copy.deepcopy(resolved(e4b_resolved, "cuda_graph_config"))
    config.prefill.backend = Backend.BREAKABLE
    config.prefill.bs = [256, 2048, 3840, 4096, 8192]
    config.prefill.max_bs = 8192
    on_gpu = with_fields(e4b_resolved, cuda_graph_config=config)
    with caplog.at_level(logging.INFO, logger=HOOK_LOGGER):
        handle_kv_sharing_fast_prefill(on_gpu)
    graph = prefill_graph(on_gpu)
    assert (graph.backend, graph.bs, graph.max_bs) == (Backend.BREAKABLE, [256, 2048, 3840], 3840)
    assert not _hook_records(caplog, logging.WARNING)


def test_pinned_capture_sizes_above_threshold_dropped_with_warning(model, caplog):
    from sglang.srt.model_executor.cuda_graph_config import Backend

    with caplog.at_level(logging.INFO, logger=HOOK_LOGGER):
        args = server_args(
            model("E4B"),
            attention_backend="triton",
            cuda_graph_config={"prefill": {"backend": "breakable", "bs": [256, 2048, 8192]}},
        )
    graph = prefill_graph(args)
    assert (graph.backend, graph.bs, graph.max_bs) == (Backend.BREAKABLE, [256, 2048], 2048)
    (warning,) = _hook_records(caplog, logging.WARNING)
    assert "capped at 2048 tokens" in warning and ">= 4096" in warning


def test_defaulted_prefill_cuda_graph_turned_off_with_one_warning(e4b_resolved, caplog):
    """A prefill graph nobody set (a platform's or a model's default) that is not
    breakable cannot be kept: it is turned off, decode graphs stay."""
    from sglang.srt.arg_groups.kv_sharing_fast_prefill_hook import (
        handle_kv_sharing_fast_prefill,
    )
    from sglang.srt.model_executor.cuda_graph_config import Backend

    config = copy.deepcopy(resolved(e4b_resolved, "cuda_graph_config"))
    config.prefill.backend = Backend.FULL
    args = with_fields(e4b_resolved, cuda_graph_config=config)
    with caplog.at_level(logging.INFO, logger=HOOK_LOGGER):
        handle_kv_sharing_fast_prefill(args)
    assert prefill_graph(args).backend == Backend.DISABLED
    assert resolved(args, "cuda_graph_config").decode == config.decode
    warnings = _hook_records(caplog, logging.WARNING)
    assert len(warnings) == 1
    assert "Disabling prefill CUDA graph" in warnings[0]
    assert FLAG in warnings[0]


@pytest.mark.parametrize(
    "overrides",
    [dict(disable_prefill_cuda_graph=True), dict(disable_cuda_graph=True)],
    ids=["--disable-prefill-cuda-graph", "--disable-cuda-graph"],
)
def test_disabled_prefill_cuda_graph_accepted_quietly(model, caplog, overrides):
    from sglang.srt.model_executor.cuda_graph_config import Backend

    with caplog.at_level(logging.INFO, logger=HOOK_LOGGER):
        args = server_args(model("E4B"), attention_backend="triton", **overrides)
    assert prefill_graph(args).backend == Backend.DISABLED
    assert not [
        r
        for r in caplog.records
        if r.name == HOOK_LOGGER and r.levelno >= logging.WARNING
    ]
