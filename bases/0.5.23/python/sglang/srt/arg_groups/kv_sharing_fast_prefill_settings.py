"""How the --kv-sharing-fast-prefill hook reads and decides server arguments.

The hook's rules (kv_sharing_fast_prefill_hook.py) are release-independent;
how resolution exposes settings and records decisions is not. This module is
that part, for a ServerArgs resolved by ``resolve_once``: the record holds the
operator's input and is sealed during resolution, settings are read through
the resolving view, and decisions are declared with ``declare_resolution``.
"""

from __future__ import annotations

from typing import Any, List, Tuple

import msgspec

from sglang.srt.arg_groups.arg_utils import record_fields
from sglang.srt.arg_groups.overrides import (
    attention_backends_of,
    declare_resolution,
    model_config_of,
    resolved_view,
    resolving_view,
)
from sglang.srt.runtime_context import attn_dp_enabled_of

# Where the hook's decisions come from, in the declaration stash.
SOURCE = "handle_kv_sharing_fast_prefill"

# Settings that turn on prefill context parallelism besides attn_cp_size.
PREFILL_CP_SETTINGS = ("enable_prefill_cp",)

# DP attention as the hook's list of unsupported features has it: (settings
# shown, is it on?, what to do instead). handle_deprecated_dp_attention has
# turned --enable-dp-attention into attn_dp_size before the hook runs.
DP_ATTENTION = (
    ("attn_dp_size",),
    lambda view: attn_dp_enabled_of(view),
    "use --attn-dp-size 1 (without --enable-dp-attention)",
)


def view(server_args: Any) -> Any:
    """What resolution has decided so far, read-only."""
    return resolving_view(server_args)


def model_config(server_args: Any) -> Any:
    return model_config_of(server_args)


def attention_backends(server_args: Any) -> Tuple[str, str]:
    """(prefill, decode) attention backends as resolved so far."""
    return attention_backends_of(resolved_view(server_args))


def cuda_graph_config(server_args: Any) -> Any:
    return resolving_view(server_args).cuda_graph_config


def explicit_cuda_graph_settings(server_args: Any) -> Any:
    """The (phase, field) CUDA graph settings given explicitly (by a flag or
    --cuda-graph-config), which resolution keeps as given."""
    return server_args._cuda_graph_config_locked


def prefill_capture_sizes(server_args: Any, max_bs: int) -> List[int]:
    """The prefill CUDA graph's default capture sizes up to ``max_bs`` tokens."""
    from sglang.srt.arg_groups.cuda_graph_hook import (
        generate_prefill_cuda_graph_batch_sizes,
    )

    return generate_prefill_cuda_graph_batch_sizes(max_bs)


def field_default(server_args: Any, name: str) -> Any:
    for field in record_fields(type(server_args)):
        if field.name == name:
            return None if field.default is msgspec.NODEFAULT else field.default
    return None


def decide_prefill_cuda_graph(server_args: Any, **changes: Any) -> None:
    """Declare the prefill phase's CUDA graph ``backend``, ``bs`` or ``max_bs``."""
    from sglang.srt.model_executor.cuda_graph_config import Phase, with_phase

    config = with_phase(cuda_graph_config(server_args), Phase.PREFILL, **changes)
    declare_resolution(server_args, SOURCE, cuda_graph_config=config)


def decide_min_tokens(server_args: Any, min_tokens: int) -> None:
    declare_resolution(
        server_args, SOURCE, kv_sharing_fast_prefill_min_tokens=min_tokens
    )


def decide_back_half_graphs(server_args: Any, captured: bool) -> None:
    declare_resolution(
        server_args, SOURCE, kv_sharing_fast_prefill_back_half_graphs=captured
    )
