"""FROZEN_KV_MTP at 3, 4 and 5 draft steps under concurrency equals no speculation.

Deeper chains change every buffer sized by the draft-token count (the verify rows of a
request, the tree arrays, the accepted-token scatter and the KV slots freed after a
partial accept), and several requests in one batch lay those rows side by side, so an
index that mixes up the batch size and the draft-token count, or a row of one request
read for another, shows only at concurrency and beyond the 3 steps the other tests use
(upstream sgl-project/sglang#32666: 5 steps corrupt at concurrency >= 2, 3 do not).

One engine per step count (the step count is fixed at start-up) serves three greedy
requests at once: prompts of 9, 20 and 33 tokens (the first crosses the tiny model's
sliding window of 16 while it decodes, the others start past it, so windowed layers
read a translated window); 8, 9 and 11 new tokens, so the first request finishes
first and the others move up a row, and the batch shrinks 3 -> 2 -> 1. Each output must
equal, token by token, the greedy output of the target without speculation (Hugging
Face transformers' run of the same checkpoint, prompts whose continuation has no
near-tie, as in test_frozen_kv_mtp_engine; the engine without speculation equals it
there, test_triton_decode_matches_hf).

Drafts come from the oracle drafter of `mtp_cpu_shim/` (SGLANG_TEST_MTP_ORACLE_DRAFTS):
the tiny drafter's random weights are almost never accepted, and a verify that accepts
no draft never commits more than one token a round. The oracle proposes the reference
continuation, right for the first d tokens of a round and wrong after, d = (round +
offset) mod (steps + 2); the offsets (4, 6, 2) make the rounds run by at least two
requests at once accept every length from none to the whole chain at each step count
(also were the counts one round or one token off); the test checks they did. The verify
is FROZEN_KV_MTP's default on triton (the split-KV chain verify, step
split-kv-verify-default; on 0.5.23 SGLANG_ENABLE_SPLITKV_VERIFY's chain mode).

CI time: through Triton's interpreter a request's round costs about its layers x heads
x draft tokens, so the models are the smallest that keep each part of the path: a
target of 4 layers (sliding, full, and two KV-shared layers that read them), 2 query
heads on 1 KV head, and an assistant of 2 layers (one of each kind). 36 s on 2 cores
against 220 s for eight requests on the 8-layer tiny model, most of it the three engines'
start-up.
"""

import json
import os
import sys

import pytest

from cpu_engine import TRITON_ENGINE, HFReference, server_arg_names, start_engine
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
    if "triton_attention_split_kv_verify" not in server_arg_names():
        # 0.5.23: the chain verify is upstream's SGLANG_ENABLE_SPLITKV_VERIFY, selected on
        # CUDA only unless the shim lets this CPU pass
        env.update(SGLANG_ENABLE_SPLITKV_VERIFY="1", SGLANG_TEST_CHAIN_VERIFY_ON_CPU="1")
    yield target, draft, env, prompts, [w[:n] for w, n in zip(want, NEW_TOKENS)]


# The step that makes the chain verify FROZEN_KV_MTP's default on triton; on 0.5.23 the
# chain mode of upstream's split-KV verify (0.5.17's 06/0001, 0003 and 0010 in one step).
@pytest.mark.stack("frozen-kv-mtp-speed", step="split-kv-verify-default", bases=("0.5.17",))
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
