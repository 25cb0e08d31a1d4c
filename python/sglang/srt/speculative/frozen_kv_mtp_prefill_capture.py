"""Hidden-state capture for the FROZEN_KV_MTP target prefill.

After the target prefill, the frozen-KV draft is seeded with one hidden row
per request, the last prompt token's (``select_last_extend_hidden``).
Stock SGLang nevertheless overrides the capture to FULL, which keeps every
prompt token's hidden state alive and makes every prefill look like it needs
all tokens' outputs, so KV-sharing fast prefill (YOCO) never fires under MTP.

The override replaces the mode ``ForwardBatch.init_new`` would derive from the
batch, so the target asks for LAST *and* for whatever the requests or the
server asked for: a request with ``return_hidden_states`` still gets FULL.
The caller passes the server's mode (``get_server_return_hidden_states_mode``,
whose arguments differ between releases).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sglang.srt.model_executor.forward_batch_info import (
    CaptureHiddenMode,
    get_required_capture_hidden_mode,
)

if TYPE_CHECKING:
    from sglang.srt.managers.schedule_batch import ScheduleBatch


def target_prefill_capture_mode(
    batch: ScheduleBatch, server_mode: CaptureHiddenMode
) -> CaptureHiddenMode:
    """LAST for the draft seed, raised to what the batch or server needs."""
    requested = max(
        CaptureHiddenMode.LAST, batch.return_hidden_states_mode, server_mode
    )
    return get_required_capture_hidden_mode(requested, batch.spec_info)
