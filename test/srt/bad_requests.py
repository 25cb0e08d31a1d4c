"""Requests a server must answer with 400 (and keep serving), for the tiny
Gemma-4 (vocabulary 512, context 4096) served with --skip-tokenizer-init.

Each entry: (name, path, body, a piece of the error message). STOCK_CRASHES
names those that took stock 0.5.17's whole server down (the scheduler raised
in its forward or output processing and sent SIGQUIT).
The table in .humanize/request-validation/README.md lists them all with what
stock answered.
"""

from release import RELEASE

VOCAB = 512


def gen(ids=(5, 6, 7), sp=None, **kw):
    body = {
        "input_ids": list(ids),
        "sampling_params": {"max_new_tokens": 2, "temperature": 0, **(sp or {})},
    }
    body.update(kw)
    return body


G = "/generate"
C = "/v1/completions"

# One request per route that needs the tokenizer (test_openai_without_tokenizer.py too).
NEEDS_TOKENIZER = [
    ("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/tokenize", {"model": "m", "prompt": "hi"}),
    ("/tokenize", {"model": "m", "prompt": "hi"}),
    ("/v1/rerank", {"query": "a", "documents": ["b"]}),
    ("/v1/responses", {"model": "m", "input": "hi"}),
    ("/v1/messages", {"model": "m", "max_tokens": 2,
                      "messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/messages/count_tokens", {"model": "m",
                                   "messages": [{"role": "user", "content": "hi"}]}),
    ("/api/chat", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
    ("/api/generate", {"model": "m", "prompt": "hi"}),
]

BAD_REQUESTS = [
    ("input_id_far_above_vocab", G, gen([5, 1000000000]),
     "input_ids[1] is 1000000000, outside the vocabulary"),
    ("input_id_at_vocab_size", G, gen([5, VOCAB]), "input_ids[1] is 512"),
    ("input_id_negative", G, gen([5, -4]), "input_ids[1] is -4"),
    ("batch_input_id_above_vocab", G, gen([[5, 6], [5, VOCAB]]), "input_ids[1][1] is 512"),
    ("top_logprobs_num_above_vocab", G,
     gen(return_logprob=True, top_logprobs_num=100000),
     "top_logprobs_num is 100000; it must be in [0, 512]"),
    ("top_logprobs_num_negative", G, gen(return_logprob=True, top_logprobs_num=-1),
     "top_logprobs_num is -1"),
    ("batch_top_logprobs_num_above_vocab", G,
     gen([[5], [6]], return_logprob=True, top_logprobs_num=[1, 600]),
     "top_logprobs_num[1] is 600"),
    ("input_id_float", G, gen([5, 6.5]), "non-int64"),
    ("input_id_string", G, gen([5, "a"]), "non-int64"),
    ("batch_item_empty", G, gen([[5], []]), "input_ids[1] is empty"),
    ("prompt_longer_than_context", G, gen(list(range(3, 400)) * 12),
     "longer than the model's context length"),
    ("token_ids_logprob_above_vocab", G,
     gen(return_logprob=True, token_ids_logprob=[5, 600]), "token_ids_logprob[1] is 600"),
    ("logprob_start_len_below_minus_one", G,
     gen(return_logprob=True, logprob_start_len=-5), "logprob_start_len is -5"),
    ("logprob_start_len_past_prompt", G,
     gen(return_logprob=True, logprob_start_len=50), "logprob_start_len"),
    ("stop_token_id_above_vocab", G, gen(sp={"stop_token_ids": [5, 100000]}),
     "sampling_params.stop_token_ids[1] is 100000"),
    ("stop_token_id_negative", G, gen(sp={"stop_token_ids": [-3]}),
     "sampling_params.stop_token_ids[0] is -3"),
    ("stop_token_id_string", G, gen(sp={"stop_token_ids": ["x"]}),
     "sampling_params.stop_token_ids[0] is 'x'"),
    ("logit_bias_key_above_vocab", G, gen(sp={"logit_bias": {"100000": 1.0}}),
     "logit_bias has the key '100000'"),
    ("logit_bias_key_negative", G, gen(sp={"logit_bias": {"-1": 1.0}}),
     "logit_bias has the key '-1'"),
    ("logit_bias_key_not_a_number", G, gen(sp={"logit_bias": {"abc": 1.0}}),
     "logit_bias has the key 'abc'"),
    ("logit_bias_value_string", G, gen(sp={"logit_bias": {"5": "x"}}),
     "biases must be finite numbers"),
    ("temperature_negative", G, gen(sp={"temperature": -1}), "temperature"),
    ("temperature_string", G, gen(sp={"temperature": "hot"}),
     "sampling_params.temperature must be a number"),
    ("top_p_zero", G, gen(sp={"top_p": 0}), "top_p must be in (0, 1]"),
    ("top_p_string", G, gen(sp={"top_p": "x"}), "sampling_params.top_p must be a number"),
    ("top_k_float", G, gen(sp={"top_k": 2.5, "temperature": 1.0}),
     "sampling_params.top_k must be an integer"),
    ("min_p_above_one", G, gen(sp={"min_p": 2}), "min_p must be in [0, 1]"),
    ("repetition_penalty_zero", G, gen(sp={"repetition_penalty": 0}), "repetition_penalty"),
    ("frequency_penalty_above_two", G, gen(sp={"frequency_penalty": 3}), "frequency_penalty"),
    ("max_new_tokens_negative", G, gen(sp={"max_new_tokens": -1}), "max_new_tokens"),
    ("max_new_tokens_float", G, gen(sp={"max_new_tokens": 2.5}),
     "sampling_params.max_new_tokens must be an integer"),
    ("max_new_tokens_string", G, gen(sp={"max_new_tokens": "2"}),
     "sampling_params.max_new_tokens must be an integer"),
    ("min_new_tokens_above_max", G, gen(sp={"min_new_tokens": 5}), "min_new_tokens"),
    ("n_zero", G, gen(sp={"n": 0}), "sampling_params.n must be at least 1"),
    ("n_float", G, gen(sp={"n": 1.5}), "sampling_params.n must be an integer"),
    ("stream_interval_zero", G, gen(sp={"stream_interval": 0}),
     "sampling_params.stream_interval must be at least 1"),
    ("sampling_seed_above_int64", G, gen(sp={"sampling_seed": 2**70, "temperature": 1.0}),
     "sampling_params.sampling_seed"),
    ("sampling_seed_float", G, gen(sp={"sampling_seed": 1.5, "temperature": 1.0}),
     "sampling_params.sampling_seed must be an integer"),
    ("two_grammars", G, gen(sp={"regex": "a", "ebnf": "root ::= 'a'"}),
     "Only one of json_schema, regex, ebnf"),
    ("hidden_states_not_enabled", G, gen(return_hidden_states=True), "hidden states"),
    ("custom_logit_processor_not_enabled", G, gen(custom_logit_processor="x"),
     "custom logit processor"),
    ("completions_echo_token_ids_without_tokenizer", C,
     {"model": "m", "prompt": [5, 6, 7], "max_tokens": 2, "echo": True, "logprobs": 1},
     "echo with a prompt of token ids needs the tokenizer"),
    ("completions_input_id_above_vocab", C,
     {"model": "m", "prompt": [5, 100000], "max_tokens": 2, "return_token_ids": True},
     "outside the vocabulary"),
    ("completions_logprobs_without_tokenizer", C,
     {"model": "m", "prompt": [5, 6], "max_tokens": 2, "logprobs": 1},
     "logprobs return each token's text, which needs the tokenizer"),
    ("sampling_params_unknown_key", G, gen(sp={"bogus": 1}),
     "sampling_params has unknown keys ['bogus']"),
    # What one request may reserve (server arguments --max-parallel-samples,
    # --max-sequences-per-request, --max-top-logprobs-num at their defaults)
    ("n_above_bound", G, gen(sp={"n": 100000, "max_new_tokens": 1}),
     "sampling_params.n is 100000; a request may ask for at most 128 parallel samples "
     "(the server argument --max-parallel-samples raises it)"),
    ("sequences_above_bound", G, gen([[5]] * 40, sp={"n": 128}),
     "The request asks for 5120 sequences (40 prompts x n=128); a request may ask for at "
     "most 4096 (the server argument --max-sequences-per-request raises it)"),
    ("top_logprobs_num_above_bound", G, gen(return_logprob=True, top_logprobs_num=21),
     "top_logprobs_num is 21; a request may ask for at most 20 top logprobs per token "
     "(the server argument --max-top-logprobs-num raises it)"),
    ("token_ids_logprob_longer_than_vocab", G,
     gen(return_logprob=True, token_ids_logprob=[5] * (VOCAB + 1)),
     "token_ids_logprob has 513 token ids, more than the vocabulary's 512"),
    ("completions_n_above_bound", C,
     {"model": "m", "prompt": [5, 6], "max_tokens": 1, "n": 129, "return_token_ids": True},
     "sampling_params.n is 129"),
    ("completions_logprobs_above_bound", C,
     {"model": "m", "prompt": [5, 6], "max_tokens": 1, "logprobs": 21,
      "return_token_ids": True},
     "logprobs return each token's text, which needs the tokenizer"),
    # Without a tokenizer (--skip-tokenizer-init)
    ("completions_token_ids_without_tokenizer", C,
     {"model": "m", "prompt": [5, 6, 7], "max_tokens": 2},
     "/v1/completions returns text, which needs the tokenizer"),
] + [
    (f"{path}_without_tokenizer", path, body, f"{path} needs the tokenizer")
    for path, body in NEEDS_TOKENIZER if path != "/tokenize"
]

# The ones that took stock's whole server down. (n_above_bound did not: it kept every
# other client waiting for minutes.)
STOCK_CRASHES = {
    "input_id_far_above_vocab",
    "input_id_at_vocab_size",
    "input_id_negative",
    "batch_input_id_above_vocab",
    "top_logprobs_num_above_vocab",
    "logprob_start_len_below_minus_one",
    "logit_bias_value_string",
    "max_new_tokens_float",
    "completions_input_id_above_vocab",
}


def accepted_messages(path, body, expect) -> tuple:
    """What the 400 may say: the fork's message, or on a /generate route whose body
    SGLang types before anything else runs (the request model's validation, then a
    schema gate, where the release has them), that check's type error for a string or
    float where a number of another kind goes. Range errors pass those checks and get
    the fork's message."""
    if RELEASE >= (0, 5, 23):
        if path == "/generate":
            from sglang.srt.entrypoints.api_contract import generate_contract_error

            gate = generate_contract_error(body)
            return (expect, "invalid type:", "validation error") + ((gate,) if gate else ())
    return (expect,)


def error_message(resp) -> str:
    """The error text of a 400 answer, whichever of the server's shapes it has."""
    try:
        body = resp.json()
    except ValueError:
        return resp.text
    err = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(err, dict):
        return str(err.get("message", err))
    return str(err)
