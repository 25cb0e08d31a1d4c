"""The fork serves a tiny Gemma-4 and a tiny Gemma-3n (AltUp, LAuReL, per-layer inputs,
the last 4 of 8 layers KV-shared) on CPU exactly like Hugging Face transformers: prompts
longer than the sliding window, one by one and batched, with radix-cache prefix hits.
"""

import random

import pytest

from cpu_engine import (
    HFReference,
    assert_same_greedy,
    decisive_prompts,
    engine_greedy,
    greedy_of,
    start_engine,
)
from tiny_gemma import GEMMA4_TEXT_CONFIG, make_tiny_gemma3n

pytestmark = pytest.mark.stack("cpu-reference")

MAX_NEW = 6
BOTH = pytest.mark.parametrize("tiny", ["gemma4", "gemma3n"], indirect=True)


def _prompts():
    rng = random.Random(1)
    vocab = GEMMA4_TEXT_CONFIG["vocab_size"]  # Gemma-3n's too
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
def tiny(request, tmp_path_factory):
    """(checkpoint, HF reference) of the model the test is parametrised with."""
    if request.param == "gemma4":  # the session's (conftest.py)
        return request.getfixturevalue("model_dir"), request.getfixturevalue("hf")
    path = make_tiny_gemma3n(str(tmp_path_factory.mktemp("tiny_gemma3n")), seed=0)
    return path, HFReference(path, causal_lm="Gemma3nForCausalLM")


@pytest.fixture(scope="module")
def reference(tiny):
    ref = decisive_prompts(tiny[1], _prompts(), MAX_NEW)
    assert len(ref) == len(_prompts()), "seeded prompts must have no greedy near-ties"
    return ref


@pytest.fixture(scope="module")
def engine(tiny):
    eng = start_engine(tiny[0])
    yield eng
    eng.shutdown()


@BOTH
def test_outputs_vary(reference):
    # Real-scale weights: greedy output must not collapse to one token.
    all_tokens = {t for toks, _ in reference.values() for t in toks}
    assert len(all_tokens) > 10


@pytest.mark.stack("cpu-reference", fails_before=True)
@pytest.mark.parametrize("tiny", ["gemma4"], indirect=True)
def test_one_by_one_matches_hf(engine, reference):
    for p in _prompts():
        (got,) = engine_greedy(engine, [p], MAX_NEW)
        assert_same_greedy(got, reference[tuple(p)], p)


# Its own test for its own step (tools/fork.py reads the mark of each test function):
# before the step, sliding layers attend one key more than HF's, so prompts past the
# window (16) depart from HF's greedy output (the tree before the stack cannot start
# the engine at all).
@pytest.mark.stack("cpu-reference", step="gemma3n-sliding-window-as-hf", fails_before=True)
@pytest.mark.parametrize("tiny", ["gemma3n"], indirect=True)
def test_gemma3n_one_by_one_matches_hf(engine, reference):
    test_one_by_one_matches_hf(engine, reference)


@BOTH
def test_batched_matches_hf(engine, reference):
    prompts = _prompts()
    for p, got in zip(prompts, engine_greedy(engine, prompts, MAX_NEW)):
        assert_same_greedy(got, reference[tuple(p)], p)


@BOTH
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
    """Gemma-4 with a small KV pool and a SWA pool half its size: full-pool and SWA-pool
    slots diverge, so reading SWA layers with full-pool slots gives wrong K/V (or an
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


@pytest.mark.stack("cpu-reference", step="config-pad-per-layer-intermediate-sizes",
                   fails_before=True)
def test_per_layer_intermediate_sizes_pad_one_by_one():
    """Gemma-3n's intermediate_size is a list: each size is padded (on CPU the
    padding runs at load), not the list itself (a TypeError)."""
    from types import SimpleNamespace

    from sglang.srt.configs.update_config import update_intermediate_size

    cfg = SimpleNamespace(hf_config=SimpleNamespace(intermediate_size=[128, 100]))
    update_intermediate_size(cfg, "intermediate_size", 64)
    assert cfg.hf_config.intermediate_size == [128, 128]
    assert cfg.hf_config.original_intermediate_size == [128, 100]
    aligned = SimpleNamespace(hf_config=SimpleNamespace(intermediate_size=[128, 192]))
    update_intermediate_size(aligned, "intermediate_size", 64)
    assert aligned.hf_config.intermediate_size == [128, 192]
    assert not hasattr(aligned.hf_config, "original_intermediate_size")
