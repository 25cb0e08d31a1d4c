"""The fork serves a tiny Gemma-3n on CPU exactly like Hugging Face transformers.

A seeded text-only Gemma3nForCausalLM (tiny_gemma3n.py: AltUp streams, LAuReL, per-layer
inputs, activation sparsity in the first layers, the last 4 of 8 layers KV-shared) on
torch_native. One engine serves every check: prompts longer than the sliding window
(16), one by one and batched, with a shared prefix that the radix cache serves.
Decode reads the KV-shared layers' K/V from the cache their source layers wrote,
as HF reads its shared_kv_states.
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
from tiny_gemma3n import TINY_TEXT_CONFIG, make_tiny_gemma3n

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
def model_dir(tmp_path_factory):
    return make_tiny_gemma3n(str(tmp_path_factory.mktemp("tiny_gemma3n")), seed=0)


@pytest.fixture(scope="module")
def reference(model_dir):
    hf = HFReference(model_dir, causal_lm="Gemma3nForCausalLM")
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


# Before the step, sliding layers attend one key more than HF's: prompts past the
# window (16) depart from HF's greedy output (the tree before the stack cannot start
# the engine at all).
@pytest.mark.stack("cpu-reference", step="gemma3n-sliding-window-as-hf", fails_before=True)
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
