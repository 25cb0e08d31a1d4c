"""Validation for --kv-sharing-fast-prefill (YOCO fast prefill for Gemma-4
and Gemma-3n).

Gemma-4 E2B/E4B and Gemma-3n E2B/E4B have ``num_kv_shared_layers > 0``: the back half of the
decoder writes no KV cache and reads the KV of an earlier layer. During
prefill only the last token of each request has to pass through those layers
("You Only Cache Once"). The flag is read by the model as
``get_exec().features.kv_sharing_fast_prefill``; this hook decides at start-up
whether the configuration allows it and rejects the rest with a message that
names the offending setting.

Runs right after ``handle_speculative_decoding`` (speculative aliases
resolved). It reads and decides settings only through
``kv_sharing_fast_prefill_settings``, which holds what differs between
releases' server-argument resolution.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional, Tuple

from sglang.srt.arg_groups import kv_sharing_fast_prefill_settings as settings

# The server arguments being resolved (sglang.srt.server_args.ServerArgs), by
# name only: their resolution imports this hook.
ServerArgs = Any

logger = logging.getLogger(__name__)

FLAG = "--kv-sharing-fast-prefill"

# --kv-sharing-fast-prefill-min-tokens when unset: below it, a prefill pass is
# bound by kernel launches and an eager back half costs about as much host time
# as it saves.
DEFAULT_MIN_TOKENS = 4096

# Target architectures whose text stack is gemma4_causal.Gemma4TextModel.
GEMMA4_ARCHITECTURES = (
    "Gemma4ForCausalLM",
    "Gemma4ForConditionalGeneration",
    "Gemma4UnifiedForConditionalGeneration",
)
# Target architectures whose text stack is gemma3n_causal.Gemma3nTextModel.
GEMMA3N_ARCHITECTURES = (
    "Gemma3nForCausalLM",
    "Gemma3nForConditionalGeneration",
)
# Those whose text model runs the fast prefill (SupportsKVSharingFastPrefill).
FAST_PREFILL_ARCHITECTURES = GEMMA4_ARCHITECTURES + GEMMA3N_ARCHITECTURES

# Speculative algorithms that only need the last prefill token's hidden state
# (or none at all). Every other algorithm (EAGLE, EAGLE3, STANDALONE, DFLASH,
# DSPARK, plugins) needs hidden states or logits of every prefill token.
# NEXTN is listed for completeness: handle_speculative_decoding resolves it to
# FROZEN_KV_MTP (Gemma-4 assistant draft) or EAGLE before this hook runs.
ALLOWED_SPECULATIVE_ALGORITHMS = (None, "FROZEN_KV_MTP", "NEXTN", "NGRAM")

# Attention backends whose back-half metadata the fast prefill builds and tests
# (layers/kv_sharing_fast_prefill.py, test/srt/test_gemma4_yoco.py): triton
# into private twins of its index buffers, trtllm_mha (SM100) as it is (its
# eager metadata is allocated per call; the sliding window is applied by its
# kernels, alike in prefill and decode). Add a backend only with such tests.
ALLOWED_ATTENTION_BACKENDS = ("triton", "trtllm_mha")
ALLOWED_CPU_ATTENTION_BACKENDS = ("torch_native",)


def _cp_enabled(view: Any) -> bool:
    return (view.attn_cp_size or 1) > 1 or any(
        bool(getattr(view, name)) for name in settings.PREFILL_CP_SETTINGS
    )


# Features the model's fast-prefill branch does not support yet, one entry
# each: (feature, settings shown in the message, is it on?, what to do
# instead). Remove an entry once the model supports that feature.
UNSUPPORTED_FEATURES: List[Tuple[str, Tuple[str, ...], Callable[[Any], bool], str]] = [
    (
        "pipeline parallelism",
        ("pp_size",),
        lambda v: (v.pp_size or 1) > 1,
        "use --pp-size 1",
    ),
    ("DP attention",) + settings.DP_ATTENTION,
    (
        "context parallelism",
        ("attn_cp_size",) + settings.PREFILL_CP_SETTINGS,
        _cp_enabled,
        "use --attn-cp-size 1 without --enable-prefill-cp",
    ),
    (
        "two-batch overlap",
        ("enable_two_batch_overlap",),
        lambda v: bool(v.enable_two_batch_overlap),
        "drop --enable-two-batch-overlap",
    ),
    (
        "embedding models",
        ("is_embedding",),
        lambda v: bool(v.is_embedding),
        "drop --is-embedding (serve the model for generation)",
    ),
    (
        "multi-item scoring",
        ("enable_mis",),
        lambda v: bool(v.enable_mis),
        "drop --enable-mis",
    ),
]


def _check_model(server_args: ServerArgs) -> Tuple[int, int]:
    """(first KV-shared layer, num_hidden_layers); rejects models without any."""
    model_config = settings.model_config(server_args)
    architectures = list(getattr(model_config.hf_config, "architectures", None) or [])
    text_config = model_config.hf_text_config
    num_shared = getattr(text_config, "num_kv_shared_layers", None) or 0
    num_layers = text_config.num_hidden_layers
    supported = any(arch in FAST_PREFILL_ARCHITECTURES for arch in architectures)
    if not supported or num_shared <= 0 or num_shared >= num_layers:
        raise ValueError(
            f"{FLAG} needs a Gemma-4 or Gemma-3n model with KV-shared layers "
            "(Gemma-4 E2B/E4B, Gemma-3n E2B/E4B), but "
            f"{settings.view(server_args).model_path} has architecture "
            f"{', '.join(architectures) or 'unknown'} with "
            f"num_kv_shared_layers={num_shared} (num_hidden_layers={num_layers}). "
            f"Drop {FLAG} for this model."
        )
    return num_layers - num_shared, num_layers


def _check_speculative(algorithm: Optional[str]) -> None:
    if algorithm in ALLOWED_SPECULATIVE_ALGORITHMS:
        return
    raise ValueError(
        f"{FLAG} is incompatible with --speculative-algorithm {algorithm}: "
        "its draft needs the hidden states or logits of every prefill token, "
        "which the fast prefill skips in the KV-shared layers. Use NGRAM, or "
        "NEXTN with a Gemma-4 assistant draft (runs as FROZEN_KV_MTP; NEXTN "
        f"with any other draft becomes EAGLE), or drop {FLAG}."
    )


def _check_attention_backends(server_args: ServerArgs) -> None:
    device = settings.view(server_args).device
    allowed = ALLOWED_ATTENTION_BACKENDS
    if device == "cpu":
        allowed = allowed + ALLOWED_CPU_ATTENTION_BACKENDS
    prefill, decode = settings.attention_backends(server_args)
    for phase, backend in (("prefill", prefill), ("decode", decode)):
        if backend not in allowed:
            raise ValueError(
                f"{FLAG} does not support the {phase} attention backend "
                f"{backend!r} on device {device!r} (supported: "
                f"{', '.join(allowed)}). Set --attention-backend (or "
                f"--{phase}-attention-backend) to one of those, or drop {FLAG}."
            )
    # The back half runs each prefill's last token as a decode step of the
    # backend serving the pass. With a prefill/decode split (HybridAttnBackend)
    # that step would go to the decode backend, whose kernel, metadata and
    # sliding window are not the ones the prefill computes with.
    if prefill != decode:
        raise ValueError(
            f"{FLAG} needs the same attention backend for prefill and decode "
            f"(got prefill {prefill!r}, decode {decode!r}): its KV-shared layers "
            "run the last token of each prefill as a decode step, which a split "
            "backend would hand to the decode backend instead of the prefill's. "
            "Set only --attention-backend (no --prefill-attention-backend/"
            f"--decode-attention-backend), or drop {FLAG}."
        )


def _check_unsupported_features(server_args: ServerArgs, view: Any) -> None:
    for feature, names, is_on, instead in UNSUPPORTED_FEATURES:
        if is_on(view):
            # Name the settings that differ from their defaults.
            changed = [
                n
                for n in names
                if getattr(view, n) != settings.field_default(server_args, n)
            ]
            got = ", ".join(f"{n}={getattr(view, n)!r}" for n in changed or names)
            raise ValueError(
                f"{FLAG} does not support {feature} yet (got {got}): "
                f"{instead}, or drop {FLAG}."
            )


def _cap_breakable_prefill_graph(server_args: ServerArgs, min_tokens: int) -> bool:
    """Keep the breakable prefill graph for passes below ``min_tokens``.

    Those passes run every layer on every token, exactly as without the flag,
    so a graph captured at such a size replays them unchanged; passes of
    ``min_tokens`` or more exceed the largest capture size and run eager, where
    the fast path applies. False when no capture size is left below it."""
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase

    cfg = settings.cuda_graph_config(server_args).prefill
    if cfg.backend != Backend.BREAKABLE or min_tokens <= 0:
        return False
    sizes = cfg.bs
    if sizes is None:
        sizes = settings.prefill_capture_sizes(
            server_args, cfg.max_bs or settings.view(server_args).chunked_prefill_size
        )
    kept = sorted(s for s in sizes if s < min_tokens)
    if not kept:
        return False
    if len(kept) < len(sizes):
        pinned = {(Phase.PREFILL, "bs"), (Phase.PREFILL, "max_bs")}
        log = (
            logger.warning
            if pinned & settings.explicit_cuda_graph_settings(server_args)
            else logger.info
        )
        log(
            "Prefill CUDA graph (%s) capped at %d tokens because %s is on: passes "
            "of >= %d new tokens (--kv-sharing-fast-prefill-min-tokens) take the "
            "fast path, whose KV-shared layers run on a data-dependent number of "
            "tokens, and run eager; smaller passes replay the graph as before.",
            cfg.backend,
            kept[-1],
            FLAG,
            min_tokens,
        )
    settings.decide_prefill_cuda_graph(server_args, bs=kept, max_bs=kept[-1])
    return True


def _handle_prefill_cuda_graph(server_args: ServerArgs, min_tokens: int) -> None:
    """The fast prefill gathers each request's last token before the
    KV-shared layers, a data-dependent shape a captured prefill graph cannot
    replay; decode graphs are unaffected. A breakable prefill graph is kept
    for the passes below the threshold; any other one is turned off."""
    from sglang.srt.model_executor.cuda_graph_config import Backend, Phase

    backend = settings.cuda_graph_config(server_args).prefill.backend
    if backend == Backend.DISABLED:
        return
    if _cap_breakable_prefill_graph(server_args, min_tokens):
        return
    if (Phase.PREFILL, "backend") in settings.explicit_cuda_graph_settings(server_args):
        raise ValueError(
            f"{FLAG} cannot keep the prefill CUDA graph (backend {backend!r}) "
            f"that was set explicitly: it keeps only a {Backend.BREAKABLE!r} one, "
            "for the passes below --kv-sharing-fast-prefill-min-tokens "
            f"({min_tokens}), with capture sizes below that. Use "
            "--cuda-graph-backend-prefill breakable with a larger min-tokens, "
            "drop the prefill backend setting (--cuda-graph-backend-prefill or "
            "--cuda-graph-config) so it is turned off automatically, or pass "
            "--disable-prefill-cuda-graph."
        )
    logger.warning(
        "Disabling prefill CUDA graph (%s) because %s is on: the KV-shared "
        "layers run on a data-dependent number of tokens that a captured "
        "prefill graph cannot replay (decode CUDA graphs are left as they are).",
        backend,
        FLAG,
    )
    settings.decide_prefill_cuda_graph(server_args, backend=Backend.DISABLED)


def back_half_graph_skip_reason(server_args: ServerArgs) -> Optional[str]:
    """None when start-up captures the back half in CUDA graphs
    (KVSharedBackHalfGraphRunner), else why it runs eager. Decided here, once,
    because the min-tokens default depends on it."""
    from sglang.srt.environ import envs
    from sglang.srt.model_executor.cuda_graph_config import Backend

    view = settings.view(server_args)
    if not envs.SGLANG_KV_SHARING_FAST_PREFILL_GRAPH.get():
        return "SGLANG_KV_SHARING_FAST_PREFILL_GRAPH=0"
    if view.device != "cuda":
        return f"device {view.device}"
    decode_graphs = settings.cuda_graph_config(server_args).decode.backend
    if decode_graphs == Backend.DISABLED and not _prefill_server_role(server_args):
        return "decode CUDA graphs are off"
    backend, _ = settings.attention_backends(server_args)
    if backend != "triton":
        return f"attention backend {backend} (triton only)"
    if view.enable_deterministic_inference:
        # The back half is extend-shaped there (rounds exactly as the pass).
        return "--enable-deterministic-inference"
    if (view.dcp_size or 1) > 1:
        return "decode context parallelism"
    from sglang.srt.model_executor.runner.kv_shared_back_half_graph_runner import (
        MAX_BS,
        capture_batch_sizes,
    )

    if not capture_batch_sizes(settings.cuda_graph_config(server_args).decode.bs):
        return f"no decode CUDA graph batch size up to {MAX_BS} (--cuda-graph-bs)"
    return None


def _prefill_server_role(server_args: ServerArgs) -> bool:
    """A prefill server of PD disaggregation, whose decode CUDA graphs are off
    by its role (it never decodes), not by the user: the back half's graphs
    are its own and are captured there too."""
    from sglang.srt.model_executor.cuda_graph_config import Phase

    explicit = settings.explicit_cuda_graph_settings(server_args)
    return (
        settings.view(server_args).disaggregation_mode == "prefill"
        and (Phase.DECODE, "backend") not in explicit
    )


def largest_prefill_pass(server_args: ServerArgs) -> Tuple[int, str]:
    """(the most new tokens one prefill pass holds, the setting that bounds it)."""
    context = settings.model_config(server_args).context_len
    chunk = settings.view(server_args).chunked_prefill_size
    if chunk is not None and 0 < chunk < context:
        return chunk, "--chunked-prefill-size"
    return context, "the context length"


def _resolve_min_tokens(
    server_args: ServerArgs, min_tokens: Optional[int], graphs_skip: Optional[str]
):
    """(--kv-sharing-fast-prefill-min-tokens, why), resolved once: every later
    reader reads the number. Caps or turns off the prefill CUDA graph to match.
    ``graphs_skip``: why the back half runs eager, or None (CUDA graphs)."""
    largest, bound = largest_prefill_pass(server_args)
    if min_tokens is not None:
        _handle_prefill_cuda_graph(server_args, min_tokens)
        if min_tokens > largest:
            # Accepted (the server works, as without the flag), but said: the
            # setting reads as if the fast path could run.
            logger.warning(
                "--kv-sharing-fast-prefill-min-tokens %d is more new tokens than "
                "any prefill pass holds (%d, %s), so no pass takes the fast path "
                "of %s. Set it to at most %d, or leave it unset.",
                min_tokens,
                largest,
                bound,
                FLAG,
                largest,
            )
        return min_tokens, "--kv-sharing-fast-prefill-min-tokens"
    # Where short passes are bound by the eager back half's kernel launches
    # they run in full; never above the largest pass, or no pass would gain.
    eager_min = min(DEFAULT_MIN_TOKENS, largest)
    if _cap_breakable_prefill_graph(server_args, eager_min):
        return eager_min, "unset: the prefill CUDA graph replays smaller passes"
    _handle_prefill_cuda_graph(server_args, eager_min)
    if graphs_skip is None:
        # With the launches captured, short passes gain too.
        return 0, "unset: the back half replays CUDA graphs"
    if settings.view(server_args).device == "cpu":
        return 0, "unset: on CPU no kernel launches bound a short pass"
    return eager_min, (
        f"unset: the back half runs eager ({graphs_skip}), and smaller passes are "
        "bound by its kernel launches"
        + (f"; at most {bound} {largest}" if eager_min < DEFAULT_MIN_TOKENS else "")
    )


def handle_kv_sharing_fast_prefill(server_args: ServerArgs) -> None:
    """Validate --kv-sharing-fast-prefill and resolve its min-tokens; may cap or
    turn off the prefill graph."""
    view = settings.view(server_args)
    min_tokens = view.kv_sharing_fast_prefill_min_tokens
    if not view.kv_sharing_fast_prefill:
        if min_tokens is not None:
            # Said once at start-up: accepted silently, the setting reads as if
            # the fast prefill were on. Not refused, so that an A/B run can
            # toggle the flag alone.
            logger.warning(
                "--kv-sharing-fast-prefill-min-tokens %d has no effect: KV-sharing "
                "fast prefill (YOCO) is off without %s, and the setting only says "
                "from how many new tokens a prefill pass takes the fast path.",
                min_tokens,
                FLAG,
            )
        return

    if min_tokens is not None and min_tokens < 0:
        raise ValueError(
            "--kv-sharing-fast-prefill-min-tokens must be >= 0 (got "
            f"{min_tokens}): it is the smallest prefill pass, in new tokens, "
            "that takes the fast path; use 0 for every pass, or leave it unset."
        )
    first_shared, num_layers = _check_model(server_args)
    _check_speculative(view.speculative_algorithm)
    _check_attention_backends(server_args)
    _check_unsupported_features(server_args, view)
    configured = min_tokens
    graphs_skip = back_half_graph_skip_reason(server_args)
    settings.decide_back_half_graphs(server_args, graphs_skip is None)
    min_tokens, why = _resolve_min_tokens(server_args, min_tokens, graphs_skip)
    if min_tokens != configured:
        settings.decide_min_tokens(server_args, min_tokens)

    logger.info(
        "KV-sharing fast prefill (YOCO) on: first KV-shared layer %d of %d; "
        "prefill passes of >= %d new tokens (%s) run layers %d-%d for the last "
        "token of each request only, %s",
        first_shared,
        num_layers,
        min_tokens,
        why,
        first_shared,
        num_layers - 1,
        _graphs_line(server_args, graphs_skip),
    )


def _graphs_line(server_args: ServerArgs, graphs_skip: Optional[str]) -> str:
    if graphs_skip is not None:
        return f"eager ({graphs_skip})"
    from sglang.srt.model_executor.cuda_graph_config import Backend

    if (
        _prefill_server_role(server_args)
        and settings.cuda_graph_config(server_args).decode.backend == Backend.DISABLED
    ):
        return "in CUDA graphs (its own: a prefill server captures no decode graphs)"
    return "in CUDA graphs"
