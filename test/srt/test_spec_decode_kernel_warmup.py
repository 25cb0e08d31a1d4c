"""Step spec-decode-kernel-warmup: a spec-v2 server compiles at start-up every
specialization of the Triton kernels whose constexprs follow the decode batch size or the
step count. Under Triton's interpreter each launch's grid, dtypes, constexprs, None
arguments and pointer alignment are recorded; req_to_token must come out unchanged
(same compiled kernels as a real round: a GPU check, serve_mtp.py --jit-log).
"""
import types

import pytest
import torch
from release import RELEASE
from test_frozen_kv_mtp_adaptive import DEFAULT_CANDIDATES, build_worker, frozen_args
from triton_interpret import print_result, run_as_script

from sglang.srt.speculative import eagle_worker_v2
from sglang.srt.speculative import spec_decode_kernel_launches as launches
from sglang.srt.speculative import spec_decode_kernel_warmup as warmup
from sglang.srt.utils import next_power_of_2

pytestmark = pytest.mark.stack("frozen-kv-mtp-speed", step="spec-decode-kernel-warmup")

MAX_BS = 80
POOL_LEN = 64
CONFIGS = [(0, 1), (1, 2), (3, 4)]
TREE_CONFIGS = [(3, 8)]  # topk > 1: more draft tokens than steps + 1


@pytest.mark.stack("frozen-kv-mtp-speed", step="spec-decode-kernel-warmup", fails_before=True)
@pytest.mark.parametrize("max_bs", [1, 48, 64, 65, 80, 129])
def test_buckets_are_every_bs_upper_a_batch_reaches(max_bs):
    expected = {next_power_of_2(bs) for bs in range(1, max_bs + 1)}
    assert set(warmup.batch_size_buckets(max_bs)) == expected
    assert max(warmup.batch_size_buckets(max_bs)) >= max_bs


def test_warmed_after_the_states_are_built_for_every_state(monkeypatch):
    seen = []
    monkeypatch.setattr(eagle_worker_v2, "warm_spec_decode_kernels",
                        lambda w: seen.append(sorted(w.adaptive_controller._states)))
    for w in build_worker(monkeypatch, frozen_args()):
        assert seen == [DEFAULT_CANDIDATES]  # init_cuda_graphs warms after building them
        built = sorted((s, st.speculative_num_draft_tokens)
                       for s, st in w.adaptive_controller._states.items())
        assert warmup.step_configs(w) == built == [(s, s + 1) for s in DEFAULT_CANDIDATES]


def test_step_configs_without_adaptive_is_the_fixed_state():
    w = types.SimpleNamespace(speculative_num_steps=3, speculative_num_draft_tokens=4,
                              adaptive_controller=None)
    assert warmup.step_configs(w) == [(3, 4)]


def _describe(a):
    if torch.is_tensor(a):
        return {"dtype": str(a.dtype), "aligned": a.data_ptr() % 16 == 0}
    return a


def _check():
    """Launch every specialization under the interpreter, recording each launch."""
    launches_seen = []

    def recorder(name, kernel):
        class Grid:
            def __getitem__(self, grid):
                def launch(*args, **kwargs):
                    tensors = [a for a in args if torch.is_tensor(a)]
                    launches_seen.append(dict(
                        kernel=name, grid=list(grid), dtypes=[str(a.dtype) for a in tensors],
                        aligned=[a.data_ptr() % 16 == 0 for a in tensors],
                        ints=[a for a in args if isinstance(a, int)],
                        kwargs={k: _describe(v) for k, v in kwargs.items()}))
                    return kernel[grid](*args, **kwargs)

                return launch

        return Grid()

    if RELEASE >= (0, 5, 23):
        # It commits a verify through one fused kernel (prepare_verify_commit_outputs)
        # on CUDA and ROCm. The verify-side kernels are launched through the round's
        # own functions; they pick the Triton kernel on a CUDA-like device only.
        from sglang.kernels.ops.speculative import cache_locs
        from sglang.kernels.ops.speculative import eagle as eagle_kernels

        cache_locs._is_cuda = True
        kernels = [(warmup, "assign_req_to_token_pool"), (cache_locs, "assign_extend_cache_locs_uniform"),
                   (eagle_kernels, "_verify_commit_outputs_kernel")]
    else:
        # it fills the bonus tokens with fill_bonus_tokens
        kernels = [(warmup, "assign_req_to_token_pool"), (launches, "assign_extend_cache_locs_uniform"),
                   (launches, "fill_bonus_tokens")]
    for module, name in kernels:
        setattr(module, name, recorder(name, getattr(module, name)))
    torch.manual_seed(0)
    req_to_token = torch.randint(0, 1 << 20, (MAX_BS + 1, POOL_LEN), dtype=torch.int32)
    before = req_to_token.clone()
    warmup.launch_spec_decode_kernels(req_to_token, warmup.batch_size_buckets(MAX_BS), CONFIGS, 1)
    chain = list(launches_seen)
    launches_seen.clear()
    warmup.launch_spec_decode_kernels(req_to_token, [], TREE_CONFIGS, 4)
    return {"launches": chain, "tree_launches": list(launches_seen),
            "unchanged": bool(torch.equal(before, req_to_token))}


@pytest.fixture(scope="module")
def launched():
    return run_as_script(__file__)


def _of(launched, kernel, key="launches"):
    return [l for l in launched[key] if l["kernel"] == kernel]


def test_every_bs_upper_with_both_out_loc_alignments(launched):
    assert launched["unchanged"]  # the launches wrote nothing to req_to_token
    rows = _of(launched, "assign_req_to_token_pool")
    seen = set()
    for l in rows:
        pool_len, bs_upper = l["ints"]
        assert pool_len == POOL_LEN
        # one program per row, as assign_req_to_token_pool_func launches it
        assert l["grid"] == [bs_upper]
        # as alloc_for_spec_decode: int64 indices / out locations, int32 kv lengths
        assert l["dtypes"] == ["torch.int64", "torch.int32", "torch.int32", "torch.int32", "torch.int64"]
        seen.add((bs_upper, l["aligned"][4]))
    buckets = {next_power_of_2(bs) for bs in range(1, MAX_BS + 1)}
    assert seen == {(b, a) for b in buckets for a in (True, False)}


@pytest.mark.stack("frozen-kv-mtp-speed", step="spec-decode-kernel-warmup", bases=("0.5.17",))
def test_every_state_draft_token_num_and_accept_stride(launched):
    locs = _of(launched, "assign_extend_cache_locs_uniform")
    assert all(l["dtypes"] == ["torch.int64", "torch.int32", "torch.int64", "torch.int64"] for l in locs)
    # start offsets (batch.seq_lens) in both alignments, for every draft width
    assert {(l["ints"][1], l["aligned"][2]) for l in locs} == {
        (d, a) for _, d in CONFIGS for a in (True, False)}
    assert all(l["ints"][0] == POOL_LEN for l in locs)
    bonus = _of(launched, "fill_bonus_tokens")
    assert all(l["dtypes"] == ["torch.int32"] * 3 for l in bonus)
    assert sorted(l["ints"][0] for l in bonus) == [s + 1 for s, _ in CONFIGS]


# What eagle_prepare_for_verify passes without a prepared window: no translated
# writes, positions or anchors (Triton compiles None apart from a tensor).
VERIFY_PREP_NONE = ("full_v2p", "swa_v2p", "full_out", "swa_out", "positions_out", "anchor_src", "anchor_out")


@pytest.mark.stack("frozen-kv-mtp-speed", step="spec-decode-kernel-warmup", bases=("0.5.23",))
def test_verify_prep_warmed_with_the_rounds_optional_arguments(launched):
    locs = _of(launched, "assign_extend_cache_locs_uniform")
    for l in locs:
        assert l["grid"] == [1]
        assert l["dtypes"] == ["torch.int64", "torch.int32", "torch.int64", "torch.int64"]
        assert all(l["kwargs"][k] is None for k in VERIFY_PREP_NONE)
        assert l["kwargs"]["PAGE_SIZE"] == 1
        assert l["ints"][0] == POOL_LEN
    assert sorted((l["ints"][1], l["aligned"][2]) for l in locs) == sorted(
        (d, a) for _, d in CONFIGS for a in (True, False))
    # no fill_bonus_tokens: on CUDA and ROCm the fused commit replaces it
    assert not _of(launched, "fill_bonus_tokens")


def _commit_keys(l):
    # (INDEX_STRIDE_0, DRAFT_WIDTH, TRACK_INTERVAL, seq_lens aligned): the
    # constexprs that follow the state, and the one pointer the round may view
    return (l["ints"][3], l["kwargs"]["DRAFT_WIDTH"], l["kwargs"]["TRACK_INTERVAL"], l["aligned"][3])


@pytest.mark.stack("frozen-kv-mtp-speed", step="spec-decode-kernel-warmup", bases=("0.5.23",))
def test_fused_commit_warmed_for_every_state(launched):
    chain = _of(launched, "_verify_commit_outputs_kernel")
    for l in chain:
        # predict, accept index, accept lengths (int32), seq_lens and new lengths
        # (int64), bonus tokens (int32); then the topk-1 draft-extend outputs
        assert l["dtypes"] == ["torch.int32"] * 3 + ["torch.int64"] * 2 + ["torch.int32"]
        assert l["kwargs"]["track_steps"] is None  # no mamba tracking
        assert [l["kwargs"][k]["dtype"] for k in ("last_steps", "correct", "select", "ids")] == [
            "torch.int64", "torch.int32", "torch.int64", "torch.int64"]
    assert sorted(map(_commit_keys, chain)) == sorted(
        (s + 1, d, 0, a) for s, d in CONFIGS for a in (True, False))
    # topk > 1 commits without the draft-extend outputs (DRAFT_WIDTH 0)
    tree = _of(launched, "_verify_commit_outputs_kernel", "tree_launches")
    assert sorted(map(_commit_keys, tree)) == sorted(
        (s + 1, 0, 0, a) for s, _ in TREE_CONFIGS for a in (True, False))
    assert all(l["kwargs"]["last_steps"] is None for l in tree)


if __name__ == "__main__":
    print_result(_check)
