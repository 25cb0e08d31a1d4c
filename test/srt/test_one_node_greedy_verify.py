"""Step one-node-greedy-verify-tail: FROZEN_KV_MTP's 0-step round on an all-greedy batch
skips the stock tree sampling and takes the target's argmax. run_eagle_verify with the
tail returns what it returns without it (stock's Triton kernels under Triton's interpreter;
target forward and slot planning stood in); every batch the stock sampling must see falls
through, and the worker gets the tail only where its verify needs nothing per step.
"""

import types
from contextlib import nullcontext

import pytest
import torch
from release import RELEASE
from test_frozen_kv_mtp_adaptive import gemma4_model_config
from triton_interpret import print_result, run_as_script

from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardMode
from sglang.srt.speculative import one_node_greedy_verify as tail_mod
from sglang.srt.speculative.eagle_info import EagleVerifyInput

pytestmark = pytest.mark.stack("frozen-kv-mtp-speed", step="one-node-greedy-verify-tail")

VOCAB = 64
HIDDEN = 8


def sampling(**kw):
    return types.SimpleNamespace(**{**dict(is_all_greedy=True, acc_additive_penalties=None,
                                           acc_scaling_penalties=None, logit_bias=None), **kw})


def one_node_batch(bs, seed=0, **kw):
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    g = torch.Generator().manual_seed(seed)
    batch = ScheduleBatch(reqs=[types.SimpleNamespace() for _ in range(bs)])
    batch.forward_mode = ForwardMode.DECODE
    batch.seq_lens = torch.randint(5, 500, (bs,), generator=g)
    for k, v in {**dict(sampling_info=sampling(), return_logprob=False, has_grammar=False, device="cpu"),
                 **kw}.items():
        setattr(batch, k, v)
    bonus = torch.randint(0, VOCAB, (bs,), generator=g)
    verify_input = EagleVerifyInput(
        draft_token=bonus, custom_mask=None, positions=batch.seq_lens.clone(),
        retrieve_index=torch.arange(bs).unsqueeze(1), retrieve_next_token=torch.full((bs, 1), -1),
        retrieve_next_sibling=torch.full((bs, 1), -1), retrieve_cum_len=None, spec_steps=0, topk=1,
        draft_token_num=1, capture_hidden_mode=CaptureHiddenMode.FULL, seq_lens_sum=None, seq_lens_cpu=None)
    batch.spec_info = verify_input
    # ties included: a few rows repeat their maximum
    logits = torch.randn(bs, VOCAB, generator=g)
    logits[::5, 7] = logits[::5].max(dim=-1).values
    return batch, verify_input, logits


def verify_round(batch, logits, tail):
    """run_eagle_verify with a stand-in target forward and slot planning."""
    from sglang.srt.speculative import eagle_worker_common as common

    logits_output = types.SimpleNamespace(
        next_token_logits=logits.clone(),
        hidden_states=torch.arange(len(logits) * HIDDEN, dtype=torch.float32).view(-1, HIDDEN),
    )
    forward_batch = object()
    common.eagle_prepare_for_verify = lambda *a: (forward_batch, True)
    common.record_stream_for_v2_verify = lambda *a: None
    common.record_stream_each = lambda *a: None
    runner = types.SimpleNamespace(model_config=gemma4_model_config())
    if RELEASE >= (0, 5, 23):  # its verify asks for a watermark and the verify mask's mode
        runner.watermark_state = None
        runner.attn_backend = types.SimpleNamespace(verify_mask=None)
    target = types.SimpleNamespace(
        model_runner=runner,
        forward_batch_generation=lambda **kw: types.SimpleNamespace(
            logits_output=logits_output, routed_experts_output=None, indexer_topk_output=None
        ),
    )
    if RELEASE >= (0, 5, 23):
        steps = {}  # its verify reads the step count from the input
    else:
        steps = dict(num_steps=0)  # its verify takes the step count
    result = common.run_eagle_verify(
        batch, target_worker=target, req_to_token_pool=None,
        token_to_kv_pool_allocator=types.SimpleNamespace(get_kvcache=lambda: object()), plan_stream=None,
        plan_stream_ctx=nullcontext(), topk=1, **steps, num_draft_tokens=1, device="cpu",
        metadata_ready_pre_pad=False, finalize_tree_path=True, one_node_tail=tail)
    assert result.extra_keep_alive_refs == [forward_batch]
    assert result.logits_output is logits_output
    return result


def _summary(result):
    return {
        "next_token_ids": result.next_token_ids.tolist(),
        "next_token_dtype": str(result.next_token_ids.dtype),
        "accept_lens": result.accept_lens.tolist(),
        "accept_lens_dtype": str(result.accept_lens.dtype),
        "new_seq_lens": result.new_seq_lens.tolist(),
        "bonus_tokens": result.next_draft_input.bonus_tokens.tolist(),
        "num_draft_tokens": result.speculative_num_draft_tokens,
    }


def _check():
    from sglang.srt.speculative import eagle_utils, spec_utils

    from resolved_server_args import published
    from test_frozen_kv_mtp_adaptive import frozen_args

    # as test/srt/mtp_cpu_shim: stock's Triton verify kernel on this machine
    eagle_utils._is_xpu = True
    if RELEASE >= (0, 5, 23):  # it moved the greedy verify's gate here
        from sglang.kernels.ops.speculative import spec_tree

        spec_tree._is_xpu = True
    with published(frozen_args(speculative_num_steps=0, speculative_num_draft_tokens=1)):
        # 0.5.23's eagle_sample reads the speculative config from the context
        return _rounds(spec_utils)


def _rounds(spec_utils):
    out = {}
    for sim in (-1.0, 2.1):
        spec_utils.SIMULATE_ACC_LEN = sim
        tail_mod.SIMULATE_ACC_LEN = sim
        for bs in (1, 7, 80):
            runs = {}
            for name, tail in (("stock", None), ("tail", tail_mod.OneNodeGreedyVerifyTail(_worker()))):
                batch, _, logits = one_node_batch(bs, seed=bs)
                runs[name] = _summary(verify_round(batch, logits, tail))
            runs["argmax"] = one_node_batch(bs, seed=bs)[2].argmax(dim=-1).tolist()
            out[f"{sim}/{bs}"] = runs
    return out


@pytest.fixture(scope="module")
def interpreted():
    return run_as_script(__file__)


@pytest.mark.parametrize("sim", ["-1.0", "2.1"])
@pytest.mark.parametrize("bs", [1, 7, 80])
def test_tail_returns_what_the_stock_sampling_returns(interpreted, sim, bs):
    runs = interpreted[f"{sim}/{bs}"]
    assert runs["tail"] == runs["stock"]
    assert runs["stock"]["accept_lens"] == [1] * bs
    assert runs["stock"]["next_token_dtype"] == "torch.int32"
    assert runs["stock"]["num_draft_tokens"] == 1
    if sim == "-1.0":
        # the new bonus token is the target's argmax, as without speculation
        assert runs["stock"]["next_token_ids"] == runs["argmax"]
    else:
        # the bench's simulated acceptance ('fixed' tokens) emits token 100
        assert runs["stock"]["next_token_ids"] == [100] * bs


def _takes_tail(worker, verify_changes=None, **batch_changes):
    batch, verify_input, logits = one_node_batch(3, **batch_changes)
    verify_input.__dict__.update(verify_changes or {})
    out = types.SimpleNamespace(logits_output=types.SimpleNamespace(next_token_logits=logits),
                                routed_experts_output=None, indexer_topk_output=None)
    return tail_mod.OneNodeGreedyVerifyTail(worker)(batch, verify_input, out, None, True) is not None


@pytest.mark.parametrize("change", [
    dict(has_grammar=True), dict(return_logprob=True), dict(sampling_info=sampling(is_all_greedy=False)),
    dict(sampling_info=sampling(acc_additive_penalties=torch.zeros(3, 1))),
    dict(sampling_info=sampling(acc_scaling_penalties=torch.ones(3, 1))),
    dict(sampling_info=sampling(logit_bias=torch.zeros(3, VOCAB))), dict(forward_mode=ForwardMode.IDLE),
    dict(verify_changes=dict(draft_token_num=4)),  # a drafted round
    dict(worker=dict(kv_cache=types.SimpleNamespace(clear_unaccepted_c128_draft_states=lambda *a: None))),
], ids=["grammar", "logprob", "sampling", "additive", "scaling", "logit_bias", "idle", "drafted",
        "kv_cache_clears_draft_states"])
def test_batches_the_stock_sampling_must_see_fall_through(change):
    change = dict(change)
    assert not _takes_tail(_worker(**change.pop("worker", {})), **change)
    assert _takes_tail(_worker())  # the unchanged batch takes the tail


def _worker(topk=1, kv_cache=None, watermark_state=None):
    runner = types.SimpleNamespace(model_config="cfg", watermark_state=watermark_state)
    allocator = types.SimpleNamespace(get_kvcache=lambda: kv_cache or object())
    return types.SimpleNamespace(topk=topk, target_worker=types.SimpleNamespace(model_runner=runner),
                                 token_to_kv_pool_allocator=allocator)


def test_worker_gets_the_tail_only_where_verify_needs_nothing_per_step(monkeypatch):
    monkeypatch.setattr(tail_mod, "mambaish_config", lambda cfg: None)
    assert isinstance(tail_mod.one_node_greedy_verify_tail(_worker()), tail_mod.OneNodeGreedyVerifyTail)
    assert tail_mod.one_node_greedy_verify_tail(_worker(topk=2)) is None
    monkeypatch.setenv("SGLANG_ONE_NODE_GREEDY_VERIFY", "0")
    assert tail_mod.one_node_greedy_verify_tail(_worker()) is None
    monkeypatch.delenv("SGLANG_ONE_NODE_GREEDY_VERIFY")
    monkeypatch.setattr(tail_mod, "mambaish_config", lambda cfg: "mamba")
    assert tail_mod.one_node_greedy_verify_tail(_worker()) is None


@pytest.mark.stack("frozen-kv-mtp-speed", step="one-node-greedy-verify-tail", fails_before=True)
def test_frozen_kv_mtp_worker_takes_the_tail(monkeypatch):
    from test_frozen_kv_mtp_adaptive import build_worker, frozen_args

    for w in build_worker(monkeypatch, frozen_args()):
        assert isinstance(w.one_node_verify_tail, tail_mod.OneNodeGreedyVerifyTail)


@pytest.mark.stack("frozen-kv-mtp-speed", step="one-node-greedy-verify-tail", bases=("0.5.23",))
@pytest.mark.parametrize("worker_kw,batch_kw", [
    (dict(watermark_state=object()), dict(sampling_info=sampling(has_watermark_candidates=True))),
    ({}, dict(hisparse_coordinator=object())),
    ({}, dict(mamba_track_indices=torch.zeros(3, dtype=torch.int64))),
], ids=["watermark", "hisparse", "mamba_track"])
def test_batches_whose_verify_reads_the_accepted_path_fall_through(worker_kw, batch_kw):
    # 0.5.23's stock verify records watermarked tokens, commits HiSparse's
    # accepted tokens and tracks mamba states from the accept index
    assert not _takes_tail(_worker(**worker_kw), **batch_kw)
    # a watermark without candidates in the batch changes nothing
    assert _takes_tail(_worker(**worker_kw), sampling_info=sampling(has_watermark_candidates=False))


@pytest.mark.stack("frozen-kv-mtp-speed", step="one-node-greedy-verify-tail", bases=("0.5.23",))
def test_rocm_tp_keeps_the_stock_greedy_broadcast(monkeypatch):
    from sglang.srt.layers import dp_attention
    from sglang.srt.speculative import one_node_greedy_verify_release as release

    monkeypatch.setattr(tail_mod, "mambaish_config", lambda cfg: None)
    monkeypatch.setattr(release, "is_hip", lambda: True)
    monkeypatch.setattr(dp_attention, "is_dp_attention_enabled", lambda: False)
    for size, gets_tail in ((2, False), (1, True)):
        group = types.SimpleNamespace(world_size=size)
        parallel = types.SimpleNamespace(tp_group=group, attn_tp_group=None)
        monkeypatch.setattr("sglang.srt.runtime_context.get_parallel", lambda: parallel)
        assert (tail_mod.one_node_greedy_verify_tail(_worker()) is not None) == gets_tail


if __name__ == "__main__":
    print_result(_check)
