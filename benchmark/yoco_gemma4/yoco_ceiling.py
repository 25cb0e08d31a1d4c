"""The YOCO ceiling as an engine: the fast path on the full model with its back half taken out.

checkpoints.ceiling_kwargs() serves the full model with --kv-sharing-fast-prefill,
min tokens 0 (the fast path on every prefill pass, as on-all) and a --forward-hooks
entry whose factory is `no_back_half`: SGLang calls it in each model runner's process
once the model is built, and it registers no hook. It makes the model runner's planner
plan every fast-prefill pass as one in which no request's prefill ends, the fork's own
plan for an unfinished chunk (a FrontOnlyPlan). Each prefill pass then runs, by the
fast path's own code and on the same weights:

- the embedding and the per-layer inputs, as the full pass (and the fast path)
  computes them;
- the front layers on every token;
- the final norm and the logits of each request's last token (LogitsProcessor),

and nothing of the back half: no rows staged, none of its layers, no scatter of its
rows. So the ceiling does exactly the fast path's work outside the back half, by
construction, and on-all's time over the ceiling's is what the back half costs.
Decode passes are unchanged (the whole model); the bench times prefill only
(max_new_tokens=1).
"""

import torch

# Never read: a plan with no rows runs no back half (FrontOnlyPlan).
_NO_INDEX = torch.empty(0, dtype=torch.int64)


def no_back_half(config):
    """The --forward-hooks factory: plan every fast-prefill pass without back-half rows.
    Returns None, so SGLang registers no hook (nothing runs per pass)."""
    from sglang.srt.model_executor import kv_sharing_fast_prefill_planner as planner

    if not hasattr(planner, "back_half_rows"):
        raise RuntimeError("yoco_ceiling: this fork's kv_sharing_fast_prefill_planner plans no back_half_rows; "
                           "update benchmark/yoco_gemma4/yoco_ceiling.py")
    planner.back_half_rows = no_rows
    return None


def no_rows(forward_batch, first_shared_layer):
    """back_half_rows for a pass in which no request's prefill ends."""
    from sglang.srt.model_executor.kv_sharing_fast_prefill_plan import BackHalfRows

    return BackHalfRows(first_shared_layer=first_shared_layer, token_index=_NO_INDEX, req_index=_NO_INDEX,
                        seq_lens_cpu=(), prefix_lens_cpu=())
