"""Validation for --triton-attention-split-kv-verify.

The flag makes the triton backend verify a speculative draft chain (topk 1) as
decode queries through the split-KV decode kernel
(``layers/attention/triton_chain_verify.py``). Unset, this hook turns it on for
FROZEN_KV_MTP where it applies; set, it rejects settings where it cannot
apply, naming the setting and what to do.

Called from ``ServerArgs.__post_init__`` after ``handle_speculative_decoding``
(algorithm and topk resolved).
"""

from __future__ import annotations

import logging
from typing import Any

# The server arguments being resolved (sglang.srt.server_args.ServerArgs), by
# name only: their resolution imports this hook.
ServerArgs = Any

logger = logging.getLogger(__name__)

FLAG = "--triton-attention-split-kv-verify"


def _on_by_default(server_args: ServerArgs, view) -> bool:
    """Unset: on for FROZEN_KV_MTP with a top-1 chain on triton. There the
    split-KV verify removes the per-step walk over each request's whole context,
    and its greedy output is at least as close to the target's own as the
    extend kernel's (same number of outputs identical to no speculation, first
    tokens all equal, in a 200-prompt check). Deterministic inference keeps the
    extend kernel, the batch-invariant one."""
    backends = server_args._resolved_attention_backends()
    return (
        view.speculative_algorithm == "FROZEN_KV_MTP"
        and view.speculative_eagle_topk == 1
        and not view.enable_deterministic_inference
        and all(b == "triton" for b in backends)
    )


def handle_triton_split_kv_verify(server_args: ServerArgs) -> None:
    from sglang.srt.arg_groups.overrides import resolved_view

    view = resolved_view(server_args)
    if view.triton_attention_split_kv_verify is None:
        on = _on_by_default(server_args, view)
        server_args.triton_attention_split_kv_verify = on
        if on:
            logger.info(
                "Triton split-KV verify on (default for FROZEN_KV_MTP with topk 1 on "
                "triton): each draft token attends as a decode query; "
                "--no-triton-attention-split-kv-verify keeps the extend-kernel verify"
            )
        return
    if not view.triton_attention_split_kv_verify:
        return
    if view.speculative_algorithm is None:
        raise ValueError(
            f"{FLAG} changes how speculative draft tokens are verified, but no "
            "--speculative-algorithm is set: set one, or drop the flag."
        )
    if view.speculative_eagle_topk != 1:
        raise ValueError(
            f"{FLAG} needs --speculative-eagle-topk 1 (got "
            f"{view.speculative_eagle_topk}): only a draft chain's tokens are "
            "decode queries; a draft tree needs the extend kernel's tree mask. "
            "Use topk 1, or drop the flag."
        )
    if view.enable_deterministic_inference:
        raise ValueError(
            f"{FLAG} is incompatible with --enable-deterministic-inference, which "
            "verifies with triton's batch-invariant unified kernel: drop one of them."
        )
    for phase, backend in zip(
        ("prefill", "decode"), server_args._resolved_attention_backends()
    ):
        if backend is not None and backend != "triton":
            raise ValueError(
                f"{FLAG} applies to the triton attention backend, but the {phase} "
                f"backend is {backend!r}: use --attention-backend triton, or drop the flag."
            )
    logger.info(
        "Triton split-KV verify on: each draft token of a verify pass attends as a "
        "decode query (split-KV decode kernel) instead of through the extend kernel"
    )
