"""Step spec-decode-kernel-warmup (speculative/spec_decode_kernel_warmup.py): a spec-v2 server
compiles, at start-up, every specialization of the three Triton kernels whose
``tl.constexpr`` follows the decode batch size or the step count, instead of
compiling one mid-serving the first time a batch or a step count reaches it.

The kernels run here under Triton's interpreter, on CPU: what each launch
passes (grid, dtypes, constexprs, pointer alignment) is recorded, and the live
``req_to_token`` it reads must come out unchanged. Whether the launches hit the
same compiled kernels as a real round is a GPU check (the compile log of
``serve_mtp.py --jit-log``, device stage MK).
"""

import types

import pytest
import torch

from test_frozen_kv_mtp_adaptive import DEFAULT_CANDIDATES, build_worker, frozen_args
from triton_interpret import print_result, run_as_script

from sglang.srt.speculative import eagle_worker_v2
from sglang.srt.speculative import spec_decode_kernel_warmup as warmup
from sglang.srt.utils import next_power_of_2

pytestmark = pytest.mark.stack("frozen-kv-mtp-speed", step="spec-decode-kernel-warmup")

MAX_BS = 80
POOL_LEN = 64
CONFIGS = [(0, 1), (1, 2), (3, 4)]


@pytest.mark.stack("frozen-kv-mtp-speed", step="spec-decode-kernel-warmup", fails_before=True)
@pytest.mark.parametrize("max_bs", [1, 48, 64, 65, 80, 129])
def test_buckets_are_every_bs_upper_a_batch_reaches(max_bs):
    expected = {next_power_of_2(bs) for bs in range(1, max_bs + 1)}
    assert set(warmup.batch_size_buckets(max_bs)) == expected
    assert max(warmup.batch_size_buckets(max_bs)) >= max_bs


def test_step_configs_cover_every_adaptive_state(monkeypatch):
    for w in build_worker(monkeypatch, frozen_args()):
        built = sorted(
            (s, st.speculative_num_draft_tokens)
            for s, st in w.adaptive_controller._states.items()
        )
        assert warmup.step_configs(w) == built == [(s, s + 1) for s in DEFAULT_CANDIDATES]


def test_step_configs_without_adaptive_is_the_fixed_state():
    w = types.SimpleNamespace(
        speculative_num_steps=3, speculative_num_draft_tokens=4, adaptive_controller=None
    )
    assert warmup.step_configs(w) == [(3, 4)]


def test_init_cuda_graphs_warms_after_the_states_are_built(monkeypatch):
    seen = []
    monkeypatch.setattr(
        eagle_worker_v2,
        "warm_spec_decode_kernels",
        lambda w: seen.append(sorted(w.adaptive_controller._states)),
    )
    for _ in build_worker(monkeypatch, frozen_args()):
        assert seen == [DEFAULT_CANDIDATES]


def _check():
    """Launch every specialization under the interpreter, recording each launch."""
    launches = []

    def recorder(name, kernel):
        class Grid:
            def __getitem__(self, grid):
                def launch(*args):
                    launches.append(
                        {
                            "kernel": name,
                            "grid": list(grid),
                            "dtypes": [str(a.dtype) for a in args if torch.is_tensor(a)],
                            "aligned": [a.data_ptr() % 16 == 0 for a in args if torch.is_tensor(a)],
                            "ints": [a for a in args if isinstance(a, int)],
                        }
                    )
                    return kernel[grid](*args)

                return launch

        return Grid()

    for name in ("assign_req_to_token_pool", "assign_extend_cache_locs_uniform", "fill_bonus_tokens"):
        setattr(warmup, name, recorder(name, getattr(warmup, name)))
    torch.manual_seed(0)
    req_to_token = torch.randint(0, 1 << 20, (MAX_BS + 1, POOL_LEN), dtype=torch.int32)
    before = req_to_token.clone()
    warmup.launch_spec_decode_kernels(req_to_token, warmup.batch_size_buckets(MAX_BS), CONFIGS)
    return {"launches": launches, "unchanged": bool(torch.equal(before, req_to_token))}


@pytest.fixture(scope="module")
def launched():
    return run_as_script(__file__)


def _of(launched, kernel):
    return [l for l in launched["launches"] if l["kernel"] == kernel]


def test_launches_write_nothing_to_req_to_token(launched):
    assert launched["unchanged"]


def test_every_bs_upper_with_both_out_loc_alignments(launched):
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


def test_every_state_draft_token_num_and_accept_stride(launched):
    locs = _of(launched, "assign_extend_cache_locs_uniform")
    assert all(l["dtypes"] == ["torch.int64", "torch.int32", "torch.int64", "torch.int64"] for l in locs)
    # start offsets (batch.seq_lens) in both alignments, for every draft width
    assert {(l["ints"][1], l["aligned"][2]) for l in locs} == {
        (d, a) for _, d in CONFIGS for a in (True, False)
    }
    assert all(l["ints"][0] == POOL_LEN for l in locs)
    bonus = _of(launched, "fill_bonus_tokens")
    assert all(l["dtypes"] == ["torch.int32"] * 3 for l in bonus)
    assert sorted(l["ints"][0] for l in bonus) == [s + 1 for s, _ in CONFIGS]


if __name__ == "__main__":
    print_result(_check)
