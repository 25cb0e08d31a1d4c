"""FROZEN_KV_MTP under PD, at the two seams the decode and prefill servers meet (the real
pair is test_frozen_kv_mtp_engine.py::test_mtp_on_both_servers_of_pd): the decode server
seeds a request's first draft round with the first token and the target's hidden state,
and the PD metadata's hidden-state slot has the target's width, not the assistant's."""

from types import SimpleNamespace

import pytest
import torch
from release import RELEASE

pytestmark = pytest.mark.stack("generic-fixes", step="frozen-kv-mtp-pd-decode-seed", fails_before=True)


def test_decode_server_seeds_the_frozen_draft_from_the_prefill_servers_hidden_state(monkeypatch):
    from sglang.srt.speculative import spec_info
    from sglang.srt.speculative.frozen_kv_mtp_info import FrozenKVMTPDraftInput
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    hidden = [torch.randn(32), torch.randn(32)]
    batch = SimpleNamespace(reqs=[SimpleNamespace(hidden_states_tensor=h) for h in hidden],
                            device="cpu", enable_overlap=False, seq_lens=torch.tensor([5, 9]),
                            req_pool_indices=torch.tensor([0, 1]))
    first = torch.tensor([7, 11], dtype=torch.int32)
    algo = SpeculativeAlgorithm.FROZEN_KV_MTP
    kwargs = {"batch": batch, "last_tokens_tensor": first, "future_map": None}
    spec = SimpleNamespace(speculative_eagle_topk=1)
    if RELEASE >= (0, 5, 23):  # it reads the published settings
        monkeypatch.setattr(spec_info, "get_spec_config", lambda: spec)
    else:
        kwargs["server_args"] = spec
    seed = algo.build_disagg_draft_input(**kwargs)
    assert isinstance(seed, FrozenKVMTPDraftInput)
    assert seed.bonus_tokens.dtype == torch.int64 and seed.bonus_tokens.tolist() == [7, 11]
    assert torch.equal(seed.hidden_states, torch.stack(hidden))
    assert seed.topk_p.shape == seed.topk_index.shape == (2, 1)


def test_pd_hidden_state_slot_has_the_targets_width():
    from sglang.srt.speculative.eagle_utils import get_draft_recurrent_hidden_state_spec
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    # The assistant's own width (16) is not what it carries between rounds: the target's (64).
    config = SimpleNamespace(hf_config=SimpleNamespace(hidden_size=16, backbone_hidden_size=64),
                             spec_hidden_size=16, dtype=torch.bfloat16)
    runner = SimpleNamespace(spec_algorithm=SpeculativeAlgorithm.FROZEN_KV_MTP, model_config=config)
    assert get_draft_recurrent_hidden_state_spec(runner) == (64, torch.bfloat16)
