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
"""Reject malformed generate requests before they reach the scheduler.

The scheduler runs every request of a batch in one forward. A value that only
one request got wrong fails that forward for all of them, and the scheduler
exits: a token id outside ``[0, vocab_size)`` indexes the embedding out of
range, ``top_logprobs_num`` above the vocabulary asks ``torch.topk`` for more
rows than there are. So the tokenizer manager checks what a client sent, and
answers 400 naming the field, the value and the valid range
(``validate_generate_request``); the scheduler checks the token ids once more
for requests that reach it by another way (``check_tokenized_request``).

The checks look at what the client sent, before ``normalize_batch_and_arguments``
expands batches and ``n``, so a batch's messages carry the item's index.

A request also may not reserve more than the server allows one request
(``RequestLimits``, from server arguments): each of its sequences is a request
of its own to the scheduler and the detokenizer, so a small body with a large
``n`` (or a top-logprob count near the vocabulary) would keep every other
client waiting behind it.
"""

from __future__ import annotations

import math
import numbers
from array import array
from dataclasses import dataclass
from typing import Any, Iterator, Optional, Sequence, Tuple

# SamplingParams fields that must be numbers / integers when set (None means
# "use the default" for each of them).
_REAL_SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
)
_INT_SAMPLING_FIELDS = (
    "max_new_tokens",
    "min_new_tokens",
    "top_k",
    "n",
    "stream_interval",
    "sampling_seed",
)
# SamplingParams fields set by normalize(), not by callers.
_INTERNAL_SAMPLING_FIELDS = frozenset(
    (
        "stop_strs",
        "stop_regex_strs",
        "stop_str_max_len",
        "stop_regex_max_len",
        "is_normalized",
    )
)
# The sampler turns a seed into a torch generator's int64 state.
_SEED_RANGE = (-(2**63), 2**63)


class RequestValidationError(ValueError):
    """A request the server will not run; the HTTP layer answers it with 400."""

    status_code = 400


@dataclass(frozen=True)
class RequestLimits:
    """What one request may reserve; None leaves a bound off."""

    # sampling_params.n
    max_parallel_samples: Optional[int] = None
    # batch items x n: the requests the scheduler gets for one request
    max_sequences_per_request: Optional[int] = None
    # top_logprobs_num: entries per position of every token returned
    max_top_logprobs_num: Optional[int] = None
    # a PD decode server: each request names its prefill server's bootstrap host
    needs_bootstrap_host: bool = False
    # why a seeded request that samples would not repeat its samples (speculative
    # decoding without seeded verify draws), None where it would
    seed_not_honoured: Optional[str] = None

    @classmethod
    def of(cls, server_args: Any) -> "RequestLimits":
        return cls(
            max_parallel_samples=getattr(server_args, "max_parallel_samples", None),
            max_sequences_per_request=getattr(
                server_args, "max_sequences_per_request", None
            ),
            max_top_logprobs_num=getattr(server_args, "max_top_logprobs_num", None),
            needs_bootstrap_host=getattr(server_args, "disaggregation_mode", None)
            == "decode",
            seed_not_honoured=_seed_not_honoured(server_args),
        )


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _is_real(x: Any) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def _seed_not_honoured(server_args: Any) -> Optional[str]:
    algorithm = getattr(server_args, "speculative_algorithm", None)
    if not algorithm:
        return None
    # Verify draws its acceptance coins from each row's seed under deterministic
    # inference only (eagle_utils._seeded_verify_coins), and the drafts repeat only
    # when they come from the request's own context: not from the shared n-gram
    # cache, nor from rejection sampling's unseeded draft draws.
    rejection = getattr(server_args, "speculative_use_rejection_sampling", False)
    if algorithm.upper() == "NGRAM" or rejection:
        flag = " --speculative-use-rejection-sampling" if rejection else ""
        return (
            f"this server runs speculative decoding (--speculative-algorithm "
            f"{algorithm}{flag}), whose drafts do not follow a request's seed. Drop "
            f"the seed, ask for greedy output (temperature 0), or serve without "
            f"--speculative-algorithm"
        )
    if not getattr(server_args, "enable_deterministic_inference", False):
        return (
            f"this server runs speculative decoding (--speculative-algorithm "
            f"{algorithm}), whose verify step samples from the batch's generator "
            f"unless --enable-deterministic-inference is on. Drop the seed, ask for "
            f"greedy output (temperature 0), or serve with "
            f"--enable-deterministic-inference"
        )
    return None


def _is_greedy(params: dict) -> bool:
    # SamplingParams treats a temperature below its epsilon as top-k 1
    temperature, top_k = params.get("temperature"), params.get("top_k")
    return (_is_real(temperature) and temperature < 1e-6) or top_k == 1


def _fail(msg: str) -> None:
    raise RequestValidationError(msg)


def _first_bad_token(ids: Sequence[Any], vocab_size: int) -> Optional[Tuple[int, Any]]:
    # bool is an int (True is token 1); array("q") takes it too.
    for i, t in enumerate(ids):
        if not isinstance(t, numbers.Integral) or not 0 <= t < vocab_size:
            return i, t
    return None


def check_token_ids(field: str, ids: Any, vocab_size: int) -> None:
    """Every entry of the flat sequence `ids` is an integer in [0, vocab_size)."""
    if not isinstance(ids, (list, tuple, array, range)):
        _fail(f"{field} must be a list of token ids, got {ids!r}.")
    # Fast path: array("q") takes integers only (C loop); min/max are C loops.
    try:
        arr = array("q", ids)
    except (TypeError, OverflowError, ValueError):
        arr = None
    if arr is not None and (not arr or (min(arr) >= 0 and max(arr) < vocab_size)):
        return
    bad = _first_bad_token(ids, vocab_size)
    if bad is None:  # array() refused something _is_int accepts: nothing wrong
        return
    i, t = bad
    if not isinstance(t, numbers.Integral):
        _fail(
            f"{field}[{i}] is {t!r} ({type(t).__name__}); token ids must be "
            f"integers in [0, {vocab_size})."
        )
    _fail(
        f"{field}[{i}] is {t}, outside the vocabulary: token ids must be in "
        f"[0, {vocab_size})."
    )


def _items(value: Any, is_batch: bool) -> Iterator[Tuple[str, Any]]:
    """(index suffix, value) per batch item for a field that may be a list."""
    if is_batch and isinstance(value, list):
        for i, v in enumerate(value):
            yield f"[{i}]", v
    else:
        yield "", value


def _check_sampling_params(
    field: str,
    params: Any,
    vocab_size: int,
    known: Optional[frozenset],
    limits: RequestLimits,
) -> None:
    if params is None:
        return
    if not isinstance(params, dict):
        _fail(f"{field} must be an object, got {type(params).__name__}.")
    if known is not None:
        unknown = sorted(str(k) for k in params if k not in known)
        if unknown:
            _fail(
                f"{field} has unknown keys {unknown}; the known ones are "
                f"{sorted(known)}."
            )
    for name in _REAL_SAMPLING_FIELDS:
        v = params.get(name)
        if v is not None and not _is_real(v):
            _fail(f"{field}.{name} must be a number, got {v!r}.")
    for name in _INT_SAMPLING_FIELDS:
        v = params.get(name)
        if v is not None and not _is_int(v):
            _fail(f"{field}.{name} must be an integer, got {v!r}.")
    n = params.get("n")
    if n is not None and n < 1:
        _fail(f"{field}.n must be at least 1, got {n}.")
    bound = limits.max_parallel_samples
    if n is not None and bound is not None and n > bound:
        _fail(
            f"{field}.n is {n}; a request may ask for at most {bound} parallel "
            f"samples (the server argument --max-parallel-samples raises it)."
        )
    stream_interval = params.get("stream_interval")
    if stream_interval is not None and stream_interval < 1:
        _fail(f"{field}.stream_interval must be at least 1, got {stream_interval}.")
    seed = params.get("sampling_seed")
    if seed is not None and not _SEED_RANGE[0] <= seed < _SEED_RANGE[1]:
        _fail(
            f"{field}.sampling_seed is {seed}, outside the 64-bit range "
            f"[-2**63, 2**63)."
        )
    if seed is not None and limits.seed_not_honoured and not _is_greedy(params):
        # Refused rather than answered with samples that change with what the
        # request is batched with (the seed would decide its first token only).
        _fail(f"{field}.sampling_seed is set, but {limits.seed_not_honoured}.")
    stop_token_ids = params.get("stop_token_ids")
    if stop_token_ids is not None:
        if isinstance(stop_token_ids, (str, bytes, dict)) or not isinstance(
            stop_token_ids, (list, tuple, set, frozenset)
        ):
            _fail(
                f"{field}.stop_token_ids must be a list of token ids, got "
                f"{stop_token_ids!r}."
            )
        check_token_ids(
            f"{field}.stop_token_ids",
            [t for t in stop_token_ids if t is not None],
            vocab_size,
        )
    logit_bias = params.get("logit_bias")
    if logit_bias is not None:
        if not isinstance(logit_bias, dict):
            _fail(
                f"{field}.logit_bias must be an object of token id -> bias, got "
                f"{type(logit_bias).__name__}."
            )
        for key, bias in logit_bias.items():
            try:
                token_id = int(key)
            except (TypeError, ValueError):
                _fail(
                    f"{field}.logit_bias has the key {key!r}; keys must be token "
                    f"ids in [0, {vocab_size})."
                )
            if not 0 <= token_id < vocab_size:
                _fail(
                    f"{field}.logit_bias has the key {key!r}, outside the "
                    f"vocabulary: keys must be token ids in [0, {vocab_size})."
                )
            if not _is_real(bias) or not math.isfinite(bias):
                _fail(
                    f"{field}.logit_bias[{key!r}] is {bias!r}; biases must be "
                    f"finite numbers."
                )


def _api_fields(sampling_params_class: Any) -> Optional[frozenset]:
    fields = getattr(sampling_params_class, "__struct_fields__", None)
    if fields is None:
        return None
    return frozenset(fields) - _INTERNAL_SAMPLING_FIELDS


def _num_items(obj: Any, is_batch: bool) -> int:
    if not is_batch:
        return 1
    for name in ("input_ids", "text", "input_embeds"):
        value = getattr(obj, name, None)
        if isinstance(value, list):
            return len(value)
    return 1


def _check_sequences(obj: Any, is_batch: bool, limits: RequestLimits) -> None:
    bound = limits.max_sequences_per_request
    if bound is None:
        return
    sampling_params = getattr(obj, "sampling_params", None)
    # normalize_batch_and_arguments takes every item's n from the first item
    if isinstance(sampling_params, list):
        sampling_params = sampling_params[0] if sampling_params else None
    n = sampling_params.get("n") if isinstance(sampling_params, dict) else None
    if not _is_int(n) or n < 1:  # its own check answers a bad n
        n = 1
    items = _num_items(obj, is_batch)
    if items * n > bound:
        _fail(
            f"The request asks for {items * n} sequences ({items} prompts x n={n}); "
            f"a request may ask for at most {bound} (the server argument "
            f"--max-sequences-per-request raises it)."
        )


def validate_generate_request(
    obj: Any,
    vocab_size: int,
    sampling_params_class: Any = None,
    limits: Optional[RequestLimits] = None,
) -> None:
    """Check a GenerateReqInput or EmbeddingReqInput as the client sent it.

    Raises RequestValidationError (a ValueError: 400) naming the field, the
    value and the valid range. Call it before normalize_batch_and_arguments.
    `sampling_params_class` (a msgspec Struct, SamplingParams by default) names
    the keys sampling_params may have: an unknown key would fail its
    constructor with a TypeError, a 500. `limits` (the server's, see
    RequestLimits.of) bounds what the request may reserve.
    """
    limits = limits or RequestLimits()
    input_ids = getattr(obj, "input_ids", None)
    is_batch = False
    if input_ids is not None and getattr(obj, "input_embeds", None) is None:
        if not isinstance(input_ids, (list, tuple, array)):
            _fail(
                f"input_ids must be a list of token ids, got {type(input_ids).__name__}."
            )
        if input_ids and isinstance(input_ids[0], (list, tuple)):
            is_batch = True
            for i, seq in enumerate(input_ids):
                if not isinstance(seq, (list, tuple)):
                    _fail(
                        f"input_ids[{i}] is {seq!r}; a batch of input_ids must be "
                        f"a list of lists of token ids."
                    )
                if not seq:
                    _fail(f"input_ids[{i}] is empty.")
                check_token_ids(f"input_ids[{i}]", seq, vocab_size)
        else:
            check_token_ids("input_ids", input_ids, vocab_size)
    else:
        text = getattr(obj, "text", None)
        is_batch = isinstance(text, list) or (
            input_ids is None
            and isinstance(getattr(obj, "input_embeds", None), list)
            and bool(obj.input_embeds)
            and isinstance(obj.input_embeds[0], list)
            and bool(obj.input_embeds[0])
            and isinstance(obj.input_embeds[0][0], list)
        )

    if limits.needs_bootstrap_host:
        # Without it the decode scheduler fails building the transfer's address.
        for suffix, host in _items(getattr(obj, "bootstrap_host", None), is_batch):
            if host is None:
                _fail(
                    f"bootstrap_host{suffix} is missing: a PD decode server "
                    f"(--disaggregation-mode decode) takes a request with its prefill "
                    f"server's bootstrap_host, bootstrap_port and bootstrap_room, as the "
                    f"router sends it; send the request through the router."
                )

    if not hasattr(obj, "top_logprobs_num"):  # EmbeddingReqInput
        _check_sequences(obj, is_batch, limits)
        return

    if sampling_params_class is None:
        from sglang.srt.sampling.sampling_params import SamplingParams

        sampling_params_class = SamplingParams
    known = _api_fields(sampling_params_class)
    sampling_params = obj.sampling_params
    if isinstance(sampling_params, list):
        for i, sp in enumerate(sampling_params):
            _check_sampling_params(
                f"sampling_params[{i}]", sp, vocab_size, known, limits
            )
    else:
        _check_sampling_params(
            "sampling_params", sampling_params, vocab_size, known, limits
        )
    _check_sequences(obj, is_batch, limits)

    for suffix, k in _items(obj.top_logprobs_num, is_batch):
        if k is None:
            continue
        if not _is_int(k):
            _fail(f"top_logprobs_num{suffix} must be an integer, got {k!r}.")
        if not 0 <= k <= vocab_size:
            _fail(
                f"top_logprobs_num{suffix} is {k}; it must be in [0, {vocab_size}] "
                f"(the vocabulary size)."
            )
        bound = limits.max_top_logprobs_num
        if bound is not None and k > bound:
            _fail(
                f"top_logprobs_num{suffix} is {k}; a request may ask for at most "
                f"{bound} top logprobs per token (the server argument "
                f"--max-top-logprobs-num raises it)."
            )
    for suffix, start in _items(obj.logprob_start_len, is_batch):
        if start is None:
            continue
        if not _is_int(start):
            _fail(f"logprob_start_len{suffix} must be an integer, got {start!r}.")
        if start < -1:
            _fail(
                f"logprob_start_len{suffix} is {start}; it must be -1 (output "
                f"tokens only) or a prompt position >= 0."
            )
    token_ids_logprob = obj.token_ids_logprob
    if token_ids_logprob:
        if isinstance(token_ids_logprob, list) and isinstance(
            token_ids_logprob[0], list
        ):
            for i, ids in enumerate(token_ids_logprob):
                if ids:
                    _check_token_ids_logprob(f"token_ids_logprob[{i}]", ids, vocab_size)
        elif isinstance(token_ids_logprob, list):
            _check_token_ids_logprob("token_ids_logprob", token_ids_logprob, vocab_size)


def _check_token_ids_logprob(field: str, ids: Any, vocab_size: int) -> None:
    check_token_ids(field, ids, vocab_size)
    # Each id is returned at every position; asking for one twice adds nothing
    if len(ids) > vocab_size:
        _fail(
            f"{field} has {len(ids)} token ids, more than the vocabulary's "
            f"{vocab_size}: list each id once."
        )


def check_tokenized_request(recv_req: Any, vocab_size: int) -> Optional[str]:
    """The scheduler's own check of a TokenizedGenerateReqInput.

    Returns an error message for a request whose prompt ids or logprob count
    would fail the forward of every request batched with it, else None. The
    tokenizer manager has already rejected these; this covers requests that
    reach the scheduler by another way (and tokenizers whose ids exceed the
    model's vocabulary). Multimodal prompts carry pad values in place of their
    items' tokens, and input_embeds prompts carry placeholder ids: both are
    left to their own paths.
    """
    input_ids = recv_req.input_ids
    if (
        input_ids is not None
        and getattr(recv_req, "mm_inputs", None) is None
        and getattr(recv_req, "input_embeds", None) is None
        and len(input_ids) > 0
    ):
        lo, hi = min(input_ids), max(input_ids)
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            return (
                f"input_ids holds the token id {bad}, outside the vocabulary: "
                f"token ids must be in [0, {vocab_size})."
            )
    k = getattr(recv_req, "top_logprobs_num", 0) or 0
    if getattr(recv_req, "return_logprob", False) and not 0 <= k <= vocab_size:
        return f"top_logprobs_num is {k}; it must be in [0, {vocab_size}]."
    return None
