"""Step triton-draft-window-width (sglang 0.5.23's multi-step draft backend): each
draft step's sliding-window read rail holds sliding_window_size + 1 keys, the
query's own and the sliding_window_size before it, as the extend kernel masks and
as the target's decode window holds (step triton-decode-sliding-window-width).
It held sliding_window_size, so a draft step past the window dropped the oldest
in-window key on every sliding layer of the draft.

The rail's index kernel runs under Triton's interpreter; the per-step attention
backends are stand-ins that record the rail each step hands them.
"""

from types import SimpleNamespace

import pytest
import torch

from triton_interpret import print_result, run_as_script

# 0.5.17 has no draft window rail (its multi-step draft reads no sliding window).
pytestmark = pytest.mark.stack(
    "generic-fixes", step="triton-draft-window-width", fails_before=True, bases=("0.5.23",)
)

WINDOW = 5  # sliding_window_size: a radius, as Gemma's config.sliding_window - 1
STEPS = 4  # draft steps; the first STEPS - 1 read through per-step backends
# shorter than the window, reaching it during the steps, at it, past it
SEQ_LENS = [2, 4, 5, 6, 13]
CTX = 32


def _req_to_token():
    g = torch.Generator().manual_seed(0)
    return torch.randperm(4096, generator=g)[: (len(SEQ_LENS) + 2) * CTX].view(-1, CTX) + 1


def _check():
    from sglang.srt.layers.attention import triton_backend as tb
    from sglang.srt.mem_cache.kv_loc_plan import IdSpaceKind

    req_to_token = _req_to_token()
    seen = []

    class StepBackend:
        """What the multi-step backend builds per step: records the rail it is given."""

        max_context_len = CTX
        use_sliding_window_kv_pool = False

        def __init__(self, model_runner, skip_prefill, kv_indptr_buf):
            pass

        def init_forward_metadata(self, fb):
            indptr = fb.spec_info.window_kv_indptr.tolist()
            ids = fb.spec_info.window_kv_indices.tolist()
            seen.append([ids[indptr[b] : indptr[b + 1]] for b in range(len(indptr) - 1)])

    class Translator:
        """Reads stay the req_to_token rows (no unified pool, no SWA pool)."""

        window_kv_kind = IdSpaceKind.FULL

        def read_source(self, plan, *, req_pool_indices, bs, kind=IdSpaceKind.FULL):
            return SimpleNamespace(ids=req_to_token, row_ids=req_pool_indices,
                                   row_stride=req_to_token.stride(0), entry_page_size=1,
                                   is_translated=True, v2p=None)

    tb.TritonAttnBackend = StepBackend
    tb.get_parallel = lambda: SimpleNamespace(attn_tp_size=1)
    tb.get_schedule = lambda: SimpleNamespace(page_size=1)
    tb.resolve_draft_decode_window = lambda model_runner: (0, 0)
    model_runner = SimpleNamespace(
        req_to_token_pool=SimpleNamespace(size=len(SEQ_LENS) + 2, req_to_token=req_to_token),
        device="cpu",
        model_config=SimpleNamespace(get_max_num_attention_heads=lambda: 2),
        kv_index_translator=Translator(),
        token_to_kv_pool=None,
        sliding_window_size=WINDOW,
    )
    draft = tb.TritonMultiStepDraftBackend(model_runner, topk=1, speculative_num_steps=STEPS)
    seq_lens = torch.tensor(SEQ_LENS)
    fb = SimpleNamespace(
        batch_size=len(SEQ_LENS),
        seq_lens=seq_lens,
        seq_lens_sum=int(seq_lens.sum()),
        positions=seq_lens.clone(),
        req_pool_indices=torch.arange(len(SEQ_LENS)) + 1,
        kv_loc_plan=None,
        spec_info=SimpleNamespace(),
        out_cache_loc=None,
        kv_loc_cols=None,
    )
    draft.init_forward_metadata(fb)
    return {"rails": seen, "req_to_token": req_to_token.tolist()}


def test_each_draft_step_reads_the_query_and_the_window_before_it():
    out = run_as_script(__file__)
    rows = out["req_to_token"]
    assert len(out["rails"]) == STEPS - 1
    for step, rail in enumerate(out["rails"]):
        for b, s in enumerate(SEQ_LENS):
            # step `step` attends the committed prefix and the draft's first step + 1
            # chain tokens, which the draft wrote into the slots right after it
            total = s + step + 1
            keys = min(total, WINDOW + 1)
            want = rows[b + 1][total - keys : total]
            assert rail[b] == want, f"step {step}, request {b} (seq_len {s}): {rail[b]} != {want}"


if __name__ == "__main__":
    print_result(_check)
