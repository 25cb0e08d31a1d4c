"""The repetition penalty's torch.compile happens at start-up: after the warm-up, the
first batches that use it (of one request and of several) compile nothing more, so the
scheduler's event loop does not stall on it."""
import pytest
import torch

pytestmark = pytest.mark.stack("generic-fixes", step="compile-repetition-penalty-at-startup",
                               fails_before=True)


def test_warm_up_leaves_nothing_to_compile_at_first_use():
    from torch._dynamo.utils import counters

    from sglang.srt.sampling.penaltylib.compiled_warmup import warm_compiled_penalties
    from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties

    torch._dynamo.reset()
    counters.clear()
    vocab = 512
    warm_compiled_penalties(vocab, "cpu")
    compiled = counters["stats"]["unique_graphs"]
    assert compiled >= 1
    gen = torch.Generator().manual_seed(0)
    for rows in (1, 3, 8):
        logits = torch.randn(rows, vocab, generator=gen)
        penalties = torch.rand(rows, vocab, generator=gen) + 0.5
        want = torch.where(logits < 0, logits * penalties, logits / penalties)
        apply_scaling_penalties(logits, penalties)
        torch.testing.assert_close(logits, want)
    assert counters["stats"]["unique_graphs"] == compiled, "compiled again at first use"
