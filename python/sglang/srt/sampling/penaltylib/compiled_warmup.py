"""Compile the torch.compile'd sampling penalty at start-up rather than at its first use.

`apply_scaling_penalties` (the repetition penalty) compiles on its first call, inside the
scheduler's event loop, and every other request waits for it (seconds; longer on a loaded
host). Calling it here once for a batch of one and once for several (dynamic shapes treat
a dimension of size 1 apart), on float32 logits as the sampler hands them, moves that
compile to start-up; what it computes is unchanged."""
import torch

from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties


def warm_compiled_penalties(vocab_size: int, device) -> None:
    for rows in (1, 2):
        logits = torch.zeros(rows, vocab_size, dtype=torch.float32, device=device)
        apply_scaling_penalties(logits, torch.ones_like(logits))
