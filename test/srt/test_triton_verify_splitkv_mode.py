"""0.5.23: the chain verify is a mode of upstream's split-KV verify, selected once per
triton backend by `_select_verify_splitkv` under upstream's switch
SGLANG_ENABLE_SPLITKV_VERIFY (0.5.17 has a server flag instead:
test_triton_split_kv_verify_args.py).

Every refusal is a fallback to the extend kernel (upstream's contract), never an
error; gfx95 keeps upstream's kernel ("splitkv"); the unwired verify paths say why
at start-up, once."""

import logging
import types

import pytest

pytestmark = pytest.mark.stack("frozen-kv-mtp-speed", step="chain-verify-as-split-kv-verify-mode", bases=("0.5.23",))


@pytest.fixture
def select(monkeypatch):
    """`_select_verify_splitkv` on a CUDA machine (not gfx95), FROZEN_KV_MTP target
    runner, switch unset; `change` names what a case moves away from that."""
    from sglang.srt.layers.attention import triton_backend as tb

    monkeypatch.delenv("SGLANG_ENABLE_SPLITKV_VERIFY", raising=False)

    def run(topk=1, use_mla=False, skip_prefill=False, frozen=True, draft=False, cuda=True,
            gfx95=False, deterministic=False, dcp=1, translated=False):
        monkeypatch.setattr(tb, "_is_cuda", cuda)
        monkeypatch.setattr(tb, "is_gfx95_supported", lambda: gfx95)
        exec_ = types.SimpleNamespace(
            deterministic=types.SimpleNamespace(enable_deterministic_inference=deterministic))
        monkeypatch.setattr(tb, "get_exec", lambda: exec_)
        monkeypatch.setattr(tb, "get_parallel", lambda: types.SimpleNamespace(attn_dcp_size=dcp))
        runner = types.SimpleNamespace(
            spec_algorithm=types.SimpleNamespace(is_frozen_kv_mtp=lambda: frozen),
            is_draft_worker=draft,
            kv_index_translator=types.SimpleNamespace(reads_are_translated=translated),
        )
        return tb._select_verify_splitkv(runner, topk, use_mla, skip_prefill)

    return run


@pytest.mark.stack("frozen-kv-mtp-speed", step="chain-verify-as-split-kv-verify-mode", fails_before=True, bases=("0.5.23",))
def test_frozen_kv_mtp_on_cuda_verifies_as_a_chain(select):
    assert select() == "chain"


def test_the_switch_off_keeps_the_extend_kernel(select, monkeypatch):
    monkeypatch.setenv("SGLANG_ENABLE_SPLITKV_VERIFY", "0")
    assert select() is None
    assert select(gfx95=True) is None


def test_gfx95_keeps_upstreams_kernel(select):
    assert select(gfx95=True) == "splitkv"
    assert select(gfx95=True, frozen=False) == "splitkv"
    assert select(gfx95=True, topk=4) is None


@pytest.mark.parametrize(
    "change",
    [dict(topk=4), dict(topk=0), dict(frozen=False), dict(cuda=False), dict(skip_prefill=True),
     dict(draft=True), dict(deterministic=True), dict(dcp=2), dict(use_mla=True),
     dict(translated=True)],
)
def test_each_refusal_falls_back_to_the_extend_kernel(select, change, caplog):
    from sglang.srt.layers.attention import triton_backend as tb

    tb._verify_splitkv_logged.clear()
    # Engine tests earlier in the session may stop sglang's loggers propagating.
    caplog.set_level(logging.INFO, logger=tb.logger.name)
    tb.logger.addHandler(caplog.handler)
    try:
        assert select(**change) is None
        select(**change)  # said once
    finally:
        tb.logger.removeHandler(caplog.handler)
    # A FROZEN_KV_MTP target whose verify path is not wired says why; the rest
    # (no chain to verify, another algorithm or platform) stay quiet.
    unwired = {"deterministic", "dcp", "use_mla", "translated"} & set(change)
    # (a record reaches caplog's handler here and, where sglang's loggers
    # propagate, again at the root: count records, not deliveries)
    said = {id(r) for r in caplog.records if "split-KV verify: not with" in r.getMessage()}
    assert len(said) == (1 if unwired else 0), caplog.text
