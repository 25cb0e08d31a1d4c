"""--kv-sharing-fast-prefill: the server argument and the start-up checks of
arg_groups/kv_sharing_fast_prefill_hook.py, table by table, on config-only checkpoints
shaped like the real Gemma-4 text configs (E2B, E4B accepted; 26B-A4B, 31B, non-Gemma
rejected). Most cases go through ServerArgs on CPU (what sglang.Engine and launch_server
build); what ServerArgs blocks on CPU before the hook runs calls the hook on a resolved
ServerArgs with the setting overridden.
"""

import argparse
import copy
import json
import logging

import pytest

from release import RELEASE
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
from sglang.srt.arg_groups import kv_sharing_fast_prefill_hook as hook
from tiny_gemma import GEMMA4_TEXT_CONFIG

pytestmark = pytest.mark.stack("yoco-flag", step="kv-sharing-fast-prefill-arg")

FLAG = "--kv-sharing-fast-prefill"
HOOK_LOGGER = "sglang.srt.arg_groups.kv_sharing_fast_prefill_hook"


def _layer_types(num_layers, period):
    """Gemma-4 pattern: (period - 1) sliding layers, then one full layer."""
    return ["full_attention" if (i + 1) % period == 0 else "sliding_attention" for i in range(num_layers)]


# 26B-A4B and 31B: K = V on full layers, no per-layer inputs
_LARGE = dict(attention_k_eq_v=True, num_global_key_value_heads=1,
              hidden_size_per_layer_input=0, use_double_wide_mlp=False)
# variant: (num_hidden_layers, num_kv_shared_layers, full-layer period, other fields)
VARIANTS = {
    "E2B": (35, 20, 5, dict(use_double_wide_mlp=True)),
    "E4B": (42, 18, 6, dict(use_double_wide_mlp=False)),
    "26B-A4B": (30, 0, 6, dict(_LARGE, enable_moe_block=True, num_experts=4,
                               top_k_experts=2, moe_intermediate_size=32)),
    "31B": (60, 0, 6, _LARGE),
}


def gemma4_text_config(variant):
    """The tiny test config with the layer structure of a real Gemma-4 model."""
    layers, shared, period, extra = VARIANTS[variant]
    return dict(copy.deepcopy(GEMMA4_TEXT_CONFIG), num_hidden_layers=layers,
                num_kv_shared_layers=shared, layer_types=_layer_types(layers, period), **extra)


LLAMA_CONFIG = dict(
    architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=512, hidden_size=64,
    intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    max_position_embeddings=4096, rms_norm_eps=1e-6, torch_dtype="float32",
)


def gemma4_assistant_config():
    """A Gemma-4 MTP assistant draft (NEXTN with it resolves to FROZEN_KV_MTP)."""
    text = {k: v for k, v in GEMMA4_TEXT_CONFIG.items() if k != "architectures"}
    text.update(num_hidden_layers=4, num_kv_shared_layers=4, layer_types=_layer_types(4, 4),
                hidden_size_per_layer_input=0, vocab_size_per_layer_input=0,
                use_double_wide_mlp=False)
    return dict(architectures=["Gemma4AssistantForCausalLM"], model_type="gemma4_assistant",
                backbone_hidden_size=GEMMA4_TEXT_CONFIG["hidden_size"], use_ordered_embeddings=True,
                num_centroids=16, centroid_intermediate_top_k=4, tie_word_embeddings=True,
                text_config=text)


CONFIGS = {
    **{v: (lambda v=v: gemma4_text_config(v)) for v in VARIANTS},
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


BASE_KWARGS = dict(device="cpu", attention_backend="torch_native", skip_tokenizer_init=True,
                   kv_sharing_fast_prefill=True)
CPU_ARGV = ["--device", "cpu", "--attention-backend", "torch_native"]


def server_args(model_path, **overrides):
    """ServerArgs as sglang.Engine(model_path=..., **kwargs) builds them."""
    return build(**dict(BASE_KWARGS, model_path=model_path, **overrides))


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


def handle(args):
    """The hook on a resolved copy, taking its decisions as during resolution."""
    if RELEASE < (0, 5, 23):  # the record is sealed after resolution
        object.__setattr__(args, "_in_override", True)
    try:
        hook.handle_kv_sharing_fast_prefill(args)
    finally:
        if RELEASE < (0, 5, 23):
            object.__setattr__(args, "_in_override", False)
    return args


def run_hook(args, **fields):
    return handle(with_fields(args, **fields))


def logged(caplog, fn, *args, **kwargs):
    """(fn(*args, **kwargs), the hook's messages from INFO up, its warnings)."""
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=HOOK_LOGGER):
        out = fn(*args, **kwargs)
    mine = [r for r in caplog.records if r.name == HOOK_LOGGER]
    return (out, [r.getMessage() for r in mine],
            [r.getMessage() for r in mine if r.levelno >= logging.WARNING])


def prefill_graph(args):
    return resolved(args, "cuda_graph_config").prefill


@pytest.fixture
def e4b_resolved(model):
    return server_args(model("E4B"))


@pytest.mark.stack("yoco-flag", step="kv-sharing-fast-prefill-arg", fails_before=True)
def test_default_is_off(model):
    from sglang.srt.server_args import ServerArgs

    assert ServerArgs(model_path="dummy").kv_sharing_fast_prefill is False
    kwargs = dict(BASE_KWARGS)
    del kwargs["kv_sharing_fast_prefill"]
    args = build(model_path=model("E4B"), **kwargs)
    assert resolved(args, "kv_sharing_fast_prefill") is False
    argv = ["--model-path", model("E4B")] + CPU_ARGV
    assert resolved(server_args_from_cli(argv), "kv_sharing_fast_prefill") is False


def test_off_skips_every_check(model):
    # 26B-A4B has no KV-shared layers; without the flag nothing is checked.
    args = server_args(model("26B-A4B"), kv_sharing_fast_prefill=False, pp_size=2)
    assert resolved(args, "kv_sharing_fast_prefill") is False


def test_help_mentions_flag():
    help_text = " ".join(cli_parser().format_help().split())
    assert FLAG in help_text and "last token of each request" in help_text and "YOCO" in help_text


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

    assert ServerArgs(model_path="dummy").kv_sharing_fast_prefill_min_tokens is None
    argv = ["--model-path", model("E4B")] + CPU_ARGV
    args = server_args_from_cli(argv + [FLAG, "--kv-sharing-fast-prefill-min-tokens", "0"])
    assert resolved(args, "kv_sharing_fast_prefill_min_tokens") == 0
    with published(args):
        assert get_exec().features.kv_sharing_fast_prefill_min_tokens == 0


def test_negative_min_tokens_rejected(model):
    with pytest.raises(ValueError, match=r"--kv-sharing-fast-prefill-min-tokens must be >= 0 \(got -1\)"):
        server_args(model("E4B"), kv_sharing_fast_prefill_min_tokens=-1)


@pytest.mark.stack("yoco-flag", step="min-tokens-without-flag-warns", fails_before=True)
def test_min_tokens_without_the_flag_warns(model, caplog):
    argv = ["--model-path", model("E4B")] + CPU_ARGV
    args, _, warnings = logged(
        caplog, server_args_from_cli, argv + ["--kv-sharing-fast-prefill-min-tokens", "100"])
    assert resolved(args, "kv_sharing_fast_prefill") is False
    assert len(warnings) == 1, warnings
    assert ("--kv-sharing-fast-prefill-min-tokens 100 has no effect" in warnings[0]
            and f"off without {FLAG}" in warnings[0]), warnings
    for quiet in (argv, argv + [FLAG, "--kv-sharing-fast-prefill-min-tokens", "100"]):
        assert not [w for w in logged(caplog, server_args_from_cli, quiet)[2]
                    if "has no effect" in w]


CLI_VS_KWARGS = {
    "E4B accepted": ({}, []),
    "26B-A4B rejected": ({"model": "26B-A4B"}, []),
    "pipeline parallel rejected": ({"pp_size": 2}, ["--pp-size", "2"]),
    "EAGLE rejected": ({"speculative_algorithm": "EAGLE", "speculative_draft_model_path": "E4B"},
                       ["--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", "E4B"]),
    "pinned full prefill graph rejected": (
        {"attention_backend": "triton", "cuda_graph_backend_prefill": "full"},
        ["--attention-backend", "triton", "--cuda-graph-backend-prefill", "full"]),
    "pinned breakable prefill graph accepted": (
        {"attention_backend": "triton", "cuda_graph_backend_prefill": "breakable"},
        ["--attention-backend", "triton", "--cuda-graph-backend-prefill", "breakable"]),
}


@pytest.mark.parametrize("case", list(CLI_VS_KWARGS))
def test_cli_and_engine_kwargs_decide_alike(model, case):
    kwargs, extra_argv = copy.deepcopy(CLI_VS_KWARGS[case])
    path = model(kwargs.pop("model", "E4B"))
    if kwargs.get("speculative_draft_model_path"):
        kwargs["speculative_draft_model_path"] = model("E4B")
        extra_argv[extra_argv.index("E4B")] = model("E4B")
    argv = ["--model-path", path, "--skip-tokenizer-init"] + CPU_ARGV + [FLAG] + extra_argv

    def outcome(build):
        try:
            args = build()
        except ValueError as e:
            return ("rejected", str(e))
        graph = prefill_graph(args)
        return ("accepted", resolved(args, "kv_sharing_fast_prefill"), graph.backend, graph.bs)

    from_kwargs = outcome(lambda: server_args(path, **kwargs))
    assert from_kwargs == outcome(lambda: server_args_from_cli(argv))
    assert from_kwargs[:2] == ("accepted", True) if case.endswith("accepted") else (
        from_kwargs[0] == "rejected")


@pytest.mark.parametrize("variant", ["E2B", "E4B"])
def test_gemma4_with_kv_shared_layers_accepted(model, caplog, variant):
    num_layers, num_shared = VARIANTS[variant][:2]
    first_shared = num_layers - num_shared
    args, (line,), _ = logged(caplog, server_args, model(variant))  # one line, no warning
    assert resolved(args, "kv_sharing_fast_prefill") is True
    # min-tokens unset: resolved once, here, with the reason in the line
    n = resolved(args, "kv_sharing_fast_prefill_min_tokens")
    assert isinstance(n, int)
    assert line.startswith(f"KV-sharing fast prefill (YOCO) on: first KV-shared layer {first_shared} "
                           f"of {num_layers}; prefill passes of >= {n} new tokens (unset: ")
    assert f") run layers {first_shared}-{num_layers - 1} for the last token of each request only" in line
    _, (line,), _ = logged(caplog, server_args, model(variant),
                           kv_sharing_fast_prefill_min_tokens=64)
    assert "passes of >= 64 new tokens (--kv-sharing-fast-prefill-min-tokens)" in line


@pytest.mark.stack("yoco-model", step="back-half-cuda-graphs", fails_before=True)
def test_unset_min_tokens_is_0_where_the_back_half_replays_graphs(model, caplog, monkeypatch):
    from sglang.srt.runtime_context import get_exec

    # on this CPU-only machine the back half runs eager
    args, (line,), _ = logged(caplog, server_args, model("E4B"))
    # the decision is recorded once, for the model runner (which never asks the hook)
    assert resolved(args, "kv_sharing_fast_prefill_back_half_graphs") is False
    assert line.endswith("request only, eager (device cpu)")
    # where start-up captures the back half (and no prefill graph runs): 0
    monkeypatch.setattr(hook, "back_half_graph_skip_reason", lambda server_args: None)
    args, (line,), _ = logged(caplog, server_args, model("E4B"))
    assert resolved(args, "kv_sharing_fast_prefill_min_tokens") == 0
    assert resolved(args, "kv_sharing_fast_prefill_back_half_graphs") is True
    assert line.endswith("request only, in CUDA graphs")
    assert "passes of >= 0 new tokens (unset: the back half replays CUDA graphs)" in line
    with published(args):  # what the model reads
        assert get_exec().features.kv_sharing_fast_prefill_min_tokens == 0
    # set explicitly: kept
    args = server_args(model("E4B"), kv_sharing_fast_prefill_min_tokens=64)
    assert resolved(args, "kv_sharing_fast_prefill_min_tokens") == 64


@pytest.mark.stack("yoco-model", step="min-tokens-within-a-pass", fails_before=True)
def test_min_tokens_within_what_a_pass_holds(model, caplog, monkeypatch):
    import types

    from sglang.srt.arg_groups import kv_sharing_fast_prefill_settings as settings

    # unset on CPU: every pass (no kernel launches bound a short one)
    args, (line,), _ = logged(caplog, server_args, model("E4B"))
    assert resolved(args, "kv_sharing_fast_prefill_min_tokens") == 0
    assert "passes of >= 0 new tokens (unset: on CPU no kernel launches bound a short pass)" in line
    # set above the largest pass: kept, and named with the fix
    args, _, (warning,) = logged(caplog, server_args, model("E4B"), chunked_prefill_size=1024,
                                 kv_sharing_fast_prefill_min_tokens=4096)
    assert resolved(args, "kv_sharing_fast_prefill_min_tokens") == 4096
    assert ("min-tokens 4096 is more new tokens than any prefill pass holds (1024, "
            "--chunked-prefill-size), so no pass takes the fast path" in warning)
    assert "Set it to at most 1024, or leave it unset." in warning
    _, _, warnings = logged(caplog, server_args, model("E4B"), chunked_prefill_size=1024,
                            kv_sharing_fast_prefill_min_tokens=1024)
    assert warnings == []
    # a GPU under 35 GB (chunked prefill 2048): the breakable graph keeps the smaller passes
    from sglang.srt.model_executor.cuda_graph_config import Backend

    small = breakable_on_gpu(args, chunk=2048)
    _, _, warnings = logged(caplog, handle, small)
    assert (prefill_graph(small).bs, warnings) == ([256], [])
    assert resolved(small, "kv_sharing_fast_prefill_min_tokens") == 2048
    assert prefill_graph(small).backend == Backend.BREAKABLE
    # unset where the back half runs eager on a GPU: at most the largest pass
    context = settings.model_config(args).context_len  # 4096 in the tiny configs
    for chunk, want, bound in ((2048, 2048, "; at most --chunked-prefill-size 2048"),
                               (-1, min(4096, context), ""), (8192, min(4096, context), "")):
        monkeypatch.setattr(settings, "view", lambda a, c=chunk: types.SimpleNamespace(
            device="cuda", chunked_prefill_size=c))
        got, why = hook._resolve_min_tokens(args, None, "decode CUDA graphs are off")
        assert (got, why) == (want, "unset: the back half runs eager (decode CUDA graphs are "
                              f"off), and smaller passes are bound by its kernel launches{bound}")


def graph_skip_reason(monkeypatch):
    """back_half_graph_skip_reason on stand-in settings: reason(**changes)."""
    import types

    from sglang.srt.arg_groups import kv_sharing_fast_prefill_settings as settings
    from sglang.srt.model_executor.cuda_graph_config import Backend

    def reason(**over):
        a = {**dict(device="cuda", backend="triton", decode=Backend.FULL, enable_deterministic_inference=False,
                    dcp_size=1, disaggregation_mode="null", locked=set(), decode_bs=[1, 2, 4, 8]), **over}
        return hook.back_half_graph_skip_reason(types.SimpleNamespace(
            view=types.SimpleNamespace(**{k: a[k] for k in (
                "device", "enable_deterministic_inference", "dcp_size", "disaggregation_mode")}),
            graphs=types.SimpleNamespace(decode=types.SimpleNamespace(backend=a["decode"], bs=a["decode_bs"])),
            backends=(a["backend"], a["backend"]), locked=a["locked"],
        ))

    monkeypatch.setattr(settings, "view", lambda ns: ns.view)
    monkeypatch.setattr(settings, "cuda_graph_config", lambda ns: ns.graphs)
    monkeypatch.setattr(settings, "attention_backends", lambda ns: ns.backends)
    monkeypatch.setattr(settings, "explicit_cuda_graph_settings", lambda ns: ns.locked)
    return reason


@pytest.mark.stack("yoco-model", step="back-half-cuda-graphs")
def test_when_start_up_captures_the_back_half(monkeypatch):
    from sglang.srt.environ import envs
    from sglang.srt.model_executor.cuda_graph_config import Backend

    reason = graph_skip_reason(monkeypatch)
    assert reason() is None
    assert reason(device="cpu") == "device cpu"
    assert reason(decode=Backend.DISABLED) == "decode CUDA graphs are off"
    assert "triton only" in reason(backend="trtllm_mha")
    assert reason(enable_deterministic_inference=True) == "--enable-deterministic-inference"
    assert reason(dcp_size=2) == "decode context parallelism"
    # the back half is captured at the decode graphs' sizes up to 64, decided here (the
    # graph runner captures at those): none of them, and it runs eager
    assert reason(decode_bs=[64, 128]) is None
    assert reason(decode_bs=[80, 96]) == "no decode CUDA graph batch size up to 64 (--cuda-graph-bs)"
    with envs.SGLANG_KV_SHARING_FAST_PREFILL_GRAPH.override(False):
        assert reason() == "SGLANG_KV_SHARING_FAST_PREFILL_GRAPH=0"


@pytest.mark.stack("yoco-model", step="back-half-graphs-on-prefill-server", fails_before=True)
def test_a_prefill_server_captures_the_back_half(monkeypatch):
    import types

    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase

    reason = graph_skip_reason(monkeypatch)
    # decode graphs off by the prefill server's role: the back half's own are captured
    assert reason(decode=Backend.DISABLED, disaggregation_mode="prefill") is None
    # off by the user (--disable-cuda-graph, --disable-decode-cuda-graph), or on a decode server: eager
    off = {(Phase.DECODE, "backend")}
    assert reason(decode=Backend.DISABLED, disaggregation_mode="prefill", locked=off) == "decode CUDA graphs are off"
    assert reason(decode=Backend.DISABLED, disaggregation_mode="decode") == "decode CUDA graphs are off"
    assert reason(device="cpu", decode=Backend.DISABLED, disaggregation_mode="prefill") == "device cpu"
    # and the start-up line says whose graphs they are: a prefill server's own unless the
    # user turned decode graphs on there
    def line(mode, decode, locked=frozenset()):
        return hook._graphs_line(types.SimpleNamespace(
            view=types.SimpleNamespace(disaggregation_mode=mode), locked=locked,
            graphs=types.SimpleNamespace(decode=types.SimpleNamespace(backend=decode))), None)

    assert line("prefill", Backend.DISABLED) == "in CUDA graphs (its own: a prefill server captures no decode graphs)"
    assert line("prefill", Backend.FULL, off) == "in CUDA graphs"
    assert line("null", Backend.FULL) == "in CUDA graphs"


@pytest.mark.parametrize("name, architecture, num_shared, num_layers", [
    ("26B-A4B", "Gemma4ForCausalLM", 0, 30),
    ("31B", "Gemma4ForCausalLM", 0, 60),
    ("llama", "LlamaForCausalLM", 0, 2),
    ("llama-kv-shared", "LlamaForCausalLM", 1, 2),
])
def test_model_without_kv_shared_layers_or_fast_prefill_rejected(model, name, architecture, num_shared,
                                                                 num_layers):
    msg = reject(server_args, model(name))
    assert (f"has architecture {architecture} with num_kv_shared_layers={num_shared} "
            f"(num_hidden_layers={num_layers}). Drop {FLAG} for this model.") in msg


# Gemma-3n's join at its step (04-yoco-model gemma3n-fast-prefill-branch).
@pytest.mark.parametrize("architecture", getattr(
    hook, "FAST_PREFILL_ARCHITECTURES", hook.GEMMA4_ARCHITECTURES))
def test_every_fast_prefill_architecture_accepted(e4b_resolved, architecture):
    # The real E2B/E4B checkpoints are *ForConditionalGeneration; their text stack is
    # the same text model.
    assert {"Gemma4ForCausalLM", "Gemma4ForConditionalGeneration",
            "Gemma4UnifiedForConditionalGeneration"} <= set(hook.GEMMA4_ARCHITECTURES)
    config = copy.copy(model_config(e4b_resolved))
    config.hf_config = copy.copy(config.hf_config)
    config.hf_config.architectures = [architecture]
    args = with_model_config(e4b_resolved, config)
    assert hook._check_model(args) == (24, 42)


@pytest.mark.parametrize("algorithm, named", [
    ("EAGLE", "EAGLE"), ("EAGLE3", "EAGLE3"), ("STANDALONE", "STANDALONE"),
    ("NEXTN", "EAGLE"),  # with a draft that is no Gemma-4 assistant: resolved to EAGLE
    # ServerArgs on CPU rejects DFLASH/DSPARK before the hook (a plugin's name too):
    # the hook on resolved arguments
    ("DFLASH", None), ("DSPARK", None), ("SOME_PLUGIN_ALGO", None),
])
def test_speculative_needing_every_token_rejected(model, algorithm, named):
    if named:
        msg = reject(server_args, model("E4B"), speculative_algorithm=algorithm,
                     speculative_draft_model_path=model("E4B"))
    else:
        msg = reject(run_hook, server_args(model("E4B")), speculative_algorithm=algorithm)
    assert f"{FLAG} is incompatible with --speculative-algorithm {named or algorithm}" in msg
    assert "FROZEN_KV_MTP" in msg


@pytest.mark.parametrize("algorithm, draft, resolved_as", [
    ("NEXTN", "assistant", "FROZEN_KV_MTP"),
    ("EAGLE", "assistant", "FROZEN_KV_MTP"),
    ("NGRAM", None, "NGRAM"),
])
def test_speculative_needing_the_last_token_accepted(model, algorithm, draft, resolved_as):
    draft = dict(speculative_draft_model_path=model(draft)) if draft else {}
    args = server_args(model("E4B"), speculative_algorithm=algorithm, **draft)
    assert resolved(args, "speculative_algorithm") == resolved_as
    assert resolved(args, "kv_sharing_fast_prefill") is True
    assert resolved_as in hook.ALLOWED_SPECULATIVE_ALGORITHMS


@pytest.mark.parametrize("device, backend", [
    *[("cuda", b) for b in hook.ALLOWED_ATTENTION_BACKENDS],  # trtllm_mha: Blackwell only
    *[("cpu", b) for b in hook.ALLOWED_ATTENTION_BACKENDS + hook.ALLOWED_CPU_ATTENTION_BACKENDS],
])
def test_allowed_attention_backends_accepted(e4b_resolved, device, backend):
    args = run_hook(e4b_resolved, device=device, attention_backend=backend)
    assert attention_backends(args) == (backend, backend)


def test_deterministic_inference_with_triton_accepted(model):
    # The mode in which the back half is byte-identical to the full pass.
    args = server_args(model("E4B"), attention_backend="triton", enable_deterministic_inference=True)
    assert resolved(args, "kv_sharing_fast_prefill")
    assert resolved(args, "enable_deterministic_inference")
    assert attention_backends(args) == ("triton", "triton")


@pytest.mark.parametrize("fields, phase, backend", [
    # Gemma-4's own check rejects most of these before the hook on CPU.
    *[pytest.param(dict(attention_backend=b), "prefill", b, id=b)
      for b in ("flashinfer", "fa3", "intel_xpu", "torch_native")],  # torch_native: CPU only
    pytest.param(dict(attention_backend="triton", decode_attention_backend="flashinfer"),
                 "decode", "flashinfer", id="decode-flashinfer"),
])
def test_other_attention_backends_rejected(e4b_resolved, fields, phase, backend):
    msg = reject(run_hook, e4b_resolved, device="cuda", **fields)
    assert (f"does not support the {phase} attention backend {backend!r} on device 'cuda' "
            "(supported: triton, trtllm_mha). Set --attention-backend (or "
            f"--{phase}-attention-backend) to one of those, or drop {FLAG}.") in msg


@pytest.mark.parametrize("prefill, decode", [("triton", "trtllm_mha"), ("trtllm_mha", "triton")])
def test_split_prefill_and_decode_backends_rejected(e4b_resolved, prefill, decode):
    # HybridAttnBackend: the back half would run on the other phase's backend.
    msg = reject(run_hook, e4b_resolved, device="cuda",
                 prefill_attention_backend=prefill, decode_attention_backend=decode)
    assert f"(got prefill {prefill!r}, decode {decode!r})" in msg
    assert "--attention-backend" in msg


# Each of the hook's UNSUPPORTED_FEATURES: [(settings that turn it on, through ServerArgs
# (or on resolved arguments: ServerArgs on CPU rejects them first), `got` in the message
# (any of), the fix it names)].
UNSUPPORTED = {
    "pipeline parallelism": [(dict(pp_size=2), False, ["got pp_size=2"], "--pp-size 1")],
    # --enable-dp-attention is a field on 0.5.17; 0.5.23 resolves it into attn_dp_size
    "DP attention": [(dict(enable_dp_attention=True, dp_size=2, tp_size=2), False,
                      ["got attn_dp_size=2"] if RELEASE >= (0, 5, 23)
                      else ["got enable_dp_attention=True"],
                      "--enable-dp-attention")],
    "context parallelism": [
        (dict(attn_cp_size=2, tp_size=2), False, ["got attn_cp_size=2"], "--attn-cp-size 1"),
        (dict(enable_prefill_cp=True, cp_strategy="zigzag"), False,
         ["enable_prefill_cp=True"], "--enable-prefill-cp"),
        # enable_prefill_cp, and on releases that have them its legacy aliases
        *[({f: True}, True, [f"(got {f}=True)"], "--enable-prefill-cp")
          for f in hook.settings.PREFILL_CP_SETTINGS],
    ],
    "two-batch overlap": [(dict(enable_two_batch_overlap=True), False,
                           ["got enable_two_batch_overlap=True"], "--enable-two-batch-overlap")],
    "embedding models": [(dict(is_embedding=True), False, ["got is_embedding=True"],
                          "--is-embedding")],
    # ServerArgs requires flashinfer for --enable-mis, which Gemma-4 rejects first.
    "multi-item scoring": [(dict(enable_mis=True), True, ["(got enable_mis=True)"],
                            "--enable-mis")],
}


def test_every_unsupported_feature_has_cases():
    assert "enable_prefill_cp" in hook.settings.PREFILL_CP_SETTINGS
    assert list(UNSUPPORTED) == [f[0] for f in hook.UNSUPPORTED_FEATURES]


@pytest.mark.parametrize("feature, on, on_resolved, got, fix", [
    pytest.param(feature, *case, id=",".join(case[0])) for feature, cases in UNSUPPORTED.items()
    for case in cases
])
def test_unsupported_features_rejected(model, feature, on, on_resolved, got, fix):
    if on_resolved:
        msg = reject(run_hook, server_args(model("E4B")), **on)
    else:
        msg = reject(server_args, model("E4B"), **on)
    instead = next(f[3] for f in hook.UNSUPPORTED_FEATURES if f[0] == feature)
    assert f"does not support {feature} yet (" in msg
    assert any(g in msg for g in got), msg
    assert fix in instead and f"{instead}, or drop {FLAG}." in msg


@pytest.mark.parametrize("overrides", [
    dict(cuda_graph_backend_prefill="full"), dict(cuda_graph_config={"prefill": {"backend": "full"}}),
    # Breakable is kept only below the threshold: 0 sends every pass to
    # the fast path, 4 leaves no capture size (the smallest is 4) below it.
    *[dict(cuda_graph_backend_prefill="breakable", kv_sharing_fast_prefill_min_tokens=m) for m in (0, 4)],
], ids=["--cuda-graph-backend-prefill", "--cuda-graph-config", "breakable-min0", "breakable-min4"])
def test_pinned_prefill_cuda_graph_rejected(model, overrides):
    msg = reject(server_args, model("E4B"), attention_backend="triton", **overrides)
    for part in ("prefill CUDA graph", "set explicitly", "--kv-sharing-fast-prefill-min-tokens",
                 "--disable-prefill-cuda-graph"):
        assert part in msg


@pytest.mark.parametrize("min_tokens", [4096, 1024, 300])
def test_breakable_prefill_graph_capped_below_threshold(model, caplog, min_tokens):
    # passes below min-tokens keep their graph; capture sizes at or above it are dropped
    from sglang.srt.model_executor.cuda_graph_config import Backend

    breakable = dict(attention_backend="triton", cuda_graph_backend_prefill="breakable")
    plain = prefill_graph(server_args(model("E4B"), kv_sharing_fast_prefill=False, **breakable))
    args, infos, warnings = logged(caplog, server_args, model("E4B"),
                                   kv_sharing_fast_prefill_min_tokens=min_tokens, **breakable)
    graph = prefill_graph(args)
    assert graph.backend == Backend.BREAKABLE
    assert graph.bs == [s for s in plain.bs if s < min_tokens]
    assert graph.max_bs == graph.bs[-1] < min_tokens
    assert any("capped" in m for m in infos) == (plain.max_bs >= min_tokens)
    # nothing but a threshold above the largest pass (CPU's chunked prefill) is named
    assert all("more new tokens than any prefill pass holds" in w for w in warnings), warnings


def _with_prefill_graph(args, **prefill):
    """``args`` with a prefill CUDA graph that nobody set (a platform's default)."""
    config = copy.deepcopy(resolved(args, "cuda_graph_config"))
    for name, value in prefill.items():
        setattr(config.prefill, name, value)
    return with_fields(args, cuda_graph_config=config), config


def test_defaulted_breakable_prefill_graph_capped_quietly(e4b_resolved, caplog):
    # the CUDA default (breakable, as a GPU server resolves it) is capped too
    from sglang.srt.model_executor.cuda_graph_config import Backend

    args = breakable_on_gpu(e4b_resolved, chunk=8192)  # an H100's chunked prefill
    _, _, warnings = logged(caplog, handle, args)
    graph = prefill_graph(args)
    assert (graph.backend, graph.bs, graph.max_bs) == (Backend.BREAKABLE, [256, 2048, 3840], 3840)
    assert resolved(args, "kv_sharing_fast_prefill_min_tokens") == 4096
    assert not warnings


def breakable_on_gpu(e4b_resolved, chunk):
    """A GPU server's defaulted breakable prefill graph, min-tokens unset again (this CPU
    machine resolved it)."""
    from sglang.srt.model_executor.cuda_graph_config import Backend

    _, config = _with_prefill_graph(e4b_resolved, backend=Backend.BREAKABLE,
                                    bs=[256, 2048, 3840, 4096, 8192], max_bs=8192)
    return with_fields(e4b_resolved, cuda_graph_config=config, chunked_prefill_size=chunk,
                       kv_sharing_fast_prefill_min_tokens=None)


def test_pinned_capture_sizes_above_threshold_dropped_with_warning(model, caplog):
    from sglang.srt.model_executor.cuda_graph_config import Backend

    args, _, (warning,) = logged(
        caplog, server_args, model("E4B"), attention_backend="triton", chunked_prefill_size=8192,
        cuda_graph_config={"prefill": {"backend": "breakable", "bs": [256, 2048, 8192]}})
    graph = prefill_graph(args)
    assert (graph.backend, graph.bs, graph.max_bs) == (Backend.BREAKABLE, [256, 2048], 2048)
    assert "capped at 2048 tokens" in warning and ">= 4096" in warning


def test_defaulted_prefill_cuda_graph_turned_off_with_one_warning(e4b_resolved, caplog):
    # a defaulted prefill graph that is not breakable is turned off; decode graphs stay
    from sglang.srt.model_executor.cuda_graph_config import Backend

    args, config = _with_prefill_graph(e4b_resolved, backend=Backend.FULL)
    _, _, (warning,) = logged(caplog, handle, args)
    assert prefill_graph(args).backend == Backend.DISABLED
    assert resolved(args, "cuda_graph_config").decode == config.decode
    assert "Disabling prefill CUDA graph" in warning and FLAG in warning


@pytest.mark.parametrize("overrides", [dict(disable_prefill_cuda_graph=True), dict(disable_cuda_graph=True)],
                         ids=["--disable-prefill-cuda-graph", "--disable-cuda-graph"])
def test_disabled_prefill_cuda_graph_accepted_quietly(model, caplog, overrides):
    from sglang.srt.model_executor.cuda_graph_config import Backend

    args, _, warnings = logged(caplog, server_args, model("E4B"), attention_backend="triton", **overrides)
    assert prefill_graph(args).backend == Backend.DISABLED
    assert not warnings
