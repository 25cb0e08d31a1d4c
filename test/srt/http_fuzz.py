"""Hypothesis strategies for request bodies of a server of the tiny Gemma-4 (vocabulary
512, context 4096) started with --skip-tokenizer-init: /generate, /v1/completions,
/v1/chat/completions and bodies that are not JSON at all.

A body is valid, and in about half of the cases one of its fields (or a token id) is
replaced by a value a client may send by mistake: out of range, of another type, of a
size the server bounds. Valid values stay cheap to serve: at most 4 new tokens, n at
most 3, batches of at most 3 prompts.
"""

import re
from collections import Counter

from hypothesis import strategies as st

from bad_requests import VOCAB

G = "/generate"
C = "/v1/completions"
CHAT = "/v1/chat/completions"


def _field(valid, *invalid):
    """(a strategy for a valid value, values a client may send by mistake)."""
    return valid, invalid


valid_token = st.integers(0, VOCAB - 1)
BAD_TOKENS = (-1, VOCAB, 10**9, 2**63, 2**70, 6.5, "a", None)
small_text = st.text(st.characters(codec="utf-8"), max_size=6)
prompt_ids = st.lists(valid_token, min_size=1, max_size=6)
batch_ids = st.lists(st.lists(valid_token, min_size=1, max_size=4), min_size=1, max_size=3)
logit_bias = _field(
    st.dictionaries(st.integers(0, VOCAB - 1).map(str), st.floats(-5, 5), max_size=2),
    {"100000": 1.0}, {"-1": 1.0}, {"abc": 1.0}, {"5": "x"}, [5],
)

SAMPLING_FIELDS = {
    "max_new_tokens": _field(st.integers(0, 4), -1, 10**12, 2.5, "2"),
    "min_new_tokens": _field(st.integers(0, 1), -1, 5, "x"),
    "n": _field(st.integers(1, 3), 0, -2, 129, 100000, 1.5),
    "temperature": _field(st.floats(0, 2), -1, "hot"),
    "top_p": _field(st.floats(0.05, 1), 0, 1.5, "x"),
    "top_k": _field(st.integers(-1, 40), 10**6, 2.5),
    "min_p": _field(st.floats(0, 1), 2, -0.5),
    "frequency_penalty": _field(st.floats(-2, 2), 3, "x"),
    "presence_penalty": _field(st.floats(-2, 2), -3),
    "repetition_penalty": _field(st.floats(0.5, 2), 0, -1),
    "stop_token_ids": _field(st.lists(valid_token, max_size=3), "x", 5, [VOCAB], [-3]),
    "logit_bias": logit_bias,
    "ignore_eos": _field(st.booleans(), "yes"),
    "skip_special_tokens": _field(st.booleans()),
    "sampling_seed": _field(st.integers(-(2**63), 2**63 - 1), 2**70, 1.5),
    "stream_interval": _field(st.integers(1, 3), 0, -1),
    # A grammar needs the tokenizer: only ever sent as a mistake here
    "regex": _field(None, "[ab]+", "("),
    "json_schema": _field(None, '{"type": "string"}', "not json"),
    "ebnf": _field(None, 'root ::= "a"', "root ::="),
}
SAMPLING_UNKNOWN = ("bogus", "max_tokens", "stop_str_max_len")

GENERATE_FIELDS = {
    "return_logprob": _field(st.booleans(), "yes"),
    "top_logprobs_num": _field(st.integers(0, 5), -1, 21, 600, 1.5),
    "logprob_start_len": _field(st.integers(-1, 2), -5, 50, "x"),
    "token_ids_logprob": _field(st.lists(valid_token, max_size=3), [VOCAB], [5] * (VOCAB + 1)),
    "stream": _field(st.booleans()),
    "return_hidden_states": _field(st.just(False), True),
    "rid": _field(st.uuids().map(str), 5),
}

COMPLETIONS_FIELDS = {
    "max_tokens": _field(st.integers(0, 4), -1, 10**12, "2"),
    "n": _field(st.integers(1, 3), 0, 129),
    "logprobs": _field(st.none(), 1, 6, 21),
    "echo": _field(st.just(False), True),
    "temperature": _field(st.floats(0, 2), -1),
    "top_p": _field(st.floats(0.05, 1), 0),
    "seed": _field(st.integers(0, 2**31), -1, "x"),
    "stop": _field(st.none(), "a", ["a", "b"]),
    "stream": _field(st.booleans()),
    "logit_bias": logit_bias,
    "return_token_ids": _field(st.just(True), False),
}


@st.composite
def _valid_fields(draw, fields, max_size):
    names = sorted(k for k, (valid, _) in fields.items() if valid is not None)
    names = draw(st.lists(st.sampled_from(names), max_size=max_size, unique=True))
    return {k: draw(fields[k][0]) for k in names}


@st.composite
def _mutation(draw, fields):
    """(field, a value a client may send by mistake)"""
    name = draw(st.sampled_from(sorted(k for k, (_, bad) in fields.items() if bad)))
    return name, draw(st.sampled_from(fields[name][1]))


@st.composite
def generate_body(draw):
    """A valid body, and in half of the cases one field of it made invalid."""
    sp = {"max_new_tokens": 2, **draw(_valid_fields(SAMPLING_FIELDS, 4))}
    body = {"input_ids": draw(st.one_of(prompt_ids, prompt_ids, batch_ids)),
            "sampling_params": sp, **draw(_valid_fields(GENERATE_FIELDS, 3))}
    kind = draw(st.sampled_from(["valid"] * 6 + ["sampling"] * 2 + ["field"] * 2
                                + ["token", "other"]))
    if kind == "sampling":
        name, value = draw(_mutation(SAMPLING_FIELDS))
        sp[name] = value
    elif kind == "field":
        name, value = draw(_mutation(GENERATE_FIELDS))
        body[name] = value
        if name in ("top_logprobs_num", "logprob_start_len", "token_ids_logprob"):
            body["return_logprob"] = True
    elif kind == "token":
        ids = body["input_ids"]
        row = draw(st.sampled_from(ids)) if isinstance(ids[0], list) else ids
        row[draw(st.integers(0, len(row) - 1))] = draw(st.sampled_from(BAD_TOKENS))
    elif kind == "other":  # an unknown sampling key, no prompt, a text prompt
        choice = draw(st.sampled_from(["key", "prompt", "text"]))
        if choice == "key":
            sp[draw(st.sampled_from(SAMPLING_UNKNOWN))] = 1
        elif choice == "prompt":
            body["input_ids"] = draw(st.sampled_from([[], [[5], []], None]))
        else:
            body["text"] = draw(small_text)
            del body["input_ids"]
    return body


@st.composite
def completions_body(draw):
    """As generate_body, for /v1/completions."""
    body = {"model": "m", "prompt": draw(st.one_of(prompt_ids, prompt_ids, batch_ids)),
            "max_tokens": 2, "return_token_ids": True,
            **draw(_valid_fields(COMPLETIONS_FIELDS, 3))}
    kind = draw(st.sampled_from(["valid"] * 3 + ["field"] * 2 + ["prompt"]))
    if kind == "field":
        name, value = draw(_mutation(COMPLETIONS_FIELDS))
        body[name] = value
    elif kind == "prompt":
        body["prompt"] = draw(st.one_of(small_text, st.just([]),
                                        st.lists(st.sampled_from(BAD_TOKENS), min_size=1,
                                                 max_size=2)))
    return body


chat_body = st.fixed_dictionaries(
    {"model": st.just("m"),
     "messages": st.lists(st.fixed_dictionaries(
         {"role": st.sampled_from(["user", "system", "assistant", "bogus"]),
          "content": small_text}), max_size=2)},
    optional={"max_tokens": st.integers(-1, 4), "n": st.integers(0, 3),
              "stream": st.booleans(), "top_logprobs": st.integers(-1, 25),
              "logprobs": st.booleans()},
)

# Bodies that are not the JSON a route expects
raw_body = st.sampled_from([b"{", b"[]", b"null", b'{"input_ids": ', b"\xff\xfe", b'"x"',
                            b'{"input_ids": [5, NaN]}', b'{"input_ids": [5, 1e400]}'])

_ROUTES = {
    G: st.tuples(st.just(G), generate_body(), st.none()),
    C: st.tuples(st.just(C), completions_body(), st.none()),
    CHAT: st.tuples(st.just(CHAT), chat_body, st.none()),
    "raw": st.tuples(st.sampled_from([G, C, CHAT]), st.none(), raw_body),
}
# (path, body as JSON, or None with raw bytes): /generate 12 in 20, /v1/completions 6,
# chat (all 400 here) and raw bodies 1 each
http_request = st.sampled_from([G] * 12 + [C] * 6 + [CHAT, "raw"]).flatmap(_ROUTES.get)


def cause(status: int, message: str) -> str:
    """A 4xx answer's cause, for the counts: its message with numbers and quoted
    values folded, cut at the first clause."""
    msg = re.sub(r"'[^']*'", "'…'", message)
    msg = re.sub(r"-?\d+(\.\d+)?(e[+-]?\d+)?", "N", msg)
    msg = re.split(r"[;:,(]", msg, maxsplit=1)[0].strip()
    return f"{status} {msg[:70]}"


class Counts:
    def __init__(self):
        self.requests = 0
        self.status = Counter()
        self.causes = Counter()
        self.not_sent = 0

    def add(self, path: str, status: int, message: str = ""):
        self.requests += 1
        self.status[f"{status // 100}xx"] += 1
        if 400 <= status < 500:
            self.causes[f"{path} {cause(status, message)}"] += 1

    def summary(self) -> str:
        lines = [f"{self.requests} requests: "
                 + ", ".join(f"{k} {v}" for k, v in sorted(self.status.items()))
                 + (f" ({self.not_sent} drawn after the time bound, not sent)"
                    if self.not_sent else "")]
        lines += [f"  {n:4d}  {c}" for c, n in self.causes.most_common()]
        return "\n".join(lines)
