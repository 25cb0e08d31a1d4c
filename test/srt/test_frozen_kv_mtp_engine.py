"""The triton backend and FROZEN_KV_MTP end to end on CPU (Triton's interpreter in the
scheduler, fp32, no CUDA graphs or overlap): greedy outputs equal HF's without speculation
(step triton-decode-sliding-window-width), with a seeded assistant, adaptive (3 -> 0 -> 3
steps), the split-KV chain verify, and YOCO under MTP. mtp_cpu_shim/ routes three stock
device gates to stock's Triton kernels.
"""
import contextlib
import json
import os
import sys

import pytest
from release import RELEASE

from cpu_engine import (
    TRITON_ENGINE, YOCO, HFReference, decisive_prompts, greedy_of, server_arg_names, start_engine)
from tiny_gemma import GEMMA4_TEXT_CONFIG, make_tiny_gemma4

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "benchmark", "yoco_gemma4"))
from checkpoints import mtp_kwargs, write_assistant_checkpoint  # noqa: E402

NEW_TOKENS = [4, 8, 12]  # per prompt: the batch shrinks 3 -> 2 -> 1


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("mtp")
    target = make_tiny_gemma4(str(root / "target"))
    draft = write_assistant_checkpoint(str(root / "draft"), dict(GEMMA4_TEXT_CONFIG))
    env = {
        "TRITON_INTERPRET": "1",
        "SGLANG_TEST_MTP_CPU_SHIM": "1",
        "SGLANG_DUMMY_WEIGHTS_AT_SCALE": "1",  # a seeded drafter, not +-1e-3
        "PYTHONPATH": os.pathsep.join([os.path.join(HERE, "mtp_cpu_shim"), os.environ.get("PYTHONPATH", "")]),
    }
    with environ(env):
        hf = HFReference(target)
        # prompts of 10-31 tokens: some start inside the window, some past it
        candidates = [[(7 * i + 3 * j) % 500 + 5 for j in range(10 + 3 * i)] for i in range(8)]
        kept = decisive_prompts(hf, candidates, max(NEW_TOKENS))
        prompts = [list(p) for p in list(kept)[: len(NEW_TOKENS)]]
        assert len(prompts) == len(NEW_TOKENS)
        want = [kept[tuple(p)][0][:n] for p, n in zip(prompts, NEW_TOKENS)]
        yield target, draft, prompts, want, root


@contextlib.contextmanager
def environ(env):
    """os.environ with ``env`` set (read by the engine's scheduler process), restored after."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        yield


@contextlib.contextmanager
def engine(setup, **overrides):
    """An engine on the tiny target; yields generate(return_logprob) -> (greedy tokens,
    verify-round counts) of the prompts sent as one batch."""
    target, _, prompts, _, _ = setup
    eng = start_engine(target, **{**TRITON_ENGINE, **overrides})

    def generate(return_logprob=True):
        outs = eng.generate(
            input_ids=prompts,
            sampling_params=[{"max_new_tokens": n, "temperature": 0.0} for n in NEW_TOKENS],
            return_logprob=return_logprob,
        )
        tokens = [greedy_of(o)[0] if return_logprob else o["output_ids"] for o in outs]
        return tokens, [o["meta_info"].get("spec_verify_ct") for o in outs]

    generate.engine = eng
    try:
        yield generate
    finally:
        eng.shutdown()


@contextlib.contextmanager
def mtp_engine(setup, **extra):
    """An FROZEN_KV_MTP engine (3 steps, the assistant drafter); yields
    generate(return_logprob) -> greedy tokens, having checked that every request took
    the speculative path (every round verified, at least one token each)."""
    _, draft, _, _, _ = setup
    # Stock's extend-kernel verify unless a test asks for the split-KV one (FROZEN_KV_MTP's
    # default from step split-kv-verify-default, whose resolution test_triton_split_kv_verify_args
    # covers): the tests that pass it cover the chain verify, and through the triton
    # interpreter a run with it takes about twice as long.
    if RELEASE >= (0, 5, 23):  # the switch is upstream's, read by the scheduler process
        on = extra.pop("triton_attention_split_kv_verify", False) is not False
        env = {"SGLANG_ENABLE_SPLITKV_VERIFY": "1" if on else "0",
               "SGLANG_TEST_CHAIN_VERIFY_ON_CPU": "1" if on else "0"}
        if on:  # it selects the chain mode silently but for one start-up line: log it
            extra.setdefault("log_level", "info")
    else:
        env = {}
        if "triton_attention_split_kv_verify" in server_arg_names():  # from step triton-split-kv-verify-arg
            extra.setdefault("triton_attention_split_kv_verify", False)
    with environ(env), engine(setup, **mtp_kwargs(draft, 3), **extra) as generate:
        def verified(return_logprob=True):
            tokens, verify = generate(return_logprob)
            assert all(v is not None and 0 < v <= n for v, n in zip(verify, NEW_TOKENS)), verify
            return tokens

        verified.engine = generate.engine
        yield verified


def mtp(setup, return_logprob=True, **extra):
    with mtp_engine(setup, **extra) as generate:
        return generate(return_logprob)


@pytest.mark.stack("generic-fixes")
def test_triton_decode_matches_hf(setup):
    with engine(setup) as generate:
        tokens, verify = generate()
    assert tokens == setup[3]
    assert verify in ([None] * 3, [0] * 3)


@pytest.mark.stack("generic-fixes")
def test_mtp_matches_hf(setup):
    with mtp_engine(setup) as generate:
        assert generate() == setup[3]
        # a sampled request's seed would decide its first token only (the verify draws
        # without it): refused with the reason (step per-request-sampling-seed); a seeded
        # greedy request is served
        prompt, sample = setup[2][0], {"max_new_tokens": 2, "sampling_seed": 5}
        with pytest.raises(ValueError, match=r"runs speculative decoding \(--speculative-algorithm"):
            generate.engine.generate(input_ids=prompt, sampling_params={**sample, "temperature": 1.0})
        out = generate.engine.generate(input_ids=prompt, sampling_params={**sample, "temperature": 0})
        assert out["output_ids"] == setup[3][0][:2]


@pytest.mark.stack("frozen-kv-mtp-speed")
def test_adaptive_mtp_matches_hf_switches_steps_and_takes_the_greedy_tail(setup, capfd, monkeypatch):
    """One adaptive engine, the prompts sent twice. With logprobs: HF's tokens, and the
    run switches 3 -> 0 -> 3 steps as the batch shrinks; the 0-step rounds keep the tree
    sampling (the tail needs no logprobs). Without logprobs (step
    one-node-greedy-verify-tail): HF's tokens again, and the 0-step rounds of the batches
    of 3 and 2 are answered by the one-node tail (the shim logs each round it answered)."""
    root = setup[4]
    cfg = root / "adaptive.json"
    cfg.write_text(json.dumps({"1": {"candidate_steps": [3]}, "2": {"candidate_steps": [0]}}))
    log = root / "tail.log"
    monkeypatch.setenv("SGLANG_TEST_ONE_NODE_TAIL_LOG", str(log))  # read by the scheduler process
    with mtp_engine(setup, speculative_adaptive=True, speculative_adaptive_config=str(cfg),
                    log_level="info") as generate:
        assert generate(return_logprob=True) == setup[3]
        err = capfd.readouterr().err
        assert "Switch adaptive runtime state: steps 3 -> 0" in err
        assert "Switch adaptive runtime state: steps 0 -> 3" in err
        assert not log.exists() or not log.read_text().split()
        assert generate(return_logprob=False) == setup[3]
    sizes = [int(x) for x in log.read_text().split()]
    assert {3, 2} <= set(sizes) and all(s in (2, 3) for s in sizes), sizes


@pytest.mark.stack("frozen-kv-mtp-speed")
def test_split_kv_verify_mtp_matches_hf(setup, monkeypatch, capfd):
    """One decode row per draft token (the grouped kernel's fallback)."""
    monkeypatch.setenv("SGLANG_CHAIN_VERIFY_GROUPED", "0")  # read by the scheduler process
    assert mtp(setup, triton_attention_split_kv_verify=True) == setup[3]
    if RELEASE >= (0, 5, 23):
        _assert_chain_selected(capfd, "one decode row per draft token")


def _assert_chain_selected(capfd, layout):
    """The start-up line that says which chain mode was selected."""
    assert f"split-KV verify: chain ({layout})" in capfd.readouterr().err


@pytest.mark.stack("yoco-mtp")
def test_yoco_under_mtp_matches_hf(setup):
    """Step mtp-target-prefill-captures-last: the target prefill takes the fast path (the
    pass counters say so) and the output is still HF's."""
    with mtp_engine(setup, **YOCO) as generate:
        assert generate() == setup[3]
        info = generate.engine.get_server_info()["internal_states"][0]
    passes = info["kv_sharing_fast_prefill_passes"]
    assert passes.get("fast", 0) > 0, f"YOCO never fired under MTP: {passes}"


@pytest.mark.stack("frozen-kv-mtp-speed")
def test_grouped_split_kv_verify_mtp_matches_hf(setup, monkeypatch, capfd):
    """Step chain-verify-as-decode: the grouped kernel (keys read once a request), the default;
    with the flag unset, as FROZEN_KV_MTP on triton takes it by default (step
    split-kv-verify-default, the stack's last)."""
    monkeypatch.delenv("SGLANG_CHAIN_VERIFY_GROUPED", raising=False)
    assert mtp(setup, triton_attention_split_kv_verify=None) == setup[3]
    if RELEASE >= (0, 5, 23):
        _assert_chain_selected(capfd, "grouped")


@pytest.mark.stack("generic-fixes")  # its step's own proof: test_frozen_kv_mtp_pd_seed.py
def test_mtp_on_both_servers_of_pd(setup, tmp_path):
    """FROZEN_KV_MTP on a PD pair: a prefill and a decode server, the KV moved by mooncake's
    engine stood in (pd_stand_in/: real copies between the two processes). The prefill
    server sends the target's last hidden state as the seed (its slot had the assistant's
    width: the first request failed); the decode server seeds the first draft round from it
    (it built an EAGLE input, which the frozen draft refuses). Each request, the three at
    once (joining a running batch), decodes HF's tokens, every round verified; so does each
    sent through SGLang's router in PD mode."""
    from concurrent.futures import ThreadPoolExecutor

    from pd_pair import PDPair, PDRouter

    target, draft, prompts, want, _ = setup
    args = ["--attention-backend", "triton", "--disable-overlap-schedule", "--max-running-requests", "8",
            "--triton-attention-num-kv-splits", "2"]
    for k, v in mtp_kwargs(draft, 3).items():
        args += [f"--{k.replace('_', '-')}", str(v)]
    env = {}
    if RELEASE >= (0, 5, 23):
        env["SGLANG_ENABLE_SPLITKV_VERIFY"] = "0"  # as mtp_engine: the faster verify here
    else:
        if "triton_attention_split_kv_verify" in server_arg_names():  # from step triton-split-kv-verify-arg
            args.append("--no-triton-attention-split-kv-verify")  # as mtp_engine: the faster verify here
    pair = PDPair(target, tmp_path, server_args=args, env=env)
    try:
        prefill, decode = pair.wait_ready().prefill, pair.decode

        def through_the_pair(i):
            return pair.generate(pair.body(i + 1, prompts[i], NEW_TOKENS[i], sampling={"ignore_eos": True}))

        with ThreadPoolExecutor(len(prompts)) as pool:
            outs = list(pool.map(through_the_pair, range(len(prompts))))
        for (p, d), toks, n in zip(outs, want, NEW_TOKENS):
            assert p.status_code == 200 and d.status_code == 200, p.text + d.text + decode.log_tail()
            assert p.json()["output_ids"] == toks[:1]
            out = d.json()
            assert out["output_ids"] == toks and 0 < out["meta_info"]["spec_verify_ct"] <= n, (out, toks)
        router = PDRouter(pair, tmp_path / "router.log").wait_ready()
        try:
            for prompt, toks, n in zip(prompts, want, NEW_TOKENS):
                r = router.post("/generate", {"input_ids": list(prompt), "sampling_params": {
                    "max_new_tokens": n, "temperature": 0.0, "ignore_eos": True}})
                assert r.status_code == 200, r.text + router.log_tail()
                assert r.json()["output_ids"] == toks and r.json()["meta_info"]["spec_verify_ct"] > 0, r.json()
        finally:
            router.stop()
        assert prefill.alive() and decode.alive()
    finally:
        pair.stop()
