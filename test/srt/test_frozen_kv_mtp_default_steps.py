"""FROZEN_KV_MTP with only --speculative-algorithm and the assistant: the step counts
unset by the user take the EAGLE family's defaults (3 steps, top-1, 4 draft tokens),
which start-up multiplies (the tokenizer manager's reserved output slots)."""

import pytest
from resolved_server_args import resolved
from test_kv_sharing_fast_prefill_args import model, server_args  # noqa: F401

pytestmark = pytest.mark.stack("frozen-kv-mtp-speed", step="frozen-kv-mtp-default-steps")
FIELDS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")


@pytest.mark.stack("frozen-kv-mtp-speed", step="frozen-kv-mtp-default-steps", fails_before=True)
@pytest.mark.parametrize("given, want", [({}, (3, 1, 4)), (dict(speculative_num_steps=5), (5, 1, 6)),
                                         (dict(speculative_num_steps=2, speculative_num_draft_tokens=3), (2, 1, 3))])
def test_unset_step_counts_take_the_eagle_defaults(model, given, want):
    args = server_args(model("E4B"), kv_sharing_fast_prefill=False, attention_backend="triton",
                       speculative_algorithm="NEXTN", speculative_draft_model_path=model("assistant"), **given)
    assert resolved(args, "speculative_algorithm") == "FROZEN_KV_MTP"
    assert tuple(resolved(args, f) for f in FIELDS) == want
