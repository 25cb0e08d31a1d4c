"""A request's seed (sampling_seed, OpenAI's seed) decides its samples, whatever it is
batched with (stack 02): a seeded request sent alone and inside differently composed
batches gives the same tokens; its n parallel samples differ from one another and each
reproduces. Before, the seed was ignored without deterministic inference (the sample
followed the scheduler's generator), and under it min-p with a seed asserted.
"""

import pytest

from triton_interpret import print_result, run_as_script

pytestmark = pytest.mark.stack("generic-fixes", step="per-request-sampling-seed")

PROMPT = [11, 12, 13, 14, 15, 16]
OTHER = [[21, 22, 23], [31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42], [51]]
NEW = 6
SEEDED = {"max_new_tokens": NEW, "temperature": 1.0, "sampling_seed": 1234}
FILTERED = {**SEEDED, "top_k": 40, "top_p": 0.95, "min_p": 0.02}


@pytest.fixture(scope="module")
def engine(model_dir):
    from cpu_engine import start_engine

    eng = start_engine(model_dir, max_running_requests=8)
    yield eng
    eng.shutdown()


def _ids(engine, prompts, params):
    return [o["output_ids"] for o in engine.generate(input_ids=prompts, sampling_params=params)]


@pytest.mark.stack("generic-fixes", step="per-request-sampling-seed", fails_before=True)
@pytest.mark.parametrize("seeded", [SEEDED, FILTERED], ids=["plain", "top-k-top-p-min-p"])
def test_a_seeded_request_samples_the_same_however_batched(engine, seeded):
    (alone,) = _ids(engine, [PROMPT], [seeded])
    assert len(alone) == NEW
    batches = [
        # alone again: the scheduler's generator has moved on
        ([PROMPT], [seeded]),
        # behind unseeded requests at other temperatures and filters
        ([OTHER[0], OTHER[1], PROMPT],
         [{"max_new_tokens": NEW, "temperature": 0.7},
          {"max_new_tokens": 2 * NEW, "temperature": 1.3, "top_k": 5}, seeded]),
        # first, with another seeded request, a greedy one and a longer one
        ([PROMPT, OTHER[2], OTHER[0], OTHER[1]],
         [seeded, {**SEEDED, "sampling_seed": 7}, {"max_new_tokens": NEW, "temperature": 0},
          {"max_new_tokens": 3 * NEW, "temperature": 0.9, "min_p": 0.1}]),
    ]
    for prompts, params in batches:
        got = _ids(engine, prompts, params)[prompts.index(PROMPT)]
        assert got == alone, (prompts, params)
    # another seed, other tokens (a random-weight model at temperature 1)
    assert _ids(engine, [PROMPT], [{**seeded, "sampling_seed": 99}])[0] != alone


@pytest.mark.stack("generic-fixes", step="per-request-sampling-seed", fails_before=True)
def test_n_seeded_samples_differ_and_each_reproduces(engine):
    n = {**SEEDED, "n": 3}
    first = _ids(engine, [PROMPT], n)
    assert len(first) == 3 and len({tuple(t) for t in first}) == 3, first
    # with unseeded company, and again: the same three
    unseeded = {"max_new_tokens": NEW, "temperature": 1.0, "n": 3}
    with_others = _ids(engine, [OTHER[0], PROMPT], [unseeded, n])
    assert with_others[3:] == first
    assert _ids(engine, [PROMPT], n) == first
    # the first sample keeps the request's seed: n=1 gives it
    assert _ids(engine, [PROMPT], [SEEDED]) == first[:1]


def test_parallel_sample_seeds():
    from sglang.srt.sampling.per_request_seed import parallel_sample_seed

    for seed in (0, 1, -1, 2**63 - 1, -(2**63)):
        seeds = [parallel_sample_seed(seed, i) for i in range(64)]
        assert seeds[0] == seed and len(set(seeds)) == 64
        assert all(-(2**63) <= s < 2**63 for s in seeds)


def test_filters_and_rows_are_independent():
    import torch

    from sglang.srt.sampling.per_request_seed import seeded_sample

    torch.manual_seed(0)
    probs = torch.softmax(torch.randn(4, 64) * 2, dim=-1)
    probs[1] = probs[0]
    seeds = torch.tensor([5, 5, 6, -(2**63)])
    pos = torch.tensor([3, 3, 3, 9])
    plain = seeded_sample(probs, seeds, pos)
    assert plain[0] == plain[1]
    assert seeded_sample(probs[2:], seeds[2:], pos[2:]).tolist() == plain[2:].tolist()
    # top-k 1 is the argmax; top-p and min-p keep their rows' sets; an unfiltered row
    # samples as without filters, whatever the other rows ask for
    top_ks = torch.tensor([1, 3, 1 << 30, 1 << 30])
    top_ps = torch.tensor([1.0, 1.0, 0.5, 1.0])
    min_ps = torch.tensor([0.0, 0.0, 0.0, 0.0])
    filtered = torch.tensor([True, True, True, False])
    got = seeded_sample(probs, seeds, pos, top_ks, top_ps, min_ps, filtered)
    assert got[0] == probs[0].argmax()
    assert got[1] in probs[1].topk(3).indices
    order = probs[2].sort(descending=True)
    kept = order.indices[: int((order.values.cumsum(0) - order.values <= 0.5).sum())]
    assert got[2] in kept
    assert got[3] == plain[3]
    min_ps = torch.tensor([0.0, 0.0, 0.0, 0.5])
    got = seeded_sample(probs, seeds, pos, top_ks, top_ps, min_ps, torch.ones(4, dtype=torch.bool))
    assert probs[3, got[3]] >= 0.5 * probs[3].max()


def test_request_seeds_follow_filter_and_merge():
    from types import SimpleNamespace as NS

    from sglang.srt.sampling.per_request_seed import RequestSeeds

    def req(seed, top_k=1 << 30):
        return NS(sampling_params=NS(sampling_seed=seed, top_k=top_k, top_p=1.0, min_p=0.0))

    assert RequestSeeds.of_reqs([req(None)], "cpu") is None
    a = RequestSeeds.of_reqs([req(None), req(3, top_k=4)], "cpu")
    assert a.rows.tolist() == [1] and a.row_seeds.tolist() == [3] and a.need_filter
    assert a.filter([0]) is None
    merged = RequestSeeds.merge(None, a, 2, 2)
    assert merged.rows.tolist() == [3] and merged.seeds == [None, None, None, 3]
    merged = RequestSeeds.merge(merged.filter([3, 0]), None, 2, 1)
    assert merged.rows.tolist() == [0] and merged.row_filters.tolist() == [True]


@pytest.mark.stack("generic-fixes", step="per-request-sampling-seed", fails_before=True)
def test_min_p_with_a_seed_does_not_assert(monkeypatch):
    # deterministic inference seeds every row; min-p then asserted in the pytorch backend
    import torch

    from sglang.srt.layers import sampler

    monkeypatch.setattr(sampler, "multinomial_with_seed",
                        lambda logprobs, seed, positions: logprobs.argmax(dim=1, keepdim=True))
    probs = torch.softmax(torch.randn(2, 32), dim=-1)
    ids = sampler.top_k_top_p_min_p_sampling_from_probs_torch(
        probs, torch.tensor([1 << 30, 4]), torch.tensor([1.0, 0.9]), torch.tensor([0.1, 0.0]),
        True, torch.tensor([1, 2]), torch.tensor([0, 0]))
    assert ids.tolist() == probs.argmax(dim=1).tolist()


def _hashes():
    import torch

    from sglang.kernels.ops.sampling.murmur_hash import murmur_hash32_kernel
    from sglang.srt.sampling.per_request_seed import murmur_hash32_torch

    seeds = torch.tensor([0, 1, -1, 2**63 - 1, -(2**63), 1234567890123])
    positions = torch.tensor([0, 5, 2**32 + 7, 17, 4095, 123456])
    rows, cols = len(seeds), 1500
    # the kernel itself: 0.5.23's murmur_hash32 takes a C++ op for CPU tensors
    want = torch.empty((rows, cols), dtype=torch.uint32)
    murmur_hash32_kernel[(rows, 2)](seeds, positions, torch.arange(cols), want, rows, cols,
                                    BLOCK_SIZE=1024)
    got = murmur_hash32_torch(seeds, positions, cols)
    return {"equal": bool((want.to(torch.int64) & 0xFFFFFFFF).eq(got).all()),
            "distinct": int(got.unique().numel())}


def test_torch_hash_is_the_triton_kernels():
    # CUDA hashes with the Triton kernel, other devices with torch: the same noise
    out = run_as_script(__file__)
    assert out["equal"] and out["distinct"] > 8900, out


if __name__ == "__main__":
    print_result(_hashes)
