"""Adaptive speculation (``--speculative-adaptive``) for FROZEN_KV_MTP.

``FrozenKVMTPWorkerV2`` inherits EAGLE v2's adaptive machinery (one runtime
state per candidate step count, switched by batch size and acceptance). Two
pieces differ for the frozen drafter and live here:

- each runtime state gets a draft attention backend of its own: a draft CUDA
  graph runner sizes its backend's graph buffers at capture, so two runners
  sharing one backend would leave the first reading buffers the second
  replaced;
- at 0 draft steps the target verifies only the previous bonus token, a plain
  decode (EAGLE v2's one-node verify input, tagged as a frozen verify input).
  Unlike EAGLE there is no draft KV to keep warm: the next seed is the bonus
  token plus the target's hidden row, which the 0-step verify produces too, so
  moving back up to drafting loses nothing.
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING

from sglang.srt.speculative.frozen_kv_mtp_info import FrozenKVMTPVerifyInput

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import ScheduleBatch


def init_state_draft_attn_backend(draft_worker) -> None:
    """Give ``draft_worker`` a fresh draft backend for the runtime state being
    built (``EAGLEWorkerV2.build_adaptive_runtime_state`` calls this inside
    its override of the step count, then captures the draft graphs)."""
    runner = draft_worker.draft_model_runner
    draft_worker.draft_attn_backend = runner._get_attention_backend()
    runner.draft_attn_backend = draft_worker.draft_attn_backend
    # A state whose draft captures no graph (0 steps, or 1 where the one-step
    # draft has none) would otherwise keep the runner of the state built
    # before it (captured for other steps).
    draft_worker.cuda_graph_runner = None


def zero_step_verify_input(worker, batch: ScheduleBatch) -> FrozenKVMTPVerifyInput:
    """The verify input of a 0-step round: the bonus token alone."""
    trivial = worker._build_trivial_verify_input(batch)
    return FrozenKVMTPVerifyInput(
        **{f.name: getattr(trivial, f.name) for f in fields(trivial) if f.init}
    )
