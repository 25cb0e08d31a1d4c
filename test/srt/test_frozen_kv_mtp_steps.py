"""FROZEN_KV_MTP at 4, 5 and 7 draft steps under concurrency equals no speculation.

An index mixing up batch size and draft-token count shows only at concurrency and beyond
3 steps (upstream sgl-project/sglang#32666). One engine per step count serves three
greedy requests at once (batch 3 -> 2 -> 1), each equal to HF's. Drafts come from
mtp_cpu_shim/'s oracle drafter, right for the first d tokens of a round so that every
acceptance length runs (checked). Every decode round runs under mtp_cpu_shim/'s host
sync probe: none reads a value back from the device (see test_frozen_kv_mtp_host_sync.py),
with the lengths' host mirror or, every other round, without it (a GPU's default path).
Smallest models keeping each kind of layer (CI time).
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
# per step count: enough that the three requests' rounds together accept every length
NEW_TOKENS = {4: [8, 9, 11], 5: [8, 9, 11], 7: [18, 26, 12]}
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
    longest = [max(n) for n in zip(*NEW_TOKENS.values())]
    for length, n in zip(PROMPT_LENGTHS, longest):
        # the first prompt of this length whose greedy continuation has no near-tie
        for seed in range(16):
            prompt = [(7 * length + 3 * j + 11 * seed) % 500 + 5 for j in range(length)]
            tokens, _, margin = hf.greedy(prompt, n + 8)  # the oracle drafts past the end
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
    yield target, draft, env, prompts, want


# The stack's verify as served by default: 0.5.17's chain verify (its default since
# 06/0010), on 0.5.23 the chain mode of upstream's split-KV verify. On 0.5.17 a stack
# test: it runs in the suite, on the whole stack (each step has its own proof). 0.5.23's
# stack 06 is not whole yet (a base leaves out such a stack's stack tests), so there it
# is its step's test.
@pytest.mark.stack("frozen-kv-mtp-speed", bases=("0.5.17",))
@pytest.mark.parametrize("steps", sorted(NEW_TOKENS))
def test_mtp_steps_under_concurrency_equal_no_speculation(setup, steps, tmp_path):
    check_steps(setup, steps, tmp_path)


@pytest.mark.stack("frozen-kv-mtp-speed", step="frozen-kv-mtp-draft-host-length-sum",
                   bases=("0.5.23",))
@pytest.mark.parametrize("steps", sorted(NEW_TOKENS))
def test_mtp_steps_under_concurrency_equal_no_speculation_upstream_splitkv(setup, steps, tmp_path):
    check_steps(setup, steps, tmp_path)


def check_steps(setup, steps, tmp_path):
    target, draft, env, prompts, reference = setup
    new_tokens = NEW_TOKENS[steps]
    want = [w[:n] for w, n in zip(reference, new_tokens)]
    syncs = tmp_path / "host_syncs.log"
    with environ({**env, "SGLANG_TEST_MTP_HOST_SYNC_LOG": str(syncs)}):
        eng = start_engine(target, **TRITON_ENGINE, **mtp_kwargs(draft, steps))
    try:
        outs = eng.generate(
            input_ids=prompts,
            sampling_params=[{"max_new_tokens": n, "temperature": 0.0} for n in new_tokens],
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
    # no round blocks the host on the device (mtp_cpu_shim/host_sync_probe.py): the
    # host prepares and launches the next round while the device runs this one
    # (every other round without the lengths' host mirror, as on a GPU's default path)
    log = syncs.read_text().splitlines()
    assert {"round", "round without mirror"} <= set(log), "the probe saw no decode round of each kind"
    reads = sorted({r for r in log if not r.startswith("round")})
    assert not reads, reads


@pytest.mark.stack("frozen-kv-mtp-speed", step="frozen-kv-mtp-draft-host-length-sum")
@pytest.mark.parametrize("steps", sorted(NEW_TOKENS))
def test_verify_mask_holds_each_request_s_rows(steps, monkeypatch):
    """The verify mask at steps + 1 draft tokens D: a request of L keys has D rows of
    L + D cells, and the sizes that hold the mask count each once. The lengths exclude
    the draft tokens, which the verify adds itself: the term sgl-project/sglang#32691
    drops (its premise, a double count, is wrong: with it these sizes come short)."""
    import torch
    from sglang.srt.layers.attention.verify_mask import tree_mask_numel
    from sglang.srt.speculative import eagle_info
    from sglang.srt.speculative.eagle_utils import TreeMaskMode

    d, lens, max_ctx = steps + 1, [3, 40, 90], 128
    cells = sum(d * (n + d) for n in lens)
    # the buffer CUDA graphs verify into: every request at the longest context fits
    assert tree_mask_numel(TreeMaskMode.FULL_MASK, len(lens), d, max_ctx) == len(lens) * d * (max_ctx + d)
    # the mask a backend without such a buffer pads to (flashinfer's verify arguments)
    spec = eagle_info.EagleVerifyInput.__new__(eagle_info.EagleVerifyInput)
    spec.draft_token_num, spec.custom_mask = d, torch.ones(0, dtype=torch.bool)
    rows, seq_lens = torch.arange(len(lens)), torch.tensor(lens)
    if RELEASE >= (0, 5, 23):
        translator = type("Translator", (), {"pack_read_stream": lambda self, *a, **k: None})()
        spec.generate_attn_arg_prefill(req_pool_indices=rows, paged_kernel_lens=seq_lens,
                                       paged_kernel_lens_sum=sum(lens), translator=translator,
                                       plan=None)
    else:
        class NoLaunch:  # the index fill is not what is checked here
            def __getitem__(self, grid):
                return lambda *args, **kwargs: None
        monkeypatch.setattr(eagle_info, "create_flashinfer_kv_indices_triton", NoLaunch())
        spec.generate_attn_arg_prefill(rows, seq_lens, sum(lens), torch.zeros(3, max_ctx, dtype=torch.int32))
    assert spec.custom_mask.numel() == cells
