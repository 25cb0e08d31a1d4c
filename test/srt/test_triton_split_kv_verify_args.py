"""--triton-attention-split-kv-verify: parsing, validation, and which backends
build the decode-shaped verify (layers/attention/triton_chain_verify.py).

0.5.17 only: 0.5.23 has no such flag; its backend selects the chain verify as a
mode of upstream's split-KV verify (test_triton_verify_splitkv_mode.py)."""

import logging
import types

import pytest
from test_kv_sharing_fast_prefill_args import (  # noqa: F401
    model,
    reject,
    server_args,
    server_args_from_cli,
    with_fields,
)

pytestmark = pytest.mark.stack("frozen-kv-mtp-speed", step="triton-split-kv-verify-arg", bases=("0.5.17",))

FLAG = "--triton-attention-split-kv-verify"


def mtp(model, **overrides):
    kwargs = dict(
        kv_sharing_fast_prefill=False,
        attention_backend="triton",
        speculative_algorithm="NEXTN",
        speculative_draft_model_path=model("assistant"),
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
        triton_attention_split_kv_verify=True,
    )
    kwargs.update(overrides)
    return server_args(model("E4B"), **kwargs)


@pytest.mark.stack("frozen-kv-mtp-speed", step="triton-split-kv-verify-arg", fails_before=True, bases=("0.5.17",))
def test_default_off_and_cli(model):
    assert server_args(model("E4B"), kv_sharing_fast_prefill=False).triton_attention_split_kv_verify is False
    args = server_args_from_cli(
        ["--model-path", model("E4B"), "--device", "cpu", "--attention-backend", "triton",
         "--speculative-algorithm", "NEXTN", "--speculative-draft-model-path", model("assistant"),
         "--speculative-num-steps", "3", "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", FLAG]
    )
    assert args.triton_attention_split_kv_verify is True
    assert args.speculative_algorithm == "FROZEN_KV_MTP" and args.speculative_eagle_topk == 1


@pytest.mark.parametrize(
    "change, says",
    [(dict(speculative_algorithm=None, speculative_draft_model_path=None, speculative_num_steps=None,
           speculative_eagle_topk=None, speculative_num_draft_tokens=None), ["--speculative-algorithm"]),
     (dict(enable_deterministic_inference=True), ["--enable-deterministic-inference"]),
     (dict(attention_backend="torch_native"), ["'torch_native'", "--attention-backend triton"])],
    ids=["without_speculation", "deterministic", "other_backend"],
)
def test_rejected_where_it_cannot_apply(model, change, says):
    msg = reject(mtp, model, **change)
    assert FLAG in msg and all(s in msg for s in says), msg


def test_draft_tree_rejected(model):
    from sglang.srt.arg_groups.triton_split_kv_verify_hook import handle_triton_split_kv_verify

    msg = reject(handle_triton_split_kv_verify, with_fields(mtp(model), speculative_eagle_topk=4))
    assert "--speculative-eagle-topk 1" in msg and "got 4" in msg


# --------------------------------------------------------------- the default


@pytest.mark.stack("frozen-kv-mtp-speed", step="split-kv-verify-default", fails_before=True, bases=("0.5.17",))
def test_unset_is_on_for_frozen_kv_mtp_on_triton(model, caplog):
    with caplog.at_level(logging.INFO, logger="sglang.srt.arg_groups.triton_split_kv_verify_hook"):
        args = mtp(model, triton_attention_split_kv_verify=None)
    assert args.speculative_algorithm == "FROZEN_KV_MTP"
    assert args.triton_attention_split_kv_verify is True
    assert "Triton split-KV verify on (default for FROZEN_KV_MTP" in caplog.text
    assert "--no-triton-attention-split-kv-verify" in caplog.text


@pytest.mark.stack("frozen-kv-mtp-speed", step="split-kv-verify-default", bases=("0.5.17",))
@pytest.mark.parametrize(
    "change",
    [
        dict(enable_deterministic_inference=True),  # stock's batch-invariant verify
        dict(attention_backend="torch_native"),
        dict(triton_attention_split_kv_verify=False),  # the opt-out
    ],
)
def test_unset_stays_off_where_it_does_not_apply(model, change):
    kwargs = dict(triton_attention_split_kv_verify=None)
    kwargs.update(change)
    assert mtp(model, **kwargs).triton_attention_split_kv_verify is False


@pytest.mark.stack("frozen-kv-mtp-speed", step="split-kv-verify-default", bases=("0.5.17",))
def test_unset_off_without_speculation_and_the_cli_opt_out(model):
    assert server_args(model("E4B"), kv_sharing_fast_prefill=False).triton_attention_split_kv_verify is False
    argv = ["--model-path", model("E4B"), "--device", "cpu", "--attention-backend", "triton",
            "--speculative-algorithm", "NEXTN", "--speculative-draft-model-path", model("assistant"),
            "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "4"]
    assert server_args_from_cli(argv).triton_attention_split_kv_verify is True
    assert server_args_from_cli(argv + [f"--no-{FLAG[2:]}"]).triton_attention_split_kv_verify is False


@pytest.mark.parametrize(
    "change, on",
    [({}, True), ({"topk": 4}, False), ({"topk": 0}, False), ({"enable_deterministic": True}, False),
     ({"dcp_size": 2}, False), ({"_translate_kv_loc": abs}, False), ({"use_mla": True}, False),
     ({"skip_prefill": True}, False), ({"is_draft_runner": True}, False), ({"flag": False}, False)],
)
@pytest.mark.stack("frozen-kv-mtp-speed", step="chain-verify-as-decode", bases=("0.5.17",))
def test_backend_builds_chain_verify_only_where_wired(change, on, caplog):
    from sglang.srt.layers.attention import triton_chain_verify_release as triton_chain_verify
    from sglang.srt.layers.attention.triton_chain_verify_release import chain_verify_enabled

    # Engine tests earlier in the session may raise the root level or stop
    # sglang's loggers propagating: listen on the module's logger itself.
    caplog.set_level(logging.WARNING, logger=triton_chain_verify.logger.name)
    triton_chain_verify.logger.addHandler(caplog.handler)

    fields = dict(topk=1, enable_deterministic=False, dcp_size=1, _translate_kv_loc=None, use_mla=False,
                  skip_prefill=False, is_draft_runner=False)
    flag = change.pop("flag", True)
    fields.update(change)
    args = types.SimpleNamespace(triton_attention_split_kv_verify=flag)
    try:
        assert chain_verify_enabled(types.SimpleNamespace(**fields), args) is on
    finally:
        triton_chain_verify.logger.removeHandler(caplog.handler)
    # A target backend that cannot take it says so; drafts and the flag off stay quiet.
    unwired = {"enable_deterministic", "dcp_size", "_translate_kv_loc", "use_mla"} & set(change)
    assert ("is ignored with" in caplog.text) == bool(unwired)
