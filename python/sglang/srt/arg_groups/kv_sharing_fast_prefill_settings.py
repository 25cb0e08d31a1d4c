"""How the --kv-sharing-fast-prefill hook reads and decides server arguments.

The hook's rules (kv_sharing_fast_prefill_hook.py) are release-independent;
how resolution exposes settings and records decisions is not. This module is
that part, for a ServerArgs that resolves in ``__post_init__`` and whose hooks
set the values they decide on the record.
"""

from __future__ import annotations

import dataclasses
from typing import Any, List, Tuple

# Settings that turn on prefill context parallelism besides attn_cp_size. The
# last two are legacy aliases that _handle_legacy_cp_arguments normally
# mirrors into enable_prefill_cp already.
PREFILL_CP_SETTINGS = (
    "enable_prefill_cp",
    "enable_prefill_context_parallel",
    "enable_dsa_prefill_context_parallel",
)

# DP attention as the hook's list of unsupported features has it: (settings
# shown, is it on?, what to do instead).
DP_ATTENTION = (
    ("enable_dp_attention",),
    lambda view: bool(view.enable_dp_attention),
    "drop --enable-dp-attention",
)


def view(server_args: Any) -> Any:
    """What resolution has decided so far, read-only."""
    from sglang.srt.arg_groups.overrides import resolved_view

    return resolved_view(server_args)


def model_config(server_args: Any) -> Any:
    return server_args.get_model_config()


def attention_backends(server_args: Any) -> Tuple[str, str]:
    """(prefill, decode) attention backends as resolved so far."""
    return server_args._resolved_attention_backends()


def cuda_graph_config(server_args: Any) -> Any:
    return server_args.cuda_graph_config


def explicit_cuda_graph_settings(server_args: Any) -> Any:
    """The (phase, field) CUDA graph settings given explicitly (by a flag or
    --cuda-graph-config), which resolution keeps as given."""
    return server_args._cuda_graph_config_locked


def prefill_capture_sizes(server_args: Any, max_bs: int) -> List[int]:
    """The prefill CUDA graph's default capture sizes up to ``max_bs`` tokens."""
    return server_args._generate_prefill_cuda_graph_batch_sizes(max_bs)


def field_default(server_args: Any, name: str) -> Any:
    for field in dataclasses.fields(server_args):
        if field.name == name:
            return field.default
    return None


def decide_prefill_cuda_graph(server_args: Any, **changes: Any) -> None:
    """Set the prefill phase's CUDA graph ``backend``, ``bs`` or ``max_bs``."""
    prefill = server_args.cuda_graph_config.prefill
    for name, value in changes.items():
        setattr(prefill, name, value)


def decide_min_tokens(server_args: Any, min_tokens: int) -> None:
    server_args.kv_sharing_fast_prefill_min_tokens = min_tokens


def decide_back_half_graphs(server_args: Any, captured: bool) -> None:
    server_args.kv_sharing_fast_prefill_back_half_graphs = captured
