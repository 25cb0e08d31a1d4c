"""The fork serves a tiny Gemma-4 on CPU exactly like Hugging Face transformers.

Covers the CPU reference path of the foundation: gemma4_text config remap,
torch_native on a hybrid SWA pool, CPU RoPE/softcap. Prompts are longer than the
sliding window (16), sent batched and one by one, with shared prefixes so the
radix cache serves prefix hits.
"""

import random

import pytest

from cpu_engine import (
    assert_same_greedy,
    decisive_prompts,
    engine_greedy,
    greedy_of,
    start_engine,
)
from tiny_gemma4 import TINY_TEXT_CONFIG

pytestmark = pytest.mark.stack("cpu-reference")

MAX_NEW = 6


def _prompts():
    rng = random.Random(1)
    vocab = TINY_TEXT_CONFIG["vocab_size"]
    rand = lambda n: [rng.randrange(3, vocab) for _ in range(n)]
    shared = rand(40)
    return [
        rand(5),
        rand(17),
        rand(70),
        shared + rand(9),
        shared + rand(23),  # prefix hit on `shared` after the one above
        rand(1),
        rand(130),
    ]


@pytest.fixture(scope="module")
def reference(hf):
    ref = decisive_prompts(hf, _prompts(), MAX_NEW)
    assert len(ref) == len(_prompts()), "seeded prompts must have no greedy near-ties"
    return ref


@pytest.fixture(scope="module")
def engine(model_dir):
    eng = start_engine(model_dir)
    yield eng
    eng.shutdown()


def test_outputs_vary(reference):
    # Real-scale weights: greedy output must not collapse to one token.
    all_tokens = {t for toks, _ in reference.values() for t in toks}
    assert len(all_tokens) > 10


@pytest.mark.stack("cpu-reference", fails_before=True)
def test_one_by_one_matches_hf(engine, reference):
    for p in _prompts():
        (got,) = engine_greedy(engine, [p], MAX_NEW)
        assert_same_greedy(got, reference[tuple(p)], p)


def test_batched_matches_hf(engine, reference):
    prompts = _prompts()
    for p, got in zip(prompts, engine_greedy(engine, prompts, MAX_NEW)):
        assert_same_greedy(got, reference[tuple(p)], p)


def test_shared_prefix_hits_radix_cache(engine, reference):
    prompts = _prompts()
    shared_a, shared_b = prompts[3], prompts[4]
    engine_greedy(engine, [shared_a], MAX_NEW)
    outs = engine.generate(
        input_ids=[shared_b],
        sampling_params={"max_new_tokens": MAX_NEW, "temperature": 0.0},
        return_logprob=True,
    )
    assert outs[0]["meta_info"]["cached_tokens"] >= 40
    assert_same_greedy(greedy_of(outs[0]), reference[tuple(shared_b)], shared_b)


@pytest.mark.stack("cpu-reference", step="torch-native-swa-pool-indices")
def test_swa_pool_under_pressure_matches_hf(model_dir, hf):
    """A small KV pool with a SWA pool half its size: full-pool and SWA-pool slots
    diverge, so reading SWA layers with full-pool slots gives wrong K/V (or an
    IndexError); the fork translates them."""
    rng = random.Random(99)
    rounds = [
        [[rng.randrange(3, 512) for _ in range(rng.randrange(20, 90))] for _ in range(4)]
        for _ in range(4)
    ]
    eng = start_engine(model_dir, max_total_tokens=400, swa_full_tokens_ratio=0.5)
    try:
        checked = 0
        for prompts in rounds:
            ref = decisive_prompts(hf, prompts, MAX_NEW)
            for p, got in zip(prompts, engine_greedy(eng, prompts, MAX_NEW)):
                if tuple(p) in ref:
                    assert_same_greedy(got, ref[tuple(p)], p)
                    checked += 1
        assert checked >= 12
    finally:
        eng.shutdown()
