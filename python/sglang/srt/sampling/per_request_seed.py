# Copyright 2023-2024 SGLang Team
# Licensed under the Apache License, Version 2.0 (the "License");
# you may not use this file except in compliance with the License.
# You may obtain a copy of the License at
#
#     http://www.apache.org/licenses/LICENSE-2.0
#
# Unless required by applicable law or agreed to in writing, software
# distributed under the License is distributed on an "AS IS" BASIS,
# WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
# See the License for the specific language governing permissions and
# limitations under the License.
# ==============================================================================
"""Sample a request that names a seed (``sampling_seed``, OpenAI's ``seed``) from
that seed alone.

The sampling kernels draw from one generator for the whole batch, so what a
request samples depends on the requests it was batched with. A seeded request's
row is instead sampled by the Gumbel-max trick with noise that is a hash of
(seed, position, token id): the position of the token the row is sampled after
(``seq_len - 1``), so each output token gets fresh noise, and nothing else of
the batch. Its tokens then depend only on its own probabilities, with or
without deterministic inference, on every sampling backend. The hash is the
MurmurHash3 of ``multinomial_with_seed`` (the Triton kernel on CUDA, the same
function in torch elsewhere).

Unseeded rows are sampled as before, by the backend's kernel over the whole
batch: seeded rows are sampled again here and overwrite its choice.

``n`` parallel samples of one seeded request would all carry the same seed and
sample the same tokens; the i-th sample takes ``parallel_sample_seed(seed, i)``
(the first keeps the seed, so ``n = 1`` and the first of ``n`` agree).
"""

from __future__ import annotations

import copy
from typing import Any, List, Optional, Sequence

import torch

from sglang.srt.sampling.sampling_params import TOP_K_ALL

_U32 = 0xFFFFFFFF
_U64 = (1 << 64) - 1


def parallel_sample_seed(seed: int, index: int) -> int:
    """The seed of the index-th of n parallel samples: the seed itself for the
    first, else a SplitMix64 mix of (seed, index), as a signed 64-bit integer."""
    if index == 0:
        return seed
    z = (seed + index * 0x9E3779B97F4A7C15) & _U64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _U64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _U64
    z ^= z >> 31
    return z - (1 << 64) if z >= 1 << 63 else z


def seed_parallel_sample(sampling_params: Any, index: int) -> Any:
    """The sampling params of the index-th parallel sample: a copy with its own
    seed when the request has one, else the same object."""
    seed = getattr(sampling_params, "sampling_seed", None)
    if seed is None or index == 0:
        return sampling_params
    params = copy.copy(sampling_params)
    params.sampling_seed = parallel_sample_seed(seed, index)
    return params


def _needs_filter(sampling_params: Any) -> bool:
    return (
        sampling_params.top_k != TOP_K_ALL
        or sampling_params.top_p != 1.0
        or sampling_params.min_p > 0
    )


class RequestSeeds:
    """The seeded rows of a batch. Immutable: filter and merge return new ones
    (an overlapped forward may still read the previous batch's)."""

    __slots__ = ("seeds", "filters", "rows", "row_seeds", "row_filters", "need_filter")

    def __init__(self, seeds: List[Optional[int]], filters: List[bool], device):
        self.seeds = seeds  # one per row, None where unseeded
        self.filters = filters  # per row: top-k, top-p or min-p set
        rows = [i for i, s in enumerate(seeds) if s is not None]
        self.rows = torch.tensor(rows, dtype=torch.int64).to(device, non_blocking=True)
        self.row_seeds = torch.tensor(
            [seeds[i] for i in rows], dtype=torch.int64
        ).to(device, non_blocking=True)
        self.row_filters = torch.tensor(
            [filters[i] for i in rows], dtype=torch.bool
        ).to(device, non_blocking=True)
        self.need_filter = any(filters[i] for i in rows)

    @classmethod
    def _of(cls, seeds, filters, device) -> Optional["RequestSeeds"]:
        if all(s is None for s in seeds):
            return None
        return cls(seeds, filters, device)

    @classmethod
    def of_reqs(cls, reqs: Sequence[Any], device) -> Optional["RequestSeeds"]:
        """None when no request of the batch has a seed."""
        seeds = [r.sampling_params.sampling_seed for r in reqs]
        if all(s is None for s in seeds):
            return None
        filters = [_needs_filter(r.sampling_params) for r in reqs]
        return cls(seeds, filters, device)

    def filter(self, keep_indices: Sequence[int]) -> Optional["RequestSeeds"]:
        return RequestSeeds._of(
            [self.seeds[i] for i in keep_indices],
            [self.filters[i] for i in keep_indices],
            self.rows.device,
        )

    @staticmethod
    def merge(
        a: Optional["RequestSeeds"],
        b: Optional["RequestSeeds"],
        len_a: int,
        len_b: int,
    ) -> Optional["RequestSeeds"]:
        if a is None and b is None:
            return None
        device = (a or b).rows.device
        seeds = (a.seeds if a else [None] * len_a) + (b.seeds if b else [None] * len_b)
        filters = (a.filters if a else [False] * len_a) + (
            b.filters if b else [False] * len_b
        )
        return RequestSeeds(seeds, filters, device)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32), in int64 without overflow."""
    lo = x * (c & 0xFFFF)
    hi = ((x * (c >> 16)) & 0xFFFF) << 16
    return (lo + hi) & _U32


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) | (x >> (32 - r))) & _U32


def _mix(h: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    k = _mul32(k, 0xCC9E2D51)
    k = _rotl32(k, 15)
    k = _mul32(k, 0x1B873593)
    h = _rotl32(h ^ k, 13)
    return (h * 5 + 0xE6546B64) & _U32


def _fmix(h: torch.Tensor) -> torch.Tensor:
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def murmur_hash32_torch(
    seeds: torch.Tensor, positions: torch.Tensor, num_cols: int
) -> torch.Tensor:
    """The hash of ``sglang.kernels.ops.sampling.murmur_hash.murmur_hash32`` for
    columns ``0..num_cols-1``, in torch ops (any device), as int64 in [0, 2**32)."""
    seeds = seeds.to(torch.int64).view(-1, 1)
    pos = positions.to(torch.int64).view(-1, 1) & _U32
    cols = torch.arange(num_cols, device=seeds.device, dtype=torch.int64).view(1, -1)
    h = _mix(torch.zeros_like(seeds), seeds & _U32)
    h = _mix(h, (seeds >> 32) & _U32)
    h = _mix(h, pos)
    h = _mix(h.expand(-1, num_cols), cols.expand(h.shape[0], -1))
    return _fmix(h ^ 16)


def _hash(seeds: torch.Tensor, positions: torch.Tensor, num_cols: int) -> torch.Tensor:
    if seeds.is_cuda:
        from sglang.kernels.ops.sampling.murmur_hash import murmur_hash32

        cols = torch.arange(num_cols, device=seeds.device, dtype=torch.int64)
        return murmur_hash32(
            seeds.to(torch.int64).contiguous(),
            positions.to(torch.int64).contiguous(),
            cols,
        )
    return murmur_hash32_torch(seeds, positions, num_cols)


def seeded_sample(
    probs: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    top_ks: Optional[torch.Tensor] = None,
    top_ps: Optional[torch.Tensor] = None,
    min_ps: Optional[torch.Tensor] = None,
    filtered: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """One token id per row of `probs` (temperature applied), drawn from the row's
    seed and position only. Top-k, top-p and min-p, where given, keep the tokens
    the pytorch sampling backend keeps (top-k and top-p on the same sorted
    probabilities, min-p relative to the largest), on the rows `filtered` marks
    (all where None): a row's sample does not depend on the other rows. The
    Gumbel-max argmax needs no renormalization of what they keep."""
    num_rows, vocab = probs.shape
    logw = probs.to(torch.float64).log()
    if top_ks is not None:
        probs_sort, probs_idx = probs.sort(dim=-1, descending=True)
        ranks = torch.arange(vocab, device=probs.device).view(1, -1)
        drop = ranks >= top_ks.view(-1, 1)
        drop |= (probs_sort.cumsum(dim=-1) - probs_sort) > top_ps.view(-1, 1)
        drop |= probs_sort < (probs_sort[:, :1] * min_ps.view(-1, 1))
        if filtered is not None:
            drop &= filtered.view(-1, 1)
        drop = torch.empty_like(drop).scatter_(1, probs_idx, drop)
        logw.masked_fill_(drop, float("-inf"))
    hashed = _hash(seeds, positions, vocab)
    # (h + 0.5) / 2**32 lies strictly inside (0, 1): the noise is finite, so a
    # token that a filter dropped (or of probability 0) is never picked.
    u = (hashed.to(torch.float64) + 0.5) * (1.0 / 4294967296.0)
    logw.sub_(u.log_().neg_().log_())
    return logw.argmax(dim=-1)


def sample_seeded_rows(
    batch_next_token_ids: torch.Tensor,
    probs: Optional[torch.Tensor],
    sampling_info: Any,
    positions: torch.Tensor,
    logits: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Overwrite the seeded rows of `batch_next_token_ids` (one per request) with
    their seeded samples, from `probs` or else the softmax of `logits` (both with
    temperature applied)."""
    seeds: Optional[RequestSeeds] = getattr(sampling_info, "request_seeds", None)
    if seeds is None or batch_next_token_ids.shape[0] == 0:
        return batch_next_token_ids
    rows = seeds.rows
    if probs is not None:
        probs = probs.index_select(0, rows)
    else:
        probs = torch.softmax(logits.index_select(0, rows), dim=-1)
    filters = ()
    if seeds.need_filter:
        filters = (
            sampling_info.top_ks.index_select(0, rows),
            sampling_info.top_ps.index_select(0, rows),
            sampling_info.min_ps.index_select(0, rows),
            seeds.row_filters,
        )
    tokens = seeded_sample(
        probs,
        seeds.row_seeds,
        positions.index_select(0, rows),
        *filters,
    )
    return batch_next_token_ids.index_copy(
        0, rows, tokens.to(batch_next_token_ids.dtype)
    )

