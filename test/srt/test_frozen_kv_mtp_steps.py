"""FROZEN_KV_MTP at 3, 4 and 5 draft steps under concurrency equals no speculation.

An index mixing up batch size and draft-token count shows only at concurrency and beyond
3 steps (upstream sgl-project/sglang#32666). One engine per step count serves three
greedy requests at once (batch 3 -> 2 -> 1), each equal to HF's. Drafts come from
mtp_cpu_shim/'s oracle drafter, right for the first d tokens of a round so that every
acceptance length runs (checked). Smallest models keeping each kind of layer (CI time).
"""
import json
import os
import sys

import pytest
from release import RELEASE

from cpu_engine import TRITON_ENGINE, HFReference, start_engine
from test_frozen_kv_mtp_engine import environ
from tiny_gemma import GEMMA4_TEXT_CONFIG, make_tiny_gemma4

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benchmark", "yoco_gemma4"))
from checkpoints import mtp_kwargs, write_assistant_checkpoint  # noqa: E402

SLIDING, FULL = "sliding_attention", "full_attention"
# The tiny Gemma-4 at its smallest: every kind of layer once, KV-shared layers included.
TARGET_CONFIG = dict(GEMMA4_TEXT_CONFIG, num_hidden_layers=4, num_kv_shared_layers=2,
                     layer_types=[SLIDING, FULL] * 2, num_attention_heads=2,
                     num_key_value_heads=1)
PROMPT_LENGTHS = [9, 20, 33]
NEW_TOKENS = [8, 9, 11]
OFFSETS = [4, 6, 2]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """The checkpoints, the prompts and their greedy continuations without speculation."""
    root = tmp_path_factory.mktemp("mtp_steps")
    target = make_tiny_gemma4(str(root / "target"), config=TARGET_CONFIG)
    draft = write_assistant_checkpoint(str(root / "draft"), dict(TARGET_CONFIG))
    cfg_path = os.path.join(draft, "config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["text_config"].update(num_hidden_layers=2, num_kv_shared_layers=2,
                              layer_types=[SLIDING, FULL])
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1)
    hf = HFReference(target)
    prompts, want = [], []
    for length, n in zip(PROMPT_LENGTHS, NEW_TOKENS):
        # the first prompt of this length whose greedy continuation has no near-tie
        for seed in range(16):
            prompt = [(7 * length + 3 * j + 11 * seed) % 500 + 5 for j in range(length)]
            tokens, _, margin = hf.greedy(prompt, n + 6)  # the oracle drafts past the end
            if margin >= 1e-3:
                break
        else:
            pytest.fail(f"no prompt of {length} tokens has a decisive greedy continuation")
        prompts.append(prompt)
        want.append(tokens)
    oracle = root / "oracle.json"
    oracle.write_text(json.dumps([[p, w, o] for p, w, o in zip(prompts, want, OFFSETS)]))
    env = {
        "TRITON_INTERPRET": "1",
        "SGLANG_TEST_MTP_CPU_SHIM": "1",
        "SGLANG_DUMMY_WEIGHTS_AT_SCALE": "1",
        "SGLANG_TEST_MTP_ORACLE_DRAFTS": str(oracle),
        "PYTHONPATH": os.pathsep.join([os.path.join(HERE, "mtp_cpu_shim"), os.environ.get("PYTHONPATH", "")]),
    }
    if RELEASE >= (0, 5, 23):
        # the chain verify is upstream's SGLANG_ENABLE_SPLITKV_VERIFY, selected on CUDA
        # only unless the shim lets this CPU pass
        env.update(SGLANG_ENABLE_SPLITKV_VERIFY="1", SGLANG_TEST_CHAIN_VERIFY_ON_CPU="1")
    yield target, draft, env, prompts, [w[:n] for w, n in zip(want, NEW_TOKENS)]


# The stack's verify as served by default: 0.5.17's chain verify (its default since
# 06/0010), on 0.5.23 the chain mode of upstream's split-KV verify. On 0.5.17 a stack
# test: it runs in the suite, on the whole stack (each step has its own proof). 0.5.23's
# stack 06 is not whole yet (a base leaves out such a stack's stack tests), so there it
# is its step's test.
@pytest.mark.stack("frozen-kv-mtp-speed", bases=("0.5.17",))
@pytest.mark.parametrize("steps", [3, 4, 5])
def test_mtp_steps_under_concurrency_equal_no_speculation(setup, steps):
    check_steps(setup, steps)


@pytest.mark.stack("frozen-kv-mtp-speed", step="chain-verify-as-split-kv-verify-mode",
                   bases=("0.5.23",))
@pytest.mark.parametrize("steps", [3, 4, 5])
def test_mtp_steps_under_concurrency_equal_no_speculation_upstream_splitkv(setup, steps):
    check_steps(setup, steps)


def check_steps(setup, steps):
    target, draft, env, prompts, want = setup
    with environ(env):
        eng = start_engine(target, **TRITON_ENGINE, **mtp_kwargs(draft, steps))
    try:
        outs = eng.generate(
            input_ids=prompts,
            sampling_params=[{"max_new_tokens": n, "temperature": 0.0} for n in NEW_TOKENS],
        )
    finally:
        eng.shutdown()
    got = [o["output_ids"] for o in outs]
    for i, (g, w) in enumerate(zip(got, want)):
        first = next((k for k, (a, b) in enumerate(zip(g, w)) if a != b), None)
        assert g == w, (f"{steps} steps: request {i} ({len(prompts[i])} prompt tokens) "
                        f"differs from token {first}: {g} against {w}")
    # every acceptance length ran, none to the whole chain: the histogram counts the
    # rounds that accepted k drafts, summed over the requests
    accepted = [0] * (steps + 1)
    for o in outs:
        for k, n in enumerate(o["meta_info"]["spec_correct_drafts_histogram"]):
            accepted[k] += n
    assert all(accepted), accepted
